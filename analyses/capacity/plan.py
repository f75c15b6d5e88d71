"""The plan of a transformer capacity sweep before it runs: the sweep's own search
(shape_capacity) answered by a stand-in oracle instead of training, and the model-steps
(steps run times the models trained together) it would spend, by shape and d, under
today's rules and under the new ones (the milestone rule, rounds filled), with the time they
project to on a device.

The oracle: a probe a recorded sweep trained with the same settings (the sampler aside) is
answered by its recorded row, replayed under the milestone rule where the rule is on (the
stopped probe spends the steps up to its stop and fails); any other probe passes when S is at
most S*(shape, d) (the recorded S* where one is recorded, else the line fitted to the recorded
facts against parameters, with the shape's own offset where it has recorded sizes), and
spends the recorded mean share of the steps of a passing probe, or of a failing one (its
whole budget under today's rules or above the rule's range)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.capacity.common import TARGET
from analyses.capacity.stopping import MILESTONES_MAX_D, RESULTS, recorded_probes, stop_step
from analyses.capacity.transformer import (
    LOWEST,
    TransformerSweep,
    probe_key,
    round_rows,
    shape_capacity,
    transformer_row,
)
from analyses.sweeps.cells import Cell, Cells, run_jobs
from models.recall.weights import parameter_count
from models.text import count

# The H100 record (results/gpu/2026-11-26-h100/README.md): a round of 15 models at d = 128 ran
# 16,384 steps in 23 to 36 s; the slowest round sets the rate.
H100_RATE = 15 * 16384 / 36  # model-steps per second
DEFAULT_ORACLE = {"authors": ("paper_fig4_left_authors", "paper_fig4_left_authors_seed1"),
                  "standard": ("paper_fig4_left",)}


def today(sweep: TransformerSweep) -> TransformerSweep:
    return replace(sweep, give_up="never", fill_rounds=False)


def new_rules(sweep: TransformerSweep) -> TransformerSweep:
    return replace(sweep, give_up="milestones", fill_rounds=True)


@dataclass
class Oracle:
    """Stand-in answers: recorded sweeps' folders (their probes answer probes trained with the
    same settings, their capacity.csv gives S*), and the shares of the step budget that
    recorded probes spent."""

    folders: tuple[Path, ...]
    _matching: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # sweep -> [Cells]

    def __post_init__(self):
        tables = [pd.read_csv(f / "capacity.csv") for f in self.folders if (f / "capacity.csv").is_file()]
        table = pd.concat(tables) if tables else pd.DataFrame(columns=["shape", "d", "S_star", "facts", "parameters"])
        table = table[table["facts"] > 0]
        self.s_star = table.groupby(["shape", "d"])["S_star"].median().to_dict()
        self.slope, self.intercept = (np.polyfit(np.log(table["parameters"]), np.log(table["facts"]), 1)
                                      if len(table) > 1 else (1.0, math.log(0.1)))
        residual = np.log(table["facts"]) - (self.intercept + self.slope * np.log(table["parameters"]))
        self.offset = residual.groupby(table["shape"]).mean().to_dict()
        probes, _ = recorded_probes(RESULTS)
        passing = [row["steps_run"] / steps for _, row, steps in probes if row["accuracy"] >= TARGET]
        stopped = [(stop_step(row, steps) or row["steps_run"]) / steps for _, row, steps in probes
                   if row["accuracy"] < TARGET]
        self.pass_share = float(np.mean(passing)) if passing else 1.0
        self.give_up_share = float(np.mean(stopped)) if stopped else 1.0
        self.settings = {f: json.loads((f / "settings.json").read_text()) for f in self.folders
                         if (f / "settings.json").is_file()}

    def stand_in(self, sweep: TransformerSweep, shape: tuple, d: int) -> int:
        """S* of the shape at size d: recorded, else from the fitted line."""
        name = ",".join(f"{v:g}" for v in shape[:3])
        if (name, d) in self.s_star:
            return int(self.s_star[(name, d)])
        log_parameters = math.log(parameters(sweep, shape, d))
        facts = math.exp(self.intercept + self.offset.get(name, 0.0) + self.slope * log_parameters)
        return max(LOWEST - 1, int(math.sqrt(facts)))

    def probe(self, sweep: TransformerSweep, shape: tuple, d: int, S: int, seed: int | None) -> dict:
        """The probe's stand-in row: accuracy (1 or 0 where not recorded), steps run, model-steps."""
        give_up = sweep.give_up == "milestones" and d <= MILESTONES_MAX_D
        row = self.recorded(sweep, probe_key(shape, d, S, seed))
        if row is not None:
            stop = stop_step(row, sweep.steps) if give_up and row.get("runs") else None
            steps = row["steps_run"] if stop is None else stop
            accuracy = row["accuracy"] if stop is None else 0.0
        else:
            passes = S <= self.stand_in(sweep, shape, d)
            share = self.pass_share if passes else self.give_up_share if give_up else 1.0
            steps, accuracy = round(share * sweep.steps), float(passes)
        return {"shape": ",".join(f"{v:g}" for v in shape[:3]), "d": d, "S": S, "seed": seed, "accuracy": accuracy,
                "steps_run": steps, "model_steps": steps * len(sweep.lr), "recorded": row is not None}

    def recorded(self, sweep: TransformerSweep, key: str) -> dict | None:
        """The row of `key` in a recorded sweep that trained what `sweep` trains (the sampler
        and the stopping rule aside)."""
        for cells in self.matching(sweep):
            row = cells.recorded(key)
            if row is not None:
                return row
        return None

    def matching(self, sweep: TransformerSweep) -> list[Cells]:
        """The recorded sweeps that trained what `sweep` trains, found once a sweep (a plan asks
        for thousands of probes)."""
        if sweep not in self._matching:
            mine = {k: v for k, v in today(sweep).recorded().items() if k != "sampler"}
            self._matching[sweep] = [Cells(folder, settings) for folder, settings in self.settings.items()
                                     if {k: v for k, v in settings.items() if k not in ("sampler", "torch_threads")}
                                     == mine]
        return self._matching[sweep]


def parameters(sweep: TransformerSweep, shape: tuple, d: int) -> int:
    """The shape's parameter count at size d (Figure 4's x axis)."""
    run = sweep.run(shape, d, LOWEST, "cpu")
    return parameter_count(run.model.checkpoint_section(run.task.build()))["total"]


def default_oracle(sweep: TransformerSweep) -> Oracle:
    """The recorded Figure 4 left sweeps of the sweep's model."""
    names = DEFAULT_ORACLE["standard" if sweep.parameterisation == "standard" else "authors"]
    return Oracle(tuple(RESULTS / name for name in names))


class _Answers:
    """An executor answering each cell from the oracle, in the order submitted."""

    running = 0

    def __init__(self, oracle: Oracle, sweep: TransformerSweep):
        self.oracle, self.sweep, self.queue = oracle, sweep, []

    def submit(self, cell: Cell) -> None:
        self.queue.append(cell)

    def finished(self) -> tuple[Cell, dict]:
        cell = self.queue.pop(0)
        shape, d, sizes = cell.args[:3]
        if cell.fn is transformer_row:
            return cell, self.oracle.probe(self.sweep, shape, d, sizes, None)
        assert cell.fn is round_rows
        return cell, {probe_key(shape, d, S, seed): self.oracle.probe(self.sweep, shape, d, S, seed)
                      for S in sizes for seed in self.sweep.seeds}


class _Planned:
    """In-memory cells: nothing recorded, every row kept."""

    def __init__(self):
        self.rows: list[dict] = []

    def recorded(self, key: str) -> None:
        return None

    def record(self, key: str, row: dict) -> dict:
        self.rows.append(row)
        return row

    def checkpoint(self, key: str) -> None:
        return None

    def state(self, key: str) -> None:
        return None

    def release(self, key: str) -> None:
        return None


def plan(sweep: TransformerSweep, oracle: Oracle) -> tuple[pd.DataFrame, dict]:
    """Every probe the sweep would train, in order, with the model-steps it would spend, and
    the S* its searches would find, {(shape, d): S*}."""
    cells, found = _Planned(), {shape: {} for shape in sweep.shapes}
    run_jobs([shape_capacity(shape, sweep, "cpu", found[shape], cells) for shape in sweep.shapes], cells,
             _Answers(oracle, sweep), progress=False)
    probes = pd.DataFrame(cells.rows, columns=["shape", "d", "S", "seed", "accuracy", "steps_run", "model_steps",
                                               "recorded"])
    return probes, {(",".join(f"{v:g}" for v in shape[:3]), d): S for shape in sweep.shapes
                    for d, S in found[shape].items()}


def plan_text(sweep: TransformerSweep, oracle: Oracle, rate: float | None) -> tuple[str, pd.DataFrame]:
    """The plan under today's rules and the new ones, by shape and d and in total; both plans' probes."""
    planned = {"today": plan(today(sweep), oracle), "new": plan(new_rules(sweep), oracle)}
    plans = {name: probes for name, (probes, _) in planned.items()}
    table = pd.concat([p.assign(rules=name) for name, p in plans.items()])
    found = {name: s_star for name, (_, s_star) in planned.items()}
    moved = [f"{shape} d={d}: {S} -> {found['new'].get((shape, d))}" for (shape, d), S in found["today"].items()
             if found["new"].get((shape, d)) != S]
    by = table.groupby(["shape", "d", "rules"], sort=False)["model_steps"].sum().unstack("rules").fillna(0)
    probes = table.groupby(["shape", "d", "rules"], sort=False).size().unstack("rules").fillna(0)
    lines = [f"plan of {count(len(sweep.shapes), 'shape')} x d = {','.join(map(str, sweep.d))}, "
             f"{count(len(sweep.lr), 'learning rate')}, {count(max(1, len(sweep.seeds)), 'seed')}, {sweep.steps} "
             "steps; model-steps today -> new rules (probes in brackets):"]
    for shape in dict.fromkeys(table["shape"]):
        cells = [f"d={d}: {_k(by.loc[(shape, d), 'today'])} -> {_k(by.loc[(shape, d), 'new'])} "
                 f"({probes.loc[(shape, d), 'today']:.0f} -> {probes.loc[(shape, d), 'new']:.0f})"
                 for d in sorted(table.loc[table["shape"] == shape, "d"].unique())]
        lines.append(f"  {shape:<11} " + "; ".join(cells))
    totals = {name: int(p["model_steps"].sum()) for name, p in plans.items()}
    lines.append(f"total: {totals['today']:,} model-steps today, {totals['new']:,} with the new rules "
                 f"({totals['new'] / max(1, totals['today']):.2f}x); recorded probes stand in for "
                 f"{int(table['recorded'].sum())} of {len(table)}")
    lines.append(f"S* with the new rules: the same as today's at {len(found['today']) - len(moved)} of "
                 f"{len(found['today'])} sizes" + (f" (moved: {'; '.join(moved)})" if moved else ""))
    lines.append(f"projected on one H100 at {H100_RATE:,.0f} model-steps/s (its record: 15 models x 16,384 steps in "
                 f"23-36 s at d = 128): {totals['today'] / H100_RATE / 60:.1f} min today, "
                 f"{totals['new'] / H100_RATE / 60:.1f} min with the new rules")
    if rate:
        lines.append(f"projected at the recorded probes' rate ({rate:,.0f} model-steps/s): "
                     f"{totals['today'] / rate / 60:.1f} min today, {totals['new'] / rate / 60:.1f} min new")
    return "\n".join(lines), table


def recorded_rate(oracle: Oracle) -> float | None:
    """Model-steps per second of the oracle's recorded probes (on the device that trained them)."""
    spent = seconds = 0.0
    for folder, settings in oracle.settings.items():
        for path in (folder / "cells").glob("*.json"):
            row = json.loads(path.read_text())
            spent, seconds = spent + row["steps_run"] * len(settings["lr"]), seconds + row["seconds"]
    return spent / seconds if seconds else None


def _k(steps: float) -> str:
    return f"{steps / 1e3:.0f}k" if steps >= 1e4 else f"{steps:.0f}"
