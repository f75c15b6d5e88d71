"""The shrink: on one trained model, prune MLP neurons and heads step by step and re-measure
which facts survive and which store they were in before."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analyses.locate_facts import LocateSettings
from analyses.sweeps import cli
from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import ExecutorSettings, open_executor
from analyses.tradeoff.common import Result, storage_row, write_result
from analyses.tradeoff.figures import shrink_figure
from models.bridge import build_bridge, resolve_device
from models.checkpoint import load_checkpoint
from models.recall.config import RunConfig
from models.recall.pruning import head_norms, neuron_norms, prune, prune_order
from models.recall.trainer import train
from models.section import one_layer
from probe import columns
from probe.storage import LABELS


# ------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Shrink:
    """The model pruned (a checkpoint, or the flags' model trained into OUT/model) and how finely."""

    ckpt: str | None = field(default=None, metadata={
        "help": "checkpoint to prune (default: train the flags' model into OUT/model)"})
    mlp_steps: int = field(default=8, metadata={"help": "pruning steps from 0 to all MLP neurons"})

    def __post_init__(self):
        cli.at_least(self, mlp_steps=1)


def trained_model(ckpt: str | None, out: Path, run: RunConfig, progress: bool = True):
    """(model section, weights, task): `ckpt`, or the run trained once and kept in out/model."""
    path = Path(ckpt) if ckpt else out / "model"
    if not ckpt and not (path / "config.json").is_file():
        train(run, progress=progress).save(path)
    checkpoint = load_checkpoint(path, kind="factual_recall")
    one_layer(checkpoint.section.n_layers, path, "tradeoff shrink")
    if checkpoint.section.attn_only:
        raise ValueError(f"{path}: an attention-only model has no MLP neurons to prune.")
    return checkpoint.section, checkpoint.weights, checkpoint.task


# ---------------------------------------------------------------------------- cells
def pruning_steps(n: int, steps: int) -> list[int]:
    """0 .. n units removed in at most `steps` + 1 even steps."""
    return sorted({round(i * n / steps) for i in range(steps + 1)})


def pruned_storage_row(section, weights, task, component: str, order: list, k: int, locating: LocateSettings,
                       device: str) -> dict:
    """locate_facts on the model with the first k units of `order` (MLP neurons or heads) removed
    (device resolved where it runs)."""
    removed = order[:k]
    pruned = prune(weights, neurons=removed if component == "mlp" else (),
                   heads=removed if component == "heads" else ())
    row = storage_row(build_bridge(section, pruned, resolve_device(device)), task, locating)
    facts = row.pop("_facts")
    return {"component": component, "removed": k, "removed_units": removed, "fraction": k / len(order), **row,
            "fact_accuracy": facts[columns.ACCURACY].round(4).tolist(), "fact_label": facts[columns.LABEL].tolist()}


def shrink_rows(trained: tuple, shrink: Shrink, run: RunConfig, locating: LocateSettings, cells: Cells,
                executor: ExecutorSettings, progress: bool = True) -> list[dict]:
    """One row per pruning step of the `trained` model (section, weights, task): every fact's
    accuracy and label with the first k MLP neurons (or heads) of the pruning order removed."""
    section, weights, task = trained
    orders = {"mlp": prune_order(neuron_norms(weights)), "heads": prune_order(head_norms(weights))}
    plan = [("mlp", k) for k in pruning_steps(section.d_mlp, shrink.mlp_steps)] + \
           [("heads", k) for k in pruning_steps(section.n_heads, section.n_heads)[1:]]
    jobs = [one(Cell(f"{c}_{k}", pruned_storage_row,
                     (section, weights, task, c, orders[c], k, locating, run.train.device))) for c, k in plan]
    with open_executor(executor) as running:
        return run_jobs(jobs, cells, running, desc="pruning steps", total=len(jobs), progress=progress)


# --------------------------------------------------------------------------- tables
def shrink_tables(rows: list[dict], task, computed: int) -> Result:
    """shrink_facts.csv (every fact at every step, with the store it was in before) and
    shrink.csv (the share of each store's facts still recalled at every step)."""
    before = next(r for r in rows if r["removed"] == 0)
    facts = task.all_facts()
    table = []
    for r in rows:
        for i, (acc, label) in enumerate(zip(r["fact_accuracy"], r["fact_label"])):
            table.append({"component": r["component"], "removed": r["removed"], "fraction": r["fraction"],
                          "subject": int(facts[0][i]), "relation": int(facts[1][i]),
                          "store_before": before["fact_label"][i], "accuracy": acc, "survives": acc >= 0.5,
                          "label": label})
    table = pd.DataFrame(table)
    curves = (table.groupby(["component", "removed", "fraction", "store_before"])["survives"].mean()
              .rename("surviving_share").reset_index())
    summary = {"store_before": {k: int(v) for k, v in pd.Series(before["fact_label"]).value_counts().items()},
               "steps": [{k: r[k] for k in ("component", "removed", "fraction", "located_accuracy",
                                             *[f"share_{lab}" for lab in LABELS])} for r in rows],
               "cells_computed": computed}
    return Result({"shrink_facts.csv": table, "shrink.csv": curves}, summary)


# --------------------------------------------------------------------------- report
def write_shrink(result: Result, out: Path) -> None:
    write_result(result, out)
    shrink_figure(result.tables["shrink.csv"], out / "shrink.png")


def shrink_text(result: Result, out: Path) -> str:
    curves = result.tables["shrink.csv"]
    return (curves.pivot_table(index=["component", "removed"], columns="store_before", values="surviving_share")
            .to_string(float_format="%.2f") + f"\nwrote {out}/")
