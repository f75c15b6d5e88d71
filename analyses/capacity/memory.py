"""Associative memories: the sweep's settings, its cells (N* per size and seed), the tables
against theory and the paper's line, and the report."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.capacity.common import Capacity
from analyses.capacity.figures import memory_figure
from analyses.least_squares import LINE, Fit, fit_log_log
from analyses.sweeps import cli
from analyses.sweeps.cells import Cell, Cells, run_jobs
from analyses.sweeps.executors import ExecutorSettings, open_executor
from analyses.sweeps.output import write_csv, write_summary
from analyses.sweeps.search import bisection, search
from models.bridge import resolve_device
from models.cli import setting
from models.recall.memories import KINDS, MemoryConfig, fit


@dataclass(frozen=True)
class MemorySweep:
    """The associative memories whose capacity N* is searched: sizes, seeds, and their fit."""

    kind: str = setting("linear", "linear (full, or low rank with --m) | mlp", choices=KINDS)
    d: tuple[int, ...] = setting((8, 16, 32), "embedding dimensions")
    m: tuple[int, ...] | None = setting(None, "linear: ranks (default full); mlp: widths")
    m_per_d: tuple[float, ...] | None = setting(None, "sizes m = a*d for each listed a, in place of --m "
                                                      "(the paper's MLP widths: 1,2,4,8)")
    seeds: tuple[int, ...] = setting((0, 1, 2), "seeds searched per size, a comma list (the paper 5: 0,1,2,3,4)")
    steps: int = setting(2000, "maximum Adam steps per fit (the paper 2^15)")
    lr: float = setting(0.1, "Adam learning rate")
    embedding: str = setting("sphere", "sphere (unit norm) | gaussian (N(0, 1/d) entries)",
                             choices=("sphere", "gaussian"))
    outputs_per_input: float = setting(1.0, "M/N: 1 = injective f")
    outputs: int | None = setting(None, "M fixed whatever N (the paper's Figure 6: 32); replaces --outputs-per-input")

    def __post_init__(self):
        cli.at_least(self, d=1, m=1, seeds=0, steps=1, outputs=2)
        cli.require(self, "seeds", len(self.seeds) > 0, "at least one seed")
        cli.require(self, "lr", self.lr > 0, "> 0")
        cli.require(self, "outputs_per_input", 0 < self.outputs_per_input <= 1, "in (0, 1]")
        if self.m is not None and self.m_per_d is not None:
            raise ValueError("give --m or --m-per-d, not both.")
        if self.kind == "mlp" and self.m is None and self.m_per_d is None:
            raise ValueError("--kind mlp needs --m (the widths) or --m-per-d.")
        for cfg in self.memories():
            cfg.validate()

    def memories(self) -> list[MemoryConfig]:
        """One memory per size: every d with every m (or m = a*d for every a of m_per_d)."""
        sizes = [(d, m) for d in self.d for m in (self.m or (None,))] if self.m_per_d is None else \
            [(d, round(a * d)) for d in self.d for a in self.m_per_d]
        return [MemoryConfig(kind=self.kind, d=d, m=m, embedding=self.embedding, steps=self.steps, lr=self.lr,
                             outputs_per_input=self.outputs_per_input, n_outputs=self.outputs) for d, m in sizes]

    def recorded(self) -> dict:
        """What every probe shares (settings.json); sizes and seeds are in the cell keys, so a
        sweep can grow. Fields added after the first sweeps are recorded only when set: those
        sweeps stay readable."""
        first = asdict(self.memories()[0])
        return {"analysis": "capacity memory", **{k: v for k, v in first.items() if k not in ("d", "m") and not (
            k in ("n_outputs", "eval_every") and v == getattr(MemoryConfig, k))}}


def memory_capacity(cfg: MemoryConfig, seed: int, device: str):
    """The search for N* of one memory size and seed (a job of analyses.sweeps.cells): the largest
    N stored at >= 99% (relative tolerance 5%)."""
    start = max(2, cfg.theory // (4 * max(1, round(math.log(cfg.theory)))))
    return search(bisection(start, lowest=2, rel_tol=0.05),
                  lambda n: Cell(f"{cfg.kind}_d{cfg.d}_m{cfg.m}_seed{seed}_N{n}", memory_row, (cfg, n, seed, device)),
                  lambda row: row["accuracy"] >= cfg.target_accuracy)


def memory_row(cfg: MemoryConfig, n: int, seed: int, device: str) -> dict:
    """One probe: `cfg` fitted to n associations with `seed` (device resolved where it runs)."""
    result = fit(cfg, n, [seed], resolve_device(device))
    return {"kind": cfg.kind, "d": cfg.d, "m": cfg.m, "seed": seed, "n": n,
            "accuracy": result["accuracy"][0], "steps_run": result["steps_run"]}


def search_memories(sweep: MemorySweep, cells: Cells, executor: ExecutorSettings, device: str,
                    progress: bool = True) -> list[dict]:
    """N* of every memory size and seed, one row each (the probes are recorded in `cells`)."""
    searches = [(cfg, seed) for cfg in sweep.memories() for seed in sweep.seeds]
    with open_executor(executor) as running:
        found = run_jobs([memory_capacity(cfg, seed, device) for cfg, seed in searches], cells, running,
                         desc="memory probes", progress=progress)
    return [{"kind": cfg.kind, "d": cfg.d, "m": cfg.m, "seed": seed, "n_star": n_star, "parameters": cfg.parameters,
             "theory": cfg.theory, "n_star_over_theory": n_star / cfg.theory}
            for (cfg, seed), n_star in zip(searches, found)]


@dataclass(frozen=True)
class AuthorsLine:
    """The reference line the paper draws through a capacity figure: N ln N = c x (or N = c x
    without the log factor), x = d^2 for a full linear memory and m*d otherwise."""
    law: str
    c: float
    log_factor: bool
    setting: str  # the memories the paper drew it for

    def value(self, n):
        """N ln N (or N) for N* = n."""
        n = np.asarray(n, float)
        return n * np.log(n) if self.log_factor else n

    def n_on_line(self, x):
        """N on the line at scale x: N ln N = c x solved by Newton's method."""
        target = self.c * np.asarray(x, float)
        if not self.log_factor:
            return target
        n = np.maximum(target / np.log(np.maximum(target, 3.0)), 1.0)
        for _ in range(30):  # n ln n is convex and increasing for n >= 1: monotone convergence
            n = n - (n * np.log(n) - target) / (np.log(n) + 1)
        return n


def authors_line(cfg: MemoryConfig) -> AuthorsLine | None:
    """The paper's reference line for this memory (Figure 1 and Figure 6), or None."""
    if cfg.kind == "linear" and cfg.m is None:
        return AuthorsLine("N ln N = d²/1.3", 1 / 1.3, True, "full linear memory, f(i) = i (Figure 1 left)")
    if cfg.kind == "mlp" and cfg.n_outputs is not None:
        return AuthorsLine("N = m·d/1.2", 1 / 1.2, False, "MLP memory, M = 32 outputs (Figure 6)")
    if cfg.kind == "mlp" and cfg.outputs_per_input == 1:
        return AuthorsLine("N ln N = m·d/0.35", 1 / 0.35, True, "MLP memory, f(i) = i (Figure 1 right)")
    return None


def _memory_means(table: pd.DataFrame) -> pd.DataFrame:
    """Per size: the scale x, N* mean and std over seeds."""
    means = table.groupby(["d", "m"], dropna=False).agg(x=("x", "first"), n_star=("n_star", "mean"),
                                                        n_star_std=("n_star", "std"), theory=("theory", "first"))
    return means.reset_index()


def _is_full(cfg: MemoryConfig) -> bool:
    return cfg.kind == "linear" and cfg.m is None


def memory_tables(rows: list[dict] | pd.DataFrame, cfg: MemoryConfig, probes: pd.DataFrame, extra: dict) -> Capacity:
    """From one row per (size, seed) with its N*: the capacity table and the summary. The plain
    slope of log N* against log d (full linear) or log m*d, and the authors' law: the slope of
    log(N* ln N*) against the same (2 and 1 when the law holds) and N* against the paper's
    line at every size. `extra` is added to the summary."""
    full = _is_full(cfg)
    table = pd.DataFrame(rows)
    table = table.assign(x=table["d"] if full else table["m"] * table["d"])  # the scale: d (full linear), else m*d
    x_name, theory_slope = ("d", 2.0) if full else ("m*d", 1.0)
    means = _memory_means(table)
    fit = fit_log_log(means["x"], means["n_star"])  # undetermined with two sizes or fewer
    line = authors_line(cfg)
    sizes = []
    for r in means.itertuples():
        size = {"d": int(r.d), "m": None if pd.isna(r.m) else int(r.m), "x": int(r.x),
                "n_star_mean": float(r.n_star),
                "n_star_std": float(r.n_star_std) if r.n_star_std == r.n_star_std else None,
                "n_star_over_theory": float(r.n_star / r.theory)}
        if line is not None:
            n_line = float(line.n_on_line(r.theory))
            size.update(n_line=n_line, n_star_over_line=float(r.n_star / n_line))
        sizes.append(size)
    summary = {"kind": cfg.kind, "x": x_name, "fitted_slope": fit.get("slope"), "fit": fit.to_json(),
               "theory_slope": theory_slope, "authors_line": None, "sizes": sizes, **extra}
    if line is not None:
        law = fit_log_log(means["x"], line.value(means["n_star"]))
        summary["authors_line"] = {"law": line.law, "setting": line.setting,
                                   "fitted_slope": law.get("slope"), "fit": law.to_json(), "theory_slope": theory_slope,
                                   "fitted_slope_of": ("log(N* ln N*)" if line.log_factor else "log N*")
                                   + f" against log {x_name}"}
    return Capacity(table, probes, summary)


def _memory_title(cfg: MemoryConfig) -> str:
    kind = cfg.kind + " memory" + ("" if _is_full(cfg) else (" (rank m)" if cfg.kind == "linear" else " (width m)"))
    return kind + (f", M = {cfg.n_outputs} outputs" if cfg.n_outputs is not None else "")


def write_memory(result: Capacity, cfg: MemoryConfig, out: Path) -> None:
    """probes.csv, capacity.csv, summary.json and capacity_{kind}.png in `out`."""
    write_csv(out / "probes.csv", result.probes)
    write_csv(out / "capacity.csv", result.table)
    write_summary(out / "summary.json", result.summary)
    full = _is_full(cfg)
    memory_figure(_memory_means(result.table), result.table, full, result.summary["fitted_slope"],
                     authors_line(cfg), _memory_title(cfg), out / f"capacity_{cfg.kind}.png")


def memory_text(result: Capacity, cfg: MemoryConfig) -> str:
    """The fitted slopes and N* at every size, as the CLI prints them."""
    s, full, line = result.summary, _is_full(cfg), authors_line(cfg)
    lines = [f"{_memory_title(cfg)}: fitted slope of log N* against log {s['x']}: "
             f"{Fit.from_json(s['fit'], LINE).show('slope')}; theory {s['theory_slope']:.0f}, up to a log factor"]
    if line is not None:
        a = s["authors_line"]
        lines.append(f"  the paper's line {line.law}: slope of {a['fitted_slope_of']}: "
                     f"{Fit.from_json(a['fit'], LINE).show('slope')}; the law: {s['theory_slope']:.0f}")
    for size in s["sizes"]:
        m = "" if size["m"] is None else f"m={size['m']}  "  # a full linear memory has no m
        text = (f"  d={size['d']:<4} {m}N*={size['n_star_mean']:.1f}  "
                f"N*/{'d^2' if full else 'md'}={size['n_star_over_theory']:.3f}")
        if line is not None:
            text += f"  line N={size['n_line']:.1f}  N*/line={size['n_star_over_line']:.2f}"
        lines.append(text)
    return "\n".join(lines)


def memory_report(rows: list[dict] | pd.DataFrame, cfg: MemoryConfig, out: Path, probes: pd.DataFrame,
                  extra: dict) -> dict:
    """memory_tables -> write_memory -> print memory_text, for N* found elsewhere (one row per
    size and seed, e.g. scripts/linear_memory_authors_recipe.py); the summary."""
    result = memory_tables(rows, cfg, probes, extra)
    write_memory(result, cfg, out)
    print(memory_text(result, cfg))
    return result.summary
