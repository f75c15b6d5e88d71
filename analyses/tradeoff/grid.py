"""The H x m grid (paper Figure 4 right): per cell, held-out accuracy and where locate_facts
finds the facts; the 99% frontier and the corners."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analyses import cli
from analyses.executors import ExecutorSettings, open_executor
from analyses.locate_facts import LocateSettings
from analyses.sweep import Cell, Cells, one, run_jobs
from analyses.tradeoff.common import Result, accuracy_column, train_and_locate, write_result
from analyses.tradeoff.figures import grid_figure
from models.config import ModelConfig, RunConfig, override


# ------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Grid:
    """The H x m grid: every number of heads with every MLP width."""

    heads: tuple[int, ...] = field(default=(1, 2, 4, 8, 16, 32), metadata={"help": "H values"})
    widths: tuple[int, ...] = field(default=(1, 8, 16, 32, 64, 128), metadata={"help": "m values"})

    def __post_init__(self):
        cli.at_least(self, heads=1, widths=1)

    def models(self, run: RunConfig) -> dict[tuple[int, int], ModelConfig]:
        """The model of each cell (H, m), each refused if it cannot be built."""
        models = {(h, m): override(run.model, {"n_heads": h, "d_mlp": m}) for h in self.heads for m in self.widths}
        for model in models.values():
            model.validate()
        return models


# ---------------------------------------------------------------------------- cells
def grid_rows(run: RunConfig, grid: Grid, locating: LocateSettings, cells: Cells, executor: ExecutorSettings,
              progress: bool = True, compute: bool = True) -> list[dict]:
    """One row per cell (H, m): accuracy and the shares of the storage labels (compute=False:
    the recorded cells only)."""
    jobs = [one(Cell(f"H{h}_m{m}", train_and_locate, (RunConfig(run.task, model, run.train), locating)))
            for (h, m), model in grid.models(run).items()]
    with open_executor(executor if compute else ExecutorSettings()) as running:
        rows = run_jobs(jobs, cells, running, desc="trade-off grid", total=len(jobs), progress=progress,
                        compute=compute)
    return [row for row in rows if row is not None]


# --------------------------------------------------------------------------- tables
def grid_tables(rows: list[dict], grid: Grid, run: RunConfig, computed: int) -> Result:
    """grid.csv, and the 99% frontier (smallest m reaching 99% at each H) and the corners."""
    table = pd.DataFrame(rows)
    score = accuracy_column(table)
    frontier = {int(h): (int(g.loc[g[score] >= 0.99, "width"].min()) if (g[score] >= 0.99).any() else None)
                for h, g in table.groupby("heads")}
    corners = {name: corner.iloc[0].to_dict()
               for name, h, m in (("attention_heavy", max(grid.heads), min(grid.widths)),
                                  ("mlp_heavy", min(grid.heads), max(grid.widths)))
               if len(corner := table[(table["heads"] == h) & (table["width"] == m)])}  # recorded ones
    summary = {"frontier_min_width_at_99": frontier, "frontier_accuracy": score, "corners": corners,
               "task": repr(run.task.build()), "cells": f"{len(table)} of {len(grid.heads) * len(grid.widths)}",
               "cells_computed": computed}
    return Result({"grid.csv": table}, summary)


# --------------------------------------------------------------------------- report
def write_grid(result: Result, run: RunConfig, out: Path) -> None:
    write_result(result, out)
    grid_figure(result.tables["grid.csv"], result.summary["frontier_min_width_at_99"], out / "grid.png", run)


def grid_text(result: Result, out: Path) -> str:
    table = result.tables["grid.csv"]
    columns = ["heads", "width", *dict.fromkeys(["accuracy", accuracy_column(table)]), "share_attention",
               "share_mlp", "share_both", "share_distributed", "share_not_stored"]
    return (table[columns].to_string(index=False, float_format="%.3f")
            + f"\nwrote {out}/ ({result.summary['cells_computed']} new cells)")
