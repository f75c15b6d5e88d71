"""The Zipf figures: the error against n or d on log-log axes with the talk's laws and the
fitted slopes, the q(z) each memory holds, and the error and loss over gradient steps."""
from __future__ import annotations

import numpy as np

from analyses.capacity.zipf.fits import infinite_memory_error
from analyses.capacity.zipf.memory import zipf_law
from analyses.sweeps.output import save_figure, subplots


def error_figure(errors, fits, axis: str, tokens: int, path=None):
    """One panel per α: the mean error over seeds against n (at the largest d) or d (at the
    largest n), its range over seeds shaded, each scheme's theory line through its middle
    point (dashed; none where α <= 1) with the fitted exponent in the legend; against n also
    the infinite-memory error Σ p(z)(1 - p(z))^n (grey)."""
    other = "d" if axis == "n" else "n"
    alphas = list(dict.fromkeys(errors["alpha"]))
    fig, axes = subplots(1, len(alphas), figsize=(4.2 * len(alphas), 3.6), squeeze=False)
    at = errors[other].max()
    for ax, alpha in zip(axes[0], alphas):
        shown = errors[(errors["alpha"] == alpha) & (errors[other] == at)]
        for k, (scheme, g) in enumerate(shown.groupby("scheme", sort=False)):
            stats = g.groupby(axis)["error"].agg(["mean", "min", "max"])
            x, mean = stats.index.to_numpy(float), stats["mean"].to_numpy()
            fit = fits[(fits["alpha"] == alpha) & (fits["scheme"] == scheme) & (fits["axis"] == axis)
                       & (fits["at"] == f"{other}={at:g}")]
            label = scheme + (f": {fit['text'].iloc[0]}" if len(fit) else "")
            ax.plot(x, np.where(mean > 0, mean, np.nan), "o-", color=f"C{k}", ms=3, label=label)
            ax.fill_between(x, np.where(stats["min"] > 0, stats["min"], np.nan), stats["max"], color=f"C{k}",
                            alpha=0.15)
            law = fit["theory"].iloc[0] if len(fit) else None
            if axis == "d" and law is not None and law == law and (mean > 0).any():
                _law_line(ax, x, mean, law, f"C{k}", f"theory d^{law:.2f}")
        if axis == "n":
            x = np.geomspace(shown["n"].min(), shown["n"].max(), 40)
            ideal = infinite_memory_error(zipf_law(alpha, tokens).numpy(), x)
            ax.plot(x, ideal, ":", color="0.4", lw=1.2, label="infinite memory Σp(1-p)^n")
            if alpha > 1:
                _law_line(ax, x, ideal, -(alpha - 1) / alpha, "k", f"theory n^{-(alpha - 1) / alpha:.2f}")
        title = f"α = {alpha:g}, {other} = {'∞' if at == np.inf else f'{at:g}'}"
        ax.set(xscale="log", yscale="log" if (shown["error"] > 0).any() else "linear", xlabel=axis,
               title=title + ("" if alpha > 1 else "\n(α ≤ 1: no law drawn)"))
        ax.legend(fontsize=6)
    axes[0, 0].set_ylabel("error L (exact)")
    return save_figure(fig, path)


def _law_line(ax, x, y, slope: float, color: str, label: str) -> None:
    """A dashed line of `slope` through the middle point of the curve y(x) where it is > 0 (none
    where it is 0 throughout: a single token, or p(z) underflowing beyond the first)."""
    positive = np.flatnonzero(y > 0)
    if not len(positive):
        return
    i = int(positive[len(positive) // 2])
    ax.plot(x, y[i] * (x / x[i]) ** slope, "--", color=color, lw=1, label=label)


def profile_figure(profiles, path=None):
    """q(z) / max q against z (mean over seeds) for each memory, one panel per α: counts and
    one gradient step follow p(z) ∝ z^-α, seen-once is flat."""
    alphas = list(dict.fromkeys(profiles["alpha"]))
    fig, axes = subplots(1, len(alphas), figsize=(4.2 * len(alphas), 3.6), squeeze=False)
    for ax, alpha in zip(axes[0], alphas):
        shown = profiles[(profiles["alpha"] == alpha) & (profiles["d"] == profiles["d"].max())]
        for k, (scheme, g) in enumerate(shown.groupby("scheme", sort=False)):
            ax.plot(g["z"], g["q"].where(g["q"] > 0), ".-", color=f"C{k}", ms=2, lw=0.8, label=scheme)
        z = np.arange(1, shown["z"].max() + 1)
        ax.plot(z, z ** -alpha, "k--", lw=0.8, label="p(z)/p(1)")
        ax.set(xscale="log", yscale="log", xlabel="token z (by frequency)",
               title=f"α = {alpha:g}, d = {shown['d'].max()}")
        ax.legend(fontsize=6)
    axes[0, 0].set_ylabel("q(z) the memory holds / max q (mean over seeds)")
    return save_figure(fig, path)


def steps_figure(curves, by: str, path=None):
    """The error (left) and the loss (right) over steps, one line per step size, one panel
    row per value of `by` (the correlation)."""
    values = list(dict.fromkeys(curves[by]))
    fig, axes = subplots(len(values), 2, figsize=(9, 2.4 * len(values)), squeeze=False)
    fig.set_layout_engine("constrained")
    for row, value in zip(axes, values):
        for k, (lr, g) in enumerate(curves[curves[by] == value].groupby("step_size")):
            row[0].plot(g["step"], g["error"], color=f"C{k}", lw=1, label=f"η = {lr:g}")
            row[1].plot(g["step"], g["loss"], color=f"C{k}", lw=1)
        row[0].set(ylabel="error L (exact)", title=f"{by} = {value:g}: error")
        row[1].set(ylabel="cross-entropy", title=f"{by} = {value:g}: loss")
        row[0].legend(fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("step t")
    return save_figure(fig, path)


def overoptimisation_figure(curves, rows, table, path=None):
    """Per N: the mean error over seeds against steps with the smallest error any W reaches
    (left), the error of seeds whose error rose after its best (middle), the mean loss (right)."""
    fig, axes = subplots(len(rows), 3, figsize=(12, 2.6 * len(rows)), squeeze=False)
    fig.set_layout_engine("constrained")
    for row, r in zip(axes, rows):
        g = curves[curves["tokens"] == r["tokens"]]
        for k, (lr, h) in enumerate(g.groupby("step_size")):
            row[0].plot(h["step"], h["error"], color=f"C{k}", lw=1, label=f"η = {lr:g}, mean over seeds")
            row[2].plot(h["step"], h["loss"], color=f"C{k}", lw=1)
            for curve in r["rose"][k]:
                row[1].plot(np.array(r["curve_steps"]) + 1, curve, color=f"C{k}", lw=0.8, alpha=0.7)
        row[0].axhline(np.mean(r["best_possible"]), color="k", ls=":", lw=1, label="smallest error of any W")
        shares = table[table["tokens"] == r["tokens"]]["rose_share"]
        row[0].set(ylabel="error L (exact)", title=f"N = {r['tokens']}: error")
        row[1].set(title=f"seeds whose error rose after its best ({', '.join(f'{s:.0%}' for s in shares)})")
        row[2].set(ylabel="cross-entropy", title=f"N = {r['tokens']}: loss")
        row[0].legend(fontsize=6)
        for ax in row:
            ax.set_xscale("log")
    for ax in axes[-1]:
        ax.set_xlabel("step t + 1")
    return save_figure(fig, path)
