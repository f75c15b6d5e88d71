"""`oscillation` and `overoptimisation`: gradient descent on small memories over steps
(analyses.capacity.zipf.dynamics), each a sweep of cells (one per correlation, or per N: every
step size and seed at once), its tables, figure and report."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.capacity.zipf import dynamics
from analyses.capacity.zipf.figures import overoptimisation_figure, steps_figure
from analyses.capacity.zipf.fits import interval
from analyses.sweeps import cli
from analyses.sweeps.output import write_csv, write_summary
from models.bridge import resolve_device
from models.cli import setting
from models.text import count

SHOWN = 6  # seeds whose error rose, kept as curves for the figure


@dataclass(frozen=True)
class OscillationStudy:
    """Two tokens, correlated embeddings, imbalanced frequencies: steps to perfect accuracy."""

    correlations: tuple[float, ...] = setting((0.0, 0.5, 0.75, 0.95), "e_1·e_2 of the two tokens' unit embeddings "
                                              "(the authors' figure: 0.95; 0: orthogonal)")
    first_frequency: float = setting(0.75, "p_1, the first token's probability (the authors: 0.75)")
    step_sizes: tuple[float, ...] = setting((0.1, 0.3, 1.0, 3.0, 10.0), "gradient descent step sizes η (the "
                                            "authors' curves: 1 and 10)")
    steps: int = setting(1000, "steps of gradient descent (the authors: 1000; their curves 35)")
    curve_steps: int = setting(60, "steps of each curve kept (curves.csv, the figure)")

    def __post_init__(self):
        cli.at_least(self, steps=1, curve_steps=1)
        cli.require(self, "correlations", all(-1 < c < 1 for c in self.correlations), "in (-1, 1)")
        cli.require(self, "first_frequency", 0 < self.first_frequency < 1, "in (0, 1)")
        cli.require(self, "step_sizes", all(0 < lr < math.inf for lr in self.step_sizes), "finite and > 0")

    def cells(self) -> list[float]:
        return list(dict.fromkeys(self.correlations))

    def recorded(self) -> dict:
        return {"analysis": "capacity oscillation", **{k: v for k, v in asdict(self).items() if k != "correlations"}}


@dataclass(frozen=True)
class OveroptimisationStudy:
    """N tokens on the circle (d = 2), Zipf frequencies: the error over steps against the best."""

    tokens: tuple[int, ...] = setting((3, 10, 30), "N, tokens on the circle (the authors: 3 and 30, and 10 for "
                                      "their trajectory)")
    alpha: float = setting(1.0, "Zipf exponent of p(z) (the authors: 1, and 2 for their trajectory)")
    step_sizes: tuple[float, ...] = setting((0.1, 1.0), "gradient descent step sizes η")
    steps: int = setting(2000, "steps of gradient descent")
    seeds: tuple[int, ...] = setting(tuple(range(40)), "seeds: each its embeddings")
    curve_points: int = setting(80, "steps of each mean curve kept, spaced evenly in log t")

    def __post_init__(self):
        cli.at_least(self, tokens=2, steps=1, curve_points=2)
        cli.require(self, "alpha", 0 <= self.alpha < math.inf, "finite and >= 0")
        cli.require(self, "step_sizes", all(0 < lr < math.inf for lr in self.step_sizes), "finite and > 0")
        cli.require(self, "seeds", len(self.seeds) > 0, "at least one seed")

    def cells(self) -> list[int]:
        return list(dict.fromkeys(self.tokens))

    def recorded(self) -> dict:
        return {"analysis": "capacity overoptimisation", **{k: v for k, v in asdict(self).items() if k != "tokens"}}


def first_step(flags: np.ndarray) -> int | None:
    """The first index where `flags` holds, or None."""
    hits = np.flatnonzero(flags)
    return int(hits[0]) if len(hits) else None


def stays_from(flags: np.ndarray) -> int | None:
    """The first index from which `flags` holds to the end, or None."""
    fails = np.flatnonzero(~flags)
    start = int(fails[-1]) + 1 if len(fails) else 0
    return start if start < len(flags) else None


def oscillation_row(study: OscillationStudy, correlation: float, device: str) -> dict:
    """Every step size on one correlation: the first step at perfect accuracy, the step from
    which it stays perfect, how often the loss rose, and the first curve_steps of each curve."""
    start = time.perf_counter()
    loss, error = dynamics.descent(*dynamics.two_tokens(correlation, study.first_frequency), list(study.step_sizes),
                                   study.steps, resolve_device(device))
    loss, error = loss[0].cpu().numpy(), error[0].cpu().numpy()  # [L, T]
    return {"correlation": correlation, "step_sizes": list(study.step_sizes),
            "first_perfect": [first_step(e == 0) for e in error], "perfect_from": [stays_from(e == 0) for e in error],
            "loss_rises": [int((np.diff(v) > 0).sum()) for v in loss], "final_loss": loss[:, -1].tolist(),
            "loss": loss[:, :study.curve_steps].tolist(), "error": error[:, :study.curve_steps].tolist(),
            "seconds": time.perf_counter() - start}


def overoptimisation_row(study: OveroptimisationStudy, tokens: int, device: str) -> dict:
    """Every seed and step size on N tokens: the error at the last step, the best over training
    and its step, the smallest error any W reaches, and the mean curves over seeds."""
    start = time.perf_counter()
    E, U, p, answers = dynamics.circle_tokens(tokens, study.alpha, list(study.seeds))
    loss, error = (v.cpu().numpy() for v in dynamics.descent(E, U, p, answers, list(study.step_sizes), study.steps,
                                                             resolve_device(device)))  # [K, L, T]
    kept = np.unique(np.geomspace(1, study.steps, study.curve_points).astype(int) - 1)
    rose = error[:, :, -1] > error.min(-1) + 1e-12  # [K, L]
    return {"tokens": tokens, "seeds": list(study.seeds), "step_sizes": list(study.step_sizes),
            "best_possible": dynamics.best_error(E, p, answers).tolist(), "final_error": error[:, :, -1].tolist(),
            "best_error": error.min(-1).tolist(), "best_step": error.argmin(-1).tolist(),
            "final_loss": loss[:, :, -1].tolist(), "curve_steps": kept.tolist(),
            "loss": loss[:, :, kept].mean(0).tolist(), "error": error[:, :, kept].mean(0).tolist(),
            "rose": [error[rose[:, i], i][:, kept][:SHOWN].tolist() for i in range(len(study.step_sizes))],
            "seconds": time.perf_counter() - start}


def curves(rows: list[dict], by: str) -> pd.DataFrame:
    """The rows' curves: one row per value of `by`, step size and step."""
    return pd.DataFrame([{by: r[by], "step_size": lr, "step": r["curve_steps"][t] if "curve_steps" in r else t,
                          "loss": r["loss"][i][t], "error": r["error"][i][t]}
                         for r in rows for i, lr in enumerate(r["step_sizes"]) for t in range(len(r["loss"][i]))])


def oscillation_tables(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"correlation": r["correlation"], "step_size": lr, "first_perfect": r["first_perfect"][i],
                          "perfect_from": r["perfect_from"][i], "loss_rises": r["loss_rises"][i],
                          "final_loss": r["final_loss"][i]} for r in rows for i, lr in enumerate(r["step_sizes"])])


def overoptimisation_tables(rows: list[dict]) -> pd.DataFrame:
    """Per N and step size, over seeds: the final error, the best over training, the rise from
    one to the other (mean ± 95% interval) and the share of seeds it rose for, the smallest
    error possible, and the median step of the best."""
    out = []
    for r in rows:
        final, best = np.array(r["final_error"]), np.array(r["best_error"])  # [K, L]
        for i, lr in enumerate(r["step_sizes"]):
            rise = interval(list(final[:, i] - best[:, i]), "no seed")
            out.append({"tokens": r["tokens"], "step_size": lr, "final_error": final[:, i].mean(),
                        "best_over_training": best[:, i].mean(), "rise": rise.value, "rise_half_width": rise.half_width,
                        "rose_share": float((final[:, i] > best[:, i] + 1e-12).mean()),
                        "best_possible": float(np.mean(r["best_possible"])),
                        "best_step_median": float(np.median(np.array(r["best_step"])[:, i])),
                        "final_loss": float(np.mean(np.array(r["final_loss"])[:, i]))})
    return pd.DataFrame(out)


def write_steps(name: str, table: pd.DataFrame, rows: list[dict], by: str, out: Path, extra: dict) -> None:
    """{name}.csv, curves.csv, summary.json and {name}.png in `out`."""
    write_csv(out / f"{name}.csv", table)
    frame = curves(rows, by)
    write_csv(out / "curves.csv", frame)
    write_summary(out / "summary.json", {"table": table.to_dict("records"), "cells": len(rows), **extra})
    if name == "oscillation":
        steps_figure(frame, by, out / f"{name}.png")
    else:
        overoptimisation_figure(frame.assign(step=frame["step"] + 1), rows, table, out / f"{name}.png")


def steps_text(name: str, table: pd.DataFrame) -> str:
    if name == "oscillation":
        return "\n".join(f"  c={r.correlation:<5g} η={r.step_size:<5g} first perfect at step {r.first_perfect}, "
                         f"perfect from {r.perfect_from}, loss rose {count(r.loss_rises, 'time')}"
                         for r in table.itertuples())
    return "\n".join(f"  N={r.tokens:<3} η={r.step_size:<5g} error final {r.final_error:.3f}, best over training "
                     f"{r.best_over_training:.3f} (rose in {r.rose_share:.0%} of seeds), best possible "
                     f"{r.best_possible:.3f}" for r in table.itertuples())
