"""What the trade-off sweeps share: the base run, the cell that trains and locates, settings.json
and the written result."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from analyses.locate_facts import LocateSettings, locate
from analyses.sweeps.cells import Cells
from analyses.sweeps.output import write_csv, write_summary
from models.bridge import build_bridge, resolve_device
from models.cli import given, override
from models.recall.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from models.recall.presets import preset
from models.recall.shape_trainer import train_shapes
from models.recall.trainer import best_so_far, train
from models.recall.weights import parameter_count
from models.training.result import TrainResult
from probe import columns
from probe.storage import StorageRule

BASE = "paper-tradeoff"


# ------------------------------------------------------------------------- settings
def base_run(args) -> RunConfig:
    """The paper-tradeoff preset with the task, model and training flags given (snapshots
    off; without --sampler, the sampler of the sweep recorded in --out, if any); refused
    (ValueError) if the model or the training cannot run."""
    base = preset(BASE)
    sampler = Cells.recorded_sampler(args.out, "run", "train") if getattr(args, "out", None) else None
    train = {"snapshots_per_octave": 0, **({"sampler": sampler} if sampler else {}), **given(args, TrainConfig)}
    run = RunConfig(task=override(base.task, given(args, TaskConfig)),
                    model=override(base.model, given(args, ModelConfig)),
                    train=override(base.train, train))
    run.train.validate()
    run.model.validate()
    return run


def sweep_settings(command: str, run: RunConfig, locating: LocateSettings, extra: dict,
                   per_cell: tuple[str, ...] = ()) -> dict:
    """settings.json of a trade-off sweep: what every cell shares (the model fields each cell
    sets itself, `per_cell`, left out: `extra` records them)."""
    model = {k: v for k, v in run.model.recorded().items() if k not in per_cell}
    recorded = {**asdict(run), "model": model}
    recorded["train"].pop("device")  # where and how it runs does not change what a cell holds
    recorded["train"].pop("cuda_graph")
    if run.train.sampler == "generator":  # the only sampler before the choice existed: those sweeps resume
        recorded["train"].pop("sampler")
    return {"analysis": f"tradeoff {command}", "run": recorded, "contexts": locating.contexts,
            "patch_contexts": locating.patch_contexts, "seed_locate": locating.seed,
            "rule": asdict(StorageRule()), **extra}  # cells labelled under another rule are not reused


# ---------------------------------------------------------------------------- cells
def storage_row(model, task, locating: LocateSettings) -> dict:
    """locate_facts on `model`: accuracy over contexts and the share of facts per label."""
    located = locate(model, task, **asdict(locating), progress=False)
    s = located.summary
    return {"located_accuracy": s.accuracy, **{f"share_{k}": v for k, v in s.label_shares.items()},
            "_facts": located.facts.reset_index()[[columns.SUBJECT, columns.RELATION, columns.ACCURACY, columns.LABEL]]}


def train_and_locate(run: RunConfig, locating: LocateSettings, keep: Path | None = None) -> dict:
    """Train `run` (its learning rates batched), keep the best, locate its facts; with
    `keep`, the trained model is saved there as a checkpoint."""
    return located_row(run, kept(train(run, progress=False), keep), locating)


def train_and_locate_stack(runs: tuple[RunConfig, ...], keys: tuple[str, ...], locating: LocateSettings,
                           keeps: tuple[Path | None, ...] | None = None, state: Path | None = None) -> dict:
    """Train `runs` (models differing only in H, d_h and m) as one zero-padded stack
    (models.recall.shape_trainer), resumable from `state` where given; each run's row as
    train_and_locate gives it, by its key (each model saved at its `keeps` path, where one
    is given)."""
    results = train_shapes(list(runs), progress=False, state_folder=state)
    keeps = keeps or (None,) * len(runs)
    return {key: located_row(run, kept(result, keep), locating)
            for key, run, result, keep in zip(keys, runs, results, keeps)}


def kept(result: TrainResult, keep: Path | None) -> TrainResult:
    """`result`, saved as a checkpoint at `keep` first when a path is given."""
    if keep is not None:
        result.save(keep)
    return result


def located_row(run: RunConfig, result: TrainResult, locating: LocateSettings) -> dict:
    """A trained run's row: its accuracy, parameter counts and where locate_facts finds its facts."""
    t = result.training
    model = build_bridge(result.section, result.weights, resolve_device(run.train.device))
    row = storage_row(model, result.task, locating)
    row.pop("_facts")
    counts = parameter_count(result.section)
    return {"heads": run.model.n_heads, "width": None if run.model.attn_only else run.model.d_mlp,
            "attn_only": run.model.attn_only, "freeze_ov": run.train.freeze_ov,
            "accuracy": t["final_accuracy"], "lr": t["lr"], "steps_run": t["steps_run"],
            "best_accuracy": best_so_far(result.metrics),  # the paper's measure
            "attention_parameters": counts["attention"], "mlp_parameters": counts["mlp"], **row}


# --------------------------------------------------------------------------- tables
@dataclass
class Result:
    """One trade-off experiment's results: its CSV tables by file name, and summary.json."""

    tables: dict[str, pd.DataFrame]
    summary: dict


def accuracy_column(table: pd.DataFrame) -> str:
    """The accuracy a grid's frontier is drawn on: the best over the run's evaluations (the
    paper's measure) where the cells record it, else the final one."""
    return "best_accuracy" if "best_accuracy" in table else "accuracy"


# --------------------------------------------------------------------------- report
def write_result(result: Result, out: Path) -> None:
    """Every table as CSV in `out`, and summary.json."""
    for name, table in result.tables.items():
        write_csv(out / name, table)
    write_summary(out / "summary.json", result.summary)
