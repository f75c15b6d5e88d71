"""The milestone rule (models.recall.config.MILESTONES: a run that cannot reach 99% gives up early)
replayed on every probe of a recorded capacity sweep whose evaluation curves were recorded:
how many it would have stopped although they later reached 99% (it must be none), and the
model-steps it saves."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from analyses.capacity.common import TARGET
from models.recall.config import MILESTONES_MAX_D, TrainConfig

RESULTS = Path(__file__).resolve().parents[2] / "results" / "capacity"


def stop_step(row: dict, steps: int) -> int | None:
    """The evaluation step at which the milestone rule stops the recorded probe `row` (its
    curves, per learning rate, under `runs`) trained with a budget of `steps`; None when it
    does not stop it before the probe ended."""
    rule = TrainConfig(steps=steps, give_up="milestones")
    curves = [run["curve"] for run in row["runs"]]
    best = 0.0
    for i, step in enumerate(curves[0]["step"]):
        best = max(best, *(curve["accuracy"][i] for curve in curves))
        if best >= TARGET:
            return None
        if step < row["steps_run"] and rule.gives_up(step, best):
            return step
    return None


def model_steps(row: dict) -> int:
    """Steps run times the models trained together (one per learning rate)."""
    return row["steps_run"] * len(row.get("runs") or [None])


@dataclass(frozen=True)
class Validation:
    """The rule replayed on recorded curves: `wrong` probes stopped that later reached 99%."""

    probes: int
    passing: int
    wrong: int
    model_steps: int
    saved: int
    sweeps: tuple[str, ...]
    d: tuple[int, ...]
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    without_curves: tuple[str, ...]

    def text(self) -> str:
        return (f"milestone rule replayed on {self.probes} recorded probes ({len(self.sweeps)} sweeps, d = "
                f"{min(self.d)}..{max(self.d)}, {' and '.join(self.models)} models, seeds "
                f"{','.join(map(str, self.seeds))}): {self.wrong} of the {self.passing} that reached 99% stopped "
                f"wrongly; saves {self.saved:,} of {self.model_steps:,} model-steps "
                f"({self.saved / self.model_steps:.1%})"
                f"; off above d = {MILESTONES_MAX_D} (no recorded curve there)"
                + (f"; no curves recorded in {', '.join(self.without_curves)}" if self.without_curves else ""))


def recorded_probes(root: Path = RESULTS) -> tuple[list[tuple[str, dict, int]], list[str]]:
    """Every probe with curves in the capacity sweeps under `root` as (sweep, row, step
    budget), and the transformer sweeps that recorded none."""
    probes, without = [], []
    for settings in sorted(root.glob("*/settings.json")):
        recorded = json.loads(settings.read_text())
        if "transformer" not in recorded.get("analysis", "") and "departures" not in recorded.get("analysis", ""):
            continue
        rows = [json.loads(p.read_text()) for p in sorted((settings.parent / "cells").glob("*.json"))]
        with_curves = [r for r in rows if r.get("runs") and "curve" in r["runs"][0]]
        model = recorded.get("model", {}).get("parameterisation", "standard")
        probes += [(settings.parent.name, {**r, "seed": r.get("seed", recorded.get("seed")),
                                           "model": r.get("variant", model)}, recorded["steps"]) for r in with_curves]
        if rows and not with_curves:
            without.append(settings.parent.name)
    return probes, without


def validate(root: Path = RESULTS) -> Validation:
    """The milestone rule on every recorded curve under `root`."""
    probes, without = recorded_probes(root)
    wrong = saved = total = passing = 0
    for _, row, steps in probes:
        stop = stop_step(row, steps)
        reached = any(run["best_accuracy"] >= TARGET for run in row["runs"])
        passing += reached
        total += model_steps(row)
        if stop is not None and reached:
            wrong += 1
        elif stop is not None:
            saved += (row["steps_run"] - stop) * len(row["runs"])
    models = sorted({"authors" if row["model"].startswith("authors") else "standard" for _, row, _ in probes})
    return Validation(len(probes), passing, wrong, total, saved, tuple(sorted({s for s, _, _ in probes})),
                      tuple(sorted({row["d"] for _, row, _ in probes})), tuple(models),
                      tuple(sorted({row["seed"] for _, row, _ in probes if row["seed"] is not None})), tuple(without))
