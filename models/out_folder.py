"""The one rule of every command that writes into a folder (--out), `claim`; the folder a
command writes a checkpoint into, and what --force may replace there (`prepare_out`).

`claim` refuses, in one line and before anything is written: `.`, `..`, `~`, the working
directory, a parent of it, the home folder; a path that is a file; a checkpoint's own folder
(but for a command writing a checkpoint); a folder inside a checkpoint, but in the checkpoint's
own analysis/ for an analysis of that checkpoint; a folder holding anything that is not the
command's own (what `holds` accepts: its earlier results of the same settings, a sweep's record).

A checkpoint folder holds the model's own files (MODEL_FILES: what write_checkpoint and
models.train put there) and may hold other things: the analyses' results (`analysis/`, by
default), a user's notes. --force replaces the model's files and nothing else:

- a folder that is not a checkpoint (no config.json of this format, no models.train run.json)
  and holds anything is refused (another program's config.json and model.safetensors too);
- in a checkpoint, the model's files are deleted one by one (never a folder wholesale: a
  user's file inside snapshots/ stays); `analysis/` is moved aside to
  `analysis.replaced-<UTC time>/` (its results are the replaced model's, recorded with its
  weights' hash: kept there, where the new model's analyses would replace them); every other
  file stays. One line says what was kept and moved.
"""
from __future__ import annotations

import fnmatch
import json
import re
import time
from pathlib import Path

from models.checkpoint import FORMAT

MODEL_FILES = ("config.json", "model.safetensors", "metrics.jsonl", "run.json")  # files at the top
MODEL_FOLDERS = {"snapshots": re.compile(r"^step_\d{8}\.safetensors$"),  # folder -> its files' names
                 "train_state": re.compile(r"^step_\d{8}\.(safetensors|json)$")}
TEMPORARY = re.compile(r"^\..+\.tmp$")  # checkpoint.atomic_write's temporary files
ANALYSIS = "analysis"  # where the analyses write a checkpoint's results (analyses/sweeps/cli.py: CKPT/analysis/NAME)
FORCE_HELP = ("replace the checkpoint at --out: its model's files only (a user's files stay, its analysis/ is moved "
              "aside); a folder that is not a checkpoint is refused")


def is_checkpoint(folder: Path) -> bool:
    """Whether `folder` is a checkpoint of this toolkit: a config.json of this format, or a
    run.json that models.train or models.induction.train started (an interrupted run)."""
    def read(name):
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None
    config, run = read("config.json"), read("run.json")
    started = run is not None and ("train" in run or {"task", "model", "training"} <= run.keys())  # either trainer's
    return (config is not None and config.get("format") == FORMAT) or started


def model_files(folder: Path) -> list[Path]:
    """The model's own files in `folder` (MODEL_FILES, their temporary files, the snapshots
    and training states), files only."""
    own = [p for p in folder.iterdir() if p.is_file() and (p.name in MODEL_FILES or TEMPORARY.match(p.name))]
    for name, pattern in MODEL_FOLDERS.items():
        if (folder / name).is_dir():
            own += [p for p in (folder / name).iterdir()
                    if p.is_file() and (pattern.match(p.name) or TEMPORARY.match(p.name))]
    return own


def others(folder: Path) -> list[str]:
    """What `folder` holds besides the model's own files (names relative to it, sorted)."""
    own = set(model_files(folder))
    top = [p.name + "/" * p.is_dir() for p in folder.iterdir() if p not in own and p.name not in MODEL_FOLDERS]
    inner = [f"{name}/{p.name}" for name in MODEL_FOLDERS if (folder / name).is_dir()
             for p in (folder / name).iterdir() if p not in own]
    return sorted(top + inner)


def claim(out: Path, holds=None, *, ckpt: Path | str | None = None, checkpoint: bool = False) -> Path:
    """`out`, if a command may write there (not created); else ValueError, one line, nothing
    written. `holds(out)` is called where `out` holds anything: it raises ValueError naming what
    is there unless it is the command's own (None: nothing is). `ckpt`: the checkpoint the command
    analyses (its analysis/ may hold `out`); `checkpoint`: the command writes a checkpoint."""
    out = Path(out)
    refuse_unsafe(out, "a checkpoint" if checkpoint else "results")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory.")
    if not checkpoint and is_checkpoint(out):
        raise ValueError(f"--out {out} is a checkpoint's own folder: results go to a folder of their own"
                         + (f", by default {Path(ckpt) / ANALYSIS}/NAME." if ckpt else "."))
    refuse_inside_checkpoint(out, ckpt)
    if out.is_dir() and any(out.iterdir()):
        (holds or only())(out)
    return out


def refuse_inside_checkpoint(out: Path, ckpt: Path | str | None = None) -> None:
    """Refuse (ValueError) an `out` inside a checkpoint's folder, but inside `ckpt`'s own
    analysis/ (an analysis of `ckpt` writes there): results there would pass for that
    checkpoint's own."""
    inside = next((p for p in Path(out).resolve().parents if is_checkpoint(p)), None)
    if inside is None or (ckpt is not None and (Path(ckpt) / ANALYSIS).resolve() in
                          (Path(out).resolve(), *Path(out).resolve().parents)):
        return
    if ckpt is not None and inside == Path(ckpt).resolve():
        raise ValueError(f"--out {out} is inside the checkpoint {ckpt} but not in its {ANALYSIS}/, where its "
                         f"results go; choose {Path(ckpt) / ANALYSIS}/NAME or a folder outside it.")
    if ckpt is not None:
        raise ValueError(f"--out {out} is inside another checkpoint ({inside}), whose results it would pass for; "
                         f"choose a folder outside it (default {Path(ckpt) / ANALYSIS}/NAME).")
    raise ValueError(f"--out {out} is inside a checkpoint ({inside}), whose results it would pass for; "
                     "choose a folder outside it.")


def only(*names: str):
    """A `holds` for `claim`: the folder may hold these names (the command's own files; a name
    may be a pattern, 'edits_margin*.csv') and atomic writes' temporary files, nothing else."""
    def holds(out: Path) -> None:
        other = sorted(p.name + "/" * p.is_dir() for p in out.iterdir()
                       if not any(fnmatch.fnmatchcase(p.name, n) for n in names) and not TEMPORARY.match(p.name))
        if other:
            raise ValueError(f"--out {out} holds files that are not this command's results ({shown(other)}), "
                             "which it does not write over; choose another --out.")
    return holds


def refuse_unsafe(out: Path, what: str = "a checkpoint") -> None:
    """Refuse (ValueError) an --out that is the working directory, a parent of it, or the
    home folder (`.`, `..`, `~`): `what` goes in a folder of its own."""
    where = out.expanduser().resolve()
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if where == cwd or where in cwd.parents or where == home or str(out).strip() in (".", "..", "~"):
        place = ("the working directory" if where == cwd else "the home folder" if where == home
                 else "a parent of the working directory")
        one = what == "a checkpoint"
        raise ValueError(f"--out {out} is {place}; {what} {'goes' if one else 'go'} in a folder of its own "
                         f"(e.g. --out {'ckpt' if one else 'results'}/NAME).")


def prepare_out(out: Path, force: bool, say=print) -> Path:
    """A folder to write a checkpoint into: `out`, created, when it is empty or new; a
    checkpoint's folder with its model's files removed when `force` (the rules above); else
    refused (ValueError), nothing touched (`claim`: also inside another checkpoint)."""
    claim(out, lambda folder: _replaceable(folder, force), checkpoint=True)
    if out.is_dir() and any(out.iterdir()):
        replace_model(out, say)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _replaceable(out: Path, force: bool) -> None:
    """Refuse a non-empty `out` without --force, and with it one that is not a checkpoint (whatever
    it holds: another program's config.json and model.safetensors are not this model's files)."""
    if not force:
        raise ValueError(f"--out {out} already holds files; pass --force to replace it, or choose another --out.")
    if not is_checkpoint(out):  # another program's config.json and model.safetensors among them
        held = sorted(p.name + "/" * p.is_dir() for p in out.iterdir())
        raise ValueError(f"--out {out} holds files that are not a checkpoint's ({shown(held)}); --force replaces a "
                         "checkpoint's files only: choose another --out.")


def replace_model(out: Path, say=print) -> None:
    """Delete the model's files in the checkpoint folder `out`, move its `analysis/` aside and
    keep everything else, saying so in one line (prepare_out has refused any folder that is not a
    checkpoint)."""
    kept = others(out)
    for path in model_files(out):
        path.unlink()
    for name in MODEL_FOLDERS:
        if (out / name).is_dir() and not any((out / name).iterdir()):
            (out / name).rmdir()
    notes = []
    if (out / ANALYSIS).is_dir():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        aside = next(p for i in range(1, 1000) if not (p := out / f"{ANALYSIS}.replaced-{stamp}{'-' * (i > 1)}"
                                                                    f"{i if i > 1 else ''}").exists())
        (out / ANALYSIS).rename(aside)
        notes.append(f"moved {ANALYSIS}/ (the replaced model's results) to {aside}/")
        kept = [k for k in kept if k != ANALYSIS + "/"]
    if kept:
        notes.append(f"kept {shown(kept)}")
    say(f"--force: replaced the model in {out}" + ("; " + "; ".join(notes) if notes else "") + ".")


def shown(names: list[str], most: int = 4) -> str:
    """Names for one line: the first `most`, then how many in all."""
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")
