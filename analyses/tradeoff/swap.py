"""The swap: one task and model trained three ways (both free, MLP removed, OV path frozen at
its random init); where do the facts go?"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.locate_facts import LocateSettings
from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import ExecutorSettings, open_executor
from analyses.tradeoff.common import Result, train_and_locate, write_result
from analyses.tradeoff.figures import stacked_shares
from models.cli import override
from models.recall.config import RunConfig
from probe.storage import LABELS

# ------------------------------------------------------------------------- settings
VARIANTS = {"both_free": ({}, {}), "attn_only": ({"attn_only": True}, {}),  # name -> (model, training) changes
            "freeze_ov": ({}, {"freeze_ov": True})}


# ---------------------------------------------------------------------------- cells
def swap_rows(run: RunConfig, locating: LocateSettings, cells: Cells, executor: ExecutorSettings,
              progress: bool = True) -> list[dict]:
    """One row per variant: accuracy and the shares of the storage labels."""
    jobs = [one(Cell(name, train_and_locate,
                     (RunConfig(run.task, override(run.model, model), override(run.train, training)), locating,
                      cells.checkpoint(name))))
            for name, (model, training) in VARIANTS.items()]
    with open_executor(executor) as running:
        found = run_jobs(jobs, cells, running, desc="swap experiments", total=len(jobs), progress=progress)
    return [{"variant": name, **row} for name, row in zip(VARIANTS, found)]


# --------------------------------------------------------------------------- tables
def swap_tables(rows: list[dict], run: RunConfig, computed: int) -> Result:
    table = pd.DataFrame(rows)
    return Result({"swap.csv": table}, {"variants": table.set_index("variant").to_dict("index"),
                                        "task": repr(run.task.build()), "cells_computed": computed})


# --------------------------------------------------------------------------- report
def write_swap(result: Result, out: Path) -> None:
    write_result(result, out)
    stacked_shares(result.tables["swap.csv"], out / "swap.png")


def swap_text(result: Result, out: Path) -> str:
    table = result.tables["swap.csv"]
    return (table[["variant", "accuracy"] + [f"share_{k}" for k in LABELS]].to_string(index=False, float_format="%.3f")
            + f"\nwrote {out}/")
