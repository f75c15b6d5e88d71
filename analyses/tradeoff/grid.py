"""The H x m grid (paper Figure 4 right): per cell, held-out accuracy and where locate_facts
finds the facts; the 99% frontier and the corners."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from analyses.locate_facts import LocateSettings
from analyses.sweeps import cli
from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import ExecutorSettings, open_executor
from analyses.tradeoff.common import Result, accuracy_column, train_and_locate, train_and_locate_stack, write_result
from analyses.tradeoff.figures import grid_figure
from models.bridge import resolve_device
from models.cli import override
from models.recall.config import ModelConfig, RunConfig
from models.text import count

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
    seeds: tuple[int, ...] = field(default=(), metadata={
        "help": "train every cell with each of these seeds (in place of --seed): grid.csv the mean over seeds, "
                "grid_by_seed.csv each seed's cells, the frontier and the attention floor per seed and their "
                "spread (docs/tradeoff.md)"})

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
        seeded = {"seeds": "per cell"} if self.seeds else {}  # a seeded grid can take more seeds later
        return {"heads": list(self.heads), "widths": list(self.widths_of(run)), **stacked, **seeded}

    def grown(self, recorded: dict | None, given: set[str]) -> Grid:
        """The grid to run where a grid with these `recorded` settings (settings.json, or None)
        lies: the H and m values it recorded, with those given on the command line (`given`:
        the Grid fields set by a flag) added. So `--heads 64` grows a recorded grid by a row,
        and a rerun without --heads or --widths resumes it as it was."""
        if not recorded or recorded.get("analysis") != "tradeoff grid":
            return self
        heads, widths = (tuple(sorted({*recorded.get(name, ()), *(getattr(self, name) if name in given else ())}))
                         for name in ("heads", "widths"))
        return replace(self, heads=heads or self.heads,
                       widths=tuple(m for m in widths if m > 0) or self.widths)  # attention-only grids record m = 0

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

    def runs(self, run: RunConfig) -> dict[str, RunConfig]:
        """Every cell's run by its key: H{h}_m{m}, and _seed{s} for each of --seeds."""
        models = self.models(run)
        if not self.seeds:
            return {f"H{h}_m{m}": RunConfig(run.task, model, run.train) for (h, m), model in models.items()}
        return {f"H{h}_m{m}_seed{s}": RunConfig(run.task, model, replace(run.train, seed=(s,)))
                for (h, m), model in models.items() for s in self.seeds}


# ---------------------------------------------------------------------------- cells
def grid_rows(run: RunConfig, grid: Grid, locating: LocateSettings, cells: Cells, executor: ExecutorSettings,
              progress: bool = True, compute: bool = True) -> list[dict]:
    """One row per cell (H, m): accuracy and the shares of the storage labels (compute=False:
    the recorded cells only). Stacked, the cells of one H not yet recorded train as one stack."""
    runs = grid.runs(run)
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
                     (tuple(runs[k] for k in keys), keys, locating, tuple(map(cells.checkpoint, keys)),
                      cells.state(f"stack_{keys[0]}")), parts=keys))
            for keys in groups]
    with open_executor(executor if compute else ExecutorSettings()) as running:
        results = run_jobs(jobs, cells, running, desc="trade-off grid", total=len(runs), progress=progress,
                           compute=compute)
    rows = {key: row for keys, result in zip(groups, results) if result is not None  # a stack's job: a tuple
            for key, row in zip(keys, result if isinstance(result, tuple) else (result,))}
    return [{**rows[key], **({"seed": runs[key].train.seed[0]} if grid.seeds else {})}
            for key in runs if key in rows]  # the grid's order, whichever way the cells ran


# --------------------------------------------------------------------------- tables
def frontier_of(table: pd.DataFrame) -> dict[int, int | None]:
    """The 99% frontier: per H, the smallest m whose accuracy reaches 0.99 (None: no m does)."""
    score = accuracy_column(table)
    return {int(h): (int(g.loc[g[score] >= 0.99, "width"].min()) if (g[score] >= 0.99).any() else None)
            for h, g in table.groupby("heads")}


def floor_between(frontier: dict[int, int | None]) -> list[int | None]:
    """The attention floor as [largest H below it (no m reaches 99%), smallest H reaching 99%]."""
    reaching = [h for h, m in frontier.items() if m is not None]
    first = min(reaching) if reaching else None
    below = [h for h, m in frontier.items() if m is None and (first is None or h < first)]
    return [max(below) if below else None, first]


def grid_tables(rows: list[dict], grid: Grid, run: RunConfig, computed: int) -> Result:
    """grid.csv, and the 99% frontier (smallest m reaching 99% at each H), the attention
    floor and the corners. With seeds: grid.csv is the mean over seeds of each cell (its
    frontier and floor are the mean's), grid_by_seed.csv every seed's cells, and the summary
    adds each seed's frontier and floor and, per H, the spread of the frontier over seeds."""
    by_seed = pd.DataFrame(rows)
    by_seed["width"] = by_seed["width"].fillna(0).astype(int)  # an attention-only cell: m = 0
    table = seed_means(by_seed) if grid.seeds else by_seed
    score = accuracy_column(table)
    frontier = frontier_of(table)
    widths = grid.widths_of(run)
    corners = {name: corner.iloc[0].to_dict()
               for name, h, m in (("attention_heavy", max(grid.heads), min(widths)),
                                  ("mlp_heavy", min(grid.heads), max(widths)))
               if len(corner := table[(table["heads"] == h) & (table["width"] == m)])}  # recorded ones
    summary = {"frontier_min_width_at_99": frontier, "floor_between": floor_between(frontier),
               "frontier_accuracy": score, "corners": corners,
               "task": repr(run.task.build()), "cells": f"{len(table)} of {len(grid.heads) * len(widths)}",
               "cells_computed": computed}
    tables = {"grid.csv": table}
    if grid.seeds:
        tables["grid_by_seed.csv"] = by_seed
        summary.update(seed_spread(by_seed))
    return Result(tables, summary)


def seed_means(by_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (H, m): the mean over its seeds of every number, the lowest and highest
    accuracy, and how many seeds it has."""
    score = accuracy_column(by_seed)
    fixed = ["attention_parameters", "mlp_parameters"]  # the cell's, whatever the seed
    numbers = by_seed.select_dtypes("number").columns.drop(["heads", "width", "seed", "lr", *fixed])
    cells = by_seed.groupby(["heads", "width"], sort=False)
    table = cells[fixed].first().join(cells[list(numbers)].mean()).reset_index()
    table[f"{score}_min"] = cells[score].min().to_numpy()
    table[f"{score}_max"] = cells[score].max().to_numpy()
    table["seeds"] = cells["seed"].nunique().to_numpy()
    return table


def seed_spread(by_seed: pd.DataFrame) -> dict:
    """Each seed's frontier and floor, and per H the smallest, median and largest frontier m
    over the seeds that reach 99% at that H, with how many do."""
    frontiers = {int(s): frontier_of(g) for s, g in by_seed.groupby("seed")}
    spread = {}
    for h in sorted({h for f in frontiers.values() for h in f}):
        widths = sorted(f[h] for f in frontiers.values() if f.get(h) is not None)
        spread[h] = {"seeds_reaching": len(widths), "min": widths[0] if widths else None,
                     "median": float(pd.Series(widths).median()) if widths else None,
                     "max": widths[-1] if widths else None}
    return {"frontier_by_seed": frontiers, "floor_by_seed": {s: floor_between(f) for s, f in frontiers.items()},
            "frontier_spread": spread}


# --------------------------------------------------------------------------- report
def write_grid(result: Result, run: RunConfig, out: Path) -> None:
    write_result(result, out)
    grid_figure(result.tables["grid.csv"], result.summary["frontier_min_width_at_99"], out / "grid.png", run)


def grid_text(result: Result, out: Path) -> str:
    table = result.tables["grid.csv"]
    columns = ["heads", "width", *dict.fromkeys(["accuracy", accuracy_column(table)]), "share_attention",
               "share_mlp", "share_both", "share_distributed", "share_not_stored"]
    lines = [table[columns].to_string(index=False, float_format="%.3f")]
    if "frontier_spread" in result.summary:  # a grid over seeds: the means above, the frontier's spread here
        lines.append("smallest m at 99% per seed (min / median / max over the seeds reaching it):")
        lines += [f"  H={h}: " + (f"{v['min']} / {v['median']:g} / {v['max']}, {v['seeds_reaching']} of "
                                  f"{table['seeds'].max()} seeds" if v["seeds_reaching"] else "no seed reaches 99%")
                  for h, v in result.summary["frontier_spread"].items()]
    return "\n".join(lines) + f"\nwrote {out}/ ({count(result.summary['cells_computed'], 'new cell')})"
