"""Two recorded grids side by side (the standard and the authors' model, say): where each
reaches 99%, where each keeps its facts, and what their settings differ in."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.sweeps.output import save_figure
from analyses.tradeoff.common import Result, accuracy_column, write_result
from analyses.tradeoff.figures import frontier_cells, frontier_line, heat_map, panel_grid, paper_grid, paper_lines
from analyses.tradeoff.grid import floor_between, frontier_of
from models.recall.config import ModelConfig

SHARES = ["share_attention", "share_mlp", "share_both", "share_distributed", "share_not_stored"]
CELL = ["heads", "width"]


@dataclass(frozen=True)
class RecordedGrid:
    """One grid as its sweep wrote it: grid.csv (one row per cell) and settings.json."""

    label: str
    table: pd.DataFrame
    settings: dict


def read_grid(path: Path, label: str) -> RecordedGrid:
    """The grid recorded in `path`, refused in one line where there is none."""
    for name in ("grid.csv", "settings.json"):
        if not (path / name).is_file():
            raise ValueError(f"{path} holds no recorded grid: {name} is missing (a grid still running writes "
                             f"it with `python -m analyses.tradeoff grid ... --recorded-only --out {path}`).")
    settings = json.loads((path / "settings.json").read_text())
    if settings.get("analysis") != "tradeoff grid":
        raise ValueError(f"{path} is not a trade-off grid: its settings.json records {settings.get('analysis')!r}.")
    return RecordedGrid(label, pd.read_csv(path / "grid.csv"), settings)


def _flat(settings: dict, prefix: str = "") -> dict:
    """Nested settings as {'run.model.parameterisation': value, ...}."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


# settings a grid's settings.json leaves out when they hold their default (ModelConfig.recorded)
LEFT_OUT = {"run.model.parameterisation": ModelConfig.parameterisation}


def setting_differences(a: RecordedGrid, b: RecordedGrid) -> dict[str, list]:
    """Every setting the two sweeps do not share: {name: [a's value, b's value]} (None: not
    recorded; a setting left out for its default counts as its default)."""
    fa, fb = ({**LEFT_OUT, **_flat(g.settings)} for g in (a, b))
    return {k: [fa.get(k), fb.get(k)] for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


def compare_grids(a: RecordedGrid, b: RecordedGrid) -> Result:
    """compare.csv: the cells recorded in both, one row per grid and cell (accuracy, steps,
    storage shares); frontier.csv: per H, each grid's smallest m at 99%; summary.json: per
    grid the frontier, floor, cells at 99% and mean storage shares, and the settings that differ."""
    common = a.table[CELL].merge(b.table[CELL])
    if common.empty:
        raise ValueError(f"the grids {a.label} and {b.label} have no cell (H, m) in common.")
    score = accuracy_column(a.table) if accuracy_column(b.table) == accuracy_column(a.table) else "accuracy"
    columns = [*CELL, "attention_parameters", "mlp_parameters", score, "steps_run", *SHARES]
    cells = pd.concat([g.table.merge(common)[columns].assign(grid=g.label) for g in (a, b)], ignore_index=True)
    cells = cells[["grid", *columns]]
    frontiers = {g.label: frontier_of(cells[cells["grid"] == g.label]) for g in (a, b)}
    heads = sorted(common["heads"].unique())
    frontier = pd.DataFrame({"heads": heads, **{label: pd.array([f[h] for h in heads], dtype="Int64")
                                                for label, f in frontiers.items()}})  # <NA>: no m reaches 99%
    per_grid = {}
    for label, g in cells.groupby("grid", sort=False):
        stored = g[g[score] >= 0.99]
        per_grid[label] = {"frontier_min_width_at_99": frontiers[label],
                           "floor_between": floor_between(frontiers[label]),
                           "cells_at_99": int(len(stored)), "mean_steps_run": float(g["steps_run"].mean()),
                           "mean_shares": {c: float(g[c].mean()) for c in SHARES},
                           "mean_shares_at_99": {c: float(stored[c].mean()) for c in SHARES} if len(stored) else None}
    summary = {"grids": [a.label, b.label], "cells_compared": int(len(common)), "accuracy": score,
               "setting_differences": setting_differences(a, b), "per_grid": per_grid}
    return Result({"compare.csv": cells, "frontier.csv": frontier}, summary)


def compare_figure(result: Result, a: RecordedGrid, path: Path | None = None):
    """Per cell, the second grid minus the first (accuracy; shares in attention, in the MLP,
    distributed), two by two on one colour scale symmetric about 0, with both frontiers (the
    differences written in their cells; every cell's values are in compare.csv) and, on the
    paper's grid, the authors' lines."""
    cells, (first, second) = result.tables["compare.csv"], result.summary["grids"]
    score = result.summary["accuracy"]
    one, two = (cells[cells["grid"] == label].set_index(CELL) for label in (first, second))
    difference = (two[[score, *SHARES]] - one[[score, *SHARES]]).join(one[["attention_parameters", "mlp_parameters"]])
    difference = difference.reset_index()
    run = a.settings.get("run", {})
    paper = paper_grid(run.get("task", {}), run.get("model", {}))
    panels = [(score, "held-out accuracy"), ("share_attention", "share of facts in attention"),
              ("share_mlp", "share of facts in the MLP"), ("share_distributed", "share of facts distributed")]
    frontiers = {label: result.summary["per_grid"][label]["frontier_min_width_at_99"] for label in (first, second)}
    numbers = frontier_cells(frontiers[first]) | frontier_cells(frontiers[second])
    largest = difference[[col for col, _ in panels]].abs().max().max()  # unrecorded (NaN) cells skipped
    limit = max(np.ceil(largest * 20) / 20, 0.05)  # the largest difference, rounded up to 0.05
    fig, axes = panel_grid()
    for ax, (col, title) in zip(axes, panels):
        image = heat_map(ax, difference, col, "RdBu", (-limit, limit), numbers=numbers)
        for label, style in ((first, "C2.-"), (second, "C1.-")):
            frontier_line(ax, difference, frontiers[label], style, f"99% frontier, {label} (differences written)")
        if paper:
            paper_lines(ax, difference)
        ax.set_title(f"{title}: {second} minus {first}", fontsize=10)
        fig.colorbar(image, ax=ax)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return save_figure(fig, path)


def write_compare(result: Result, a: RecordedGrid, out: Path) -> None:
    write_result(result, out)
    compare_figure(result, a, out / "compare.png")


def compare_text(result: Result, out: Path) -> str:
    s = result.summary
    frontier = result.tables["frontier.csv"].astype(object).fillna("none")
    lines = [f"{s['cells_compared']} cells in both grids; settings that differ: "
             + (", ".join(f"{k} ({' / '.join('not recorded' if x is None else str(x) for x in v)})"
                          for k, v in s["setting_differences"].items()) or "none"),
             "smallest m at 99% per H:", frontier.to_string(index=False)]
    for label, g in s["per_grid"].items():
        shares = ", ".join(f"{k.removeprefix('share_')} {v:.2f}" for k, v in g["mean_shares"].items())
        lines.append(f"{label}: {g['cells_at_99']} cells at 99%, {_floor_text(*g['floor_between'])}; "
                     f"mean shares {shares}")
    return "\n".join(lines + [f"wrote {out}/"])


def _floor_text(below: int | None, first: int | None) -> str:
    if first is None:
        return f"no H reaches 99% (up to H = {below})"
    if below is None:
        return f"no floor within the grid (H = {first} reaches 99%)"
    return f"attention floor between H = {below} and {first}"
