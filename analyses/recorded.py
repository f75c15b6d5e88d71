"""Results that belong to their checkpoint. An analysis of a checkpoint records where its
numbers came from (`source`: the checkpoint, the step, and the content hash of the weights
it read); results recorded in a folder are reused only when they were computed from these
very weights with the same settings (`recorded_results`), and an analysis writes only into
a folder that holds nothing but its own results of the same settings (`refuse_other_results`).

In the checkpoint's own analysis/ folder, results of earlier weights of the same checkpoint
(it was trained again) are stale: they are replaced, never reused."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from analyses.sweeps.cells import setting_changes
from models.checkpoint import weights_sha256
from models.out_folder import TEMPORARY, claim, shown

HASH = "weights_sha256"


def source(ckpt: str | Path, step: int | None = None) -> dict:
    """What an analysis records about the weights it read: the checkpoint as given, the
    snapshot step (None: the final weights) and their content hash."""
    return {"checkpoint": str(ckpt), "step": step, HASH: weights_sha256(ckpt, step)}


def read_summary(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); rerun with --fresh.") from None


def differences(folder: Path, wanted: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """How the results recorded in `folder` (its summary.json) differ from `wanted` (each
    key's value but those in `ignore`; a `settings` dict compared without its device): []
    when they do not. A hash is shown by its first 12 digits."""
    recorded = read_summary(folder / "summary.json")
    if isinstance(recorded.get("settings"), dict):
        recorded["settings"] = {k: v for k, v in recorded["settings"].items() if k != "device"}
    keys = [k for k in wanted if k not in ignore]
    return setting_changes({k: _short(k, recorded.get(k)) for k in keys},
                           {k: _short(k, wanted[k]) for k in keys})


def _short(key: str, value):
    return value[:12] + "..." if key.endswith("sha256") and isinstance(value, str) else value


def recorded_results(name: str, folders: list[Path], wanted: dict, fresh: bool, say) -> Path | None:
    """The first of `folders` whose summary.json records `wanted` (these weights, these
    settings), saying so; None, saying why, when none does or `fresh` is asked."""
    if fresh:
        return None
    for folder in dict.fromkeys(folders):
        if not (folder / "summary.json").is_file():
            continue
        differing = differences(folder, wanted)
        if not differing:
            say(f"{name}: reusing {folder} (the same weights and settings)")
            return folder
        say(f"{name}: not reusing {folder} ({'; '.join(differing)})")
    return None


def settings_folder(*settings) -> str:
    """The folder name of results of settings other than the defaults ('' for the defaults):
    each field that differs from its default as NAME-VALUE, e.g. contexts-4_seed-1, so that
    they never take the place of the default settings' results."""
    changed = []
    for chosen in settings:
        default = type(chosen)()
        for f in fields(chosen):
            value = getattr(chosen, f.name)
            if value != getattr(default, f.name):
                changed.append(f"{f.name.replace('_', '-')}-{value:g}" if isinstance(value, float)
                               else f"{f.name.replace('_', '-')}-{value}")
    return "_".join(changed)


def own_analysis(ckpt: str | Path, folder: Path) -> bool:
    """Whether `folder` lies in the checkpoint's own analysis/ folder."""
    return (Path(ckpt) / "analysis").resolve() in (folder.resolve(), *folder.resolve().parents)


# what each analysis of a checkpoint writes beside its summary.json, by which its results are known
RESULT_FILES = {"locate_facts": "facts.csv", "causal_tracing": "effects.csv", "hallucination": "metrics.csv",
                "induction_circuit": "circuit.html", "induction_location": "location.csv",
                "two_hop": "bridge_layers.csv", "edit_facts": "edits.csv",
                "hops": "compositions.csv"}


def holding(folder: Path) -> str | None:
    """What `folder` holds, for a refusal: a sweep, a checkpoint, an induction study's or an
    analysis' results (RESULT_FILES); None where none of these."""
    if (folder / "settings.json").is_file():
        return "a sweep (settings.json)"
    if (folder / "config.json").is_file():
        return "a checkpoint (config.json)"
    names = [name for name, file in RESULT_FILES.items() if (folder / file).is_file()]
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        summary = None
    if isinstance(summary, dict) and "studies" in summary:
        return "an induction study's results (summary.json)"
    return f"{names[0]} results" if len(names) == 1 else None


def refuse_other_results(name: str, into: Path, wanted: dict, ckpt: str | Path, by: str) -> None:
    """Refuse (ValueError, one line) to write `name` results into `into` unless
    models.out_folder.claim allows it (not `.`, not in another checkpoint) and it holds no
    files (subfolders aside) or `name` results of `wanted` (a user's other files beside them
    stay): refused where it holds a sweep, a checkpoint, another analysis' results, results of
    other settings or, outside the checkpoint's own analysis/ folder, of other weights, or files
    that are not `name` results. `by` names the writer in the message."""
    claim(into, lambda folder: _own_results(name, folder, wanted, ckpt, by), ckpt=ckpt)


def _own_results(name: str, into: Path, wanted: dict, ckpt: str | Path, by: str) -> None:
    files = sorted(p.name for p in into.iterdir() if p.is_file() and not TEMPORARY.match(p.name))
    if not files:
        return
    tail = f"which {by} does not write over; move them, or choose another --out."
    held = holding(into)
    if held is not None and held != f"{name} results":
        raise ValueError(f"{into} holds {held}, {tail}")
    if held is None:
        raise ValueError(f"{into} holds files that are not {name} results ({shown(files)}), {tail}")
    # in the checkpoint's own folder, results of its earlier weights (trained again) are stale: replaced
    stale = tuple(k for k in wanted if k.endswith("sha256")) if own_analysis(ckpt, into) else ()
    differing = differences(into, wanted, stale) if (into / "summary.json").is_file() else ["no summary.json"]
    if differing:
        raise ValueError(f"{into} holds other {name} results ({'; '.join(differing)}), {tail}")
