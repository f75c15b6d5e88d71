"""The flags every analysis shares, declared and validated here once: the checkpoint,
--out, --device, --seed, --step, --quiet, the sweep flags (--executor, --jobs,
--ray-address, --gpus-per-cell, --torch-threads), and each analysis' own settings, flags
generated from its frozen settings dataclass (whose __post_init__ refuses a bad value, naming its flag).

A bad value is refused in one line `error: ...` with exit code 2 before anything is loaded
or written: shared flags while the command line is parsed (models.cli.Parser), settings
when their dataclass is built (a ValueError, turned into that line by run_cli)."""
from __future__ import annotations

import argparse
from pathlib import Path

from analyses.sweeps.executors import ExecutorSettings
from models.bridge import resolve_device
from models.cli import Parser, add_config_flags, comma_list, given, list_items, parser, run_cli, seed, whole_number
from models.out_folder import claim, is_checkpoint

__all__ = ["Parser", "parser", "directory", "device", "seed", "step", "comma_list", "list_items", "run_cli",
           "add_checkpoint", "add_out", "out_dir", "add_device", "add_seed", "add_step", "add_quiet", "add_sweep",
           "add_keep_checkpoints",
           "executor", "add_settings", "settings", "flag", "require", "at_least"]

CHECKPOINT_HELP = "checkpoint directory (docs/checkpoint_format.md)"
DEVICE_HELP = "auto (CUDA when present) | cpu | cuda | cuda:N"
QUIET_HELP = "no progress bars"
STEP_HELP = ("read the snapshot of this training step instead of the final weights (default --out "
             "CKPT/analysis/step_N/NAME)")
SWEEP_OUT_HELP = "output directory (resumable: a re-run skips the cells recorded there)"


def checkpoint_parser(name: str, description: str, seed_of: str, *, step: bool = True,
                      with_snapshots: bool = False) -> Parser:
    """The parser of `python -m analyses.NAME CKPT`: the checkpoint, --out (default
    CKPT/analysis/NAME), --device, --seed (of `seed_of`), --quiet (every analysis takes it,
    with or without progress bars), and --step where it reads snapshots one at a time."""
    p = parser(f"python -m analyses.{name}", description)
    add_checkpoint(p, with_snapshots)
    add_out(p, f"CKPT/analysis/{name}")
    add_device(p)
    add_seed(p, seed_of)
    if step:
        add_step(p)
    add_quiet(p)
    return p


# ------------------------------------------------------------------ shared flags
def directory(text: str) -> Path:
    """--out: a directory that may not exist yet, but neither it nor a parent is a file, and
    it is not a checkpoint's own folder (models.out_folder.is_checkpoint: results go beside its weights,
    in CKPT/analysis/)."""
    path = Path(text)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise argparse.ArgumentTypeError(f"{p} exists and is not a directory")
            break
    if is_checkpoint(path):
        raise argparse.ArgumentTypeError(f"{path} is a checkpoint's own folder: results go to a folder of their own, "
                                         f"by default {path / 'analysis'}/NAME")
    return path


def device(text: str) -> str:
    """--device: auto, or a device this machine has (kept as text: cells resolve it where they run)."""
    try:
        resolve_device(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).rstrip(".")) from None
    return text


step = whole_number("step")  # --step: a training step


def add_checkpoint(p: argparse.ArgumentParser, with_snapshots: bool = False) -> None:
    p.add_argument("ckpt", help=CHECKPOINT_HELP.replace("directory", "directory with snapshots/") if with_snapshots
                   else CHECKPOINT_HELP)


def add_out(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """--out DIR: `default` names where it goes when left out; without one it is required
    (a sweep's record)."""
    if default is None:
        p.add_argument("--out", type=directory, required=True, help=SWEEP_OUT_HELP)
    else:
        p.add_argument("--out", type=directory, default=None, help=f"output directory (default {default})")


def out_dir(args: argparse.Namespace, default: str | Path) -> Path:
    """--out, or `default` (a path; 'CKPT/analysis/NAME' is under the checkpoint, and with
    --step N under CKPT/analysis/step_N/NAME: a snapshot's analysis never takes the place of
    the final weights'). A given --out is placed by models.out_folder.claim (not `.`, not in
    another checkpoint); what it holds, the command checks (analyses.recorded, Cells)."""
    if args.out is not None:
        return claim(args.out, lambda folder: None, ckpt=getattr(args, "ckpt", None))
    default = str(default)
    if not default.startswith("CKPT/"):
        return Path(default)
    step = getattr(args, "step", None)
    if step is not None:
        default = default.replace("CKPT/analysis/", f"CKPT/analysis/step_{step}/")
    return Path(args.ckpt) / default.removeprefix("CKPT/")


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device, default="auto", help=DEVICE_HELP)


def add_seed(p: argparse.ArgumentParser, of: str) -> None:
    p.add_argument("--seed", type=seed, default=0, help=f"seed of {of} (default 0)")


def add_step(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step", type=step, default=None, help=STEP_HELP)


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)


def add_sweep(p: argparse.ArgumentParser) -> None:
    """--executor, --jobs, --ray-address, --gpus-per-cell, --torch-threads: where a sweep's cells run."""
    add_config_flags(p, ExecutorSettings, "where the cells run", default_label="default")


def add_keep_checkpoints(p: argparse.ArgumentParser) -> None:
    """--keep-checkpoints: a sweep keeps each cell's trained model (analyses.sweeps.cells.Cells.checkpoint)."""
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each cell's trained model as a checkpoint in OUT/checkpoints/CELL/, which "
                        "locate_facts and visualize open (cells recorded by an earlier run are not retrained)")


def add_recorded_only(p: argparse.ArgumentParser) -> None:
    """--recorded-only: a sweep's tables from the cells already recorded in --out."""
    p.add_argument("--recorded-only", action="store_true",
                   help="write the tables and figures of the cells recorded so far in --out, computing none "
                        "(a sweep still running, or cut short); the other flags must be the sweep's own")


def executor(args: argparse.Namespace) -> ExecutorSettings:
    """The sweep flags as an ExecutorSettings (refused, ValueError, if this machine cannot run it)."""
    return ExecutorSettings(**given(args, ExecutorSettings))


# ------------------------------------------------------------------ settings
def add_settings(p: argparse.ArgumentParser, settings_cls, title: str, exclude: tuple[str, ...] = ()) -> None:
    """One flag per field of a frozen settings dataclass (help from its metadata), but the
    fields in `exclude` (shared flags, or flags declared by hand)."""
    add_config_flags(p, settings_cls, title, exclude=exclude, default_label="default")


def settings(args: argparse.Namespace, settings_cls, **values):
    """`settings_cls` from the flags given (and `values`); the rest keep their defaults."""
    return settings_cls(**{**given(args, settings_cls), **values})


def flag(name: str) -> str:
    """The flag of a settings field: patch_contexts -> --patch-contexts."""
    return "--" + name.replace("_", "-")


def require(settings_obj, name: str, ok: bool, rule: str) -> None:
    """Refuse `settings_obj.name` unless `ok`: ValueError '--name must be RULE, got VALUE.'"""
    if not ok:
        value = getattr(settings_obj, name)
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else repr(value)
        raise ValueError(f"{flag(name)} must be {rule}, got {shown}.")


def at_least(settings_obj, **minimums) -> None:
    """Refuse a field (each value of a tuple field) below its minimum; None is left alone."""
    for name, low in minimums.items():
        value = getattr(settings_obj, name)
        values = value if isinstance(value, tuple) else () if value is None else (value,)
        require(settings_obj, name, all(v >= low for v in values), f">= {low}")
