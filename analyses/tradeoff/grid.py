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
from analyses.tradeoff.common import Result, accuracy_column, train_and_locate, train_and_locate_stack, write_result
from analyses.tradeoff.figures import grid_figure
from models.bridge import resolve_device
from models.config import ModelConfig, RunConfig, override

STACK_CHOICES = ("auto", "on", "off")


# ------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Grid:
    """The H x m grid: every number of heads with every MLP width."""

    heads: tuple[int, ...] = field(default=(1, 2, 4, 8, 16, 32), metadata={"help": "H values"})
    widths: tuple[int, ...] = field(default=(1, 8, 16, 32, 64, 128), metadata={"help": "m values"})
    stack: str = field(default="auto", metadata={
        "help": "on: train the cells of one H (every m) as one zero-padded stack, equal to each cell alone "
                "up to float rounding, so recorded with the sweep | off: each cell alone | "
                "auto: on where the training runs on CUDA"})

    def __post_init__(self):
        cli.at_least(self, heads=1, widths=1)
        if self.stack not in STACK_CHOICES:
            raise ValueError(f"--stack must be auto, on or off, got {self.stack!r}.")

    def stacked(self, run: RunConfig) -> bool:
        """Whether the cells train as stacks: `on`, or `auto` where the training runs on CUDA."""
        return self.stack == "on" or (self.stack == "auto" and resolve_device(run.train.device).type == "cuda")

    def recorded(self, run: RunConfig) -> dict:
        """What settings.json records of the grid (`stacked` only when on: grids recorded
        before stacks existed resume)."""
        stacked = {"stacked": True} if self.stacked(run) else {}
        return {"heads": list(self.heads), "widths": list(self.widths_of(run)), **stacked}

    def widths_of(self, run: RunConfig) -> tuple[int, ...]:
        """The m values the grid trains: --widths, or m = 0 alone when the model has no MLP."""
        return (0,) if run.model.attn_only else self.widths

    def models(self, run: RunConfig) -> dict[tuple[int, int], ModelConfig]:
        """The model of each cell (H, m), each refused if it cannot be built."""
        models = {(h, m): override(run.model, {"n_heads": h} if run.model.attn_only else {"n_heads": h, "d_mlp": m})
                  for h in self.heads for m in self.widths_of(run)}
        for model in models.values():
            model.validate()
        return models


# ---------------------------------------------------------------------------- cells
def grid_rows(run: RunConfig, grid: Grid, locating: LocateSettings, cells: Cells, executor: ExecutorSettings,
              progress: bool = True, compute: bool = True) -> list[dict]:
    """One row per cell (H, m): accuracy and the shares of the storage labels (compute=False:
    the recorded cells only). Stacked, the cells of one H not yet recorded train as one stack."""
    runs = {f"H{h}_m{m}": RunConfig(run.task, model, run.train) for (h, m), model in grid.models(run).items()}
    stacked = grid.stacked(run)
    groups = [(key,) for key in runs if not stacked or cells.recorded(key) is not None]  # cells alone
    alone = {key for (key,) in groups}
    groups += [keys for h in grid.heads  # one stack per H, of its cells not yet recorded
               if (keys := tuple(k for k, r in runs.items() if k not in alone and r.model.n_heads == h))]
    # many heads first: those rows reach 99% in a few hundred steps, so a sweep cut short
    # already has the frontier; the rows of few heads train their full budget
    groups.sort(key=lambda keys: -runs[keys[0]].model.n_heads)
    jobs = [one(Cell(keys[0], train_and_locate, (runs[keys[0]], locating, cells.checkpoint(keys[0]))))
            if keys[0] in alone else
            one(Cell(f"stack_{keys[0]}", train_and_locate_stack,
                     (tuple(runs[k] for k in keys), keys, locating, tuple(map(cells.checkpoint, keys))), parts=keys))
            for keys in groups]
    with open_executor(executor if compute else ExecutorSettings()) as running:
        results = run_jobs(jobs, cells, running, desc="trade-off grid", total=len(runs), progress=progress,
                           compute=compute)
    rows = {key: row for keys, result in zip(groups, results) if result is not None  # a stack's job: a tuple
            for key, row in zip(keys, result if isinstance(result, tuple) else (result,))}
    return [rows[key] for key in runs if key in rows]  # the grid's order, whichever way the cells ran


# --------------------------------------------------------------------------- tables
def frontier_of(table: pd.DataFrame) -> dict[int, int | None]:
    """The 99% frontier: per H, the smallest m whose accuracy reaches 0.99 (None: no m does)."""
    score = accuracy_column(table)
    return {int(h): (int(g.loc[g[score] >= 0.99, "width"].min()) if (g[score] >= 0.99).any() else None)
            for h, g in table.groupby("heads")}


def grid_tables(rows: list[dict], grid: Grid, run: RunConfig, computed: int) -> Result:
    """grid.csv, and the 99% frontier (smallest m reaching 99% at each H) and the corners."""
    table = pd.DataFrame(rows)
    table["width"] = table["width"].fillna(0).astype(int)  # an attention-only cell: m = 0
    score = accuracy_column(table)
    frontier = frontier_of(table)
    widths = grid.widths_of(run)
    corners = {name: corner.iloc[0].to_dict()
               for name, h, m in (("attention_heavy", max(grid.heads), min(widths)),
                                  ("mlp_heavy", min(grid.heads), max(widths)))
               if len(corner := table[(table["heads"] == h) & (table["width"] == m)])}  # recorded ones
    summary = {"frontier_min_width_at_99": frontier, "frontier_accuracy": score, "corners": corners,
               "task": repr(run.task.build()), "cells": f"{len(table)} of {len(grid.heads) * len(widths)}",
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
