"""The capacity figures: N* of the memories, facts stored by the transformers."""
from __future__ import annotations

import math

import numpy as np

from analyses.capacity.common import PAPER_FACTS_WINDOW
from analyses.sweeps.output import save_figure, subplots


def memory_figure(means, table, full, slope, line, title, path=None):
    """Left, as the paper plots it: N* against d^2 (full linear) or m*d, with the fit, the
    theory lines and the paper's line. Right: N* over the paper's line (over d^2 or m*d
    when there is none) at every size."""
    import matplotlib.ticker

    scale_name = "d²" if full else "m·d"  # the `theory` column: the paper's x axis
    fig, (ax, right) = subplots(1, 2, figsize=(10, 4))
    groups, label = [(None, means)], "mean over seeds".format
    if not full and means["m"].nunique() > 1:  # one series per m/d on a grid of d x (m/d), else per m
        ratio = means["m"] / means["d"]
        by_ratio = ratio.groupby(means["d"]).apply(frozenset).nunique() == 1
        groups = means.groupby(ratio if by_ratio else means["m"])
        label = "m = {:g}·d".format if by_ratio else "m = {:g}".format
    ax.scatter(table["theory"], table["n_star"], s=10, alpha=0.4, color="gray", label="one seed")
    for k, (key, g) in enumerate(groups):
        ax.errorbar(g["theory"], g["n_star"], yerr=g["n_star_std"].fillna(0), fmt="o", color=f"C{k}", label=label(key))
        reference = line.n_on_line(g["theory"]) if line is not None else g["theory"]
        right.plot(g["x"], g["n_star"] / reference, "o-", color=f"C{k}", label=label(key))
    x = np.geomspace(means["theory"].min(), means["theory"].max(), 50)
    anchor_x, anchor_y = np.exp(np.log(means["theory"]).mean()), np.exp(np.log(means["n_star"]).mean())
    per_scale = 2.0 if full else 1.0  # x = d (full linear) is the square root of the plotted scale d^2
    if slope is not None and not math.isnan(slope):  # None: an undetermined fit (two sizes or fewer)
        ax.plot(x, anchor_y * (x / anchor_x) ** (slope / per_scale), "C0-", lw=1,
                label=f"fit: N* ∝ {'d' if full else 'm·d'}^{slope:.2f}")
    ax.plot(x, anchor_y * x / anchor_x, "k--", lw=1, label=f"theory ∝ {scale_name}")
    if full:
        ax.plot(x, anchor_y * (x / anchor_x) * np.log(anchor_x) / np.log(x), "k:", lw=1, label="theory ∝ d² / log d²")
    if line is not None:
        ax.plot(x, line.n_on_line(x), "r-.", lw=1.5, label=f"paper: {line.law}")
    ax.set(xscale="log", yscale="log", xlabel=scale_name, ylabel="associations stored N*", title=title)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    right.axhline(1.0, color="r" if line is not None else "k", ls="-." if line is not None else "--", lw=1)
    right.set(xscale="log", xlabel="d" if full else "m·d",
              ylabel=f"N* / N on the paper's line ({line.law})" if line is not None else f"N* / {scale_name}",
              title="against the paper's line" if line is not None else f"N* / {scale_name}")
    right.set_xticks(sorted(means["x"].unique()))
    right.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    right.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if len(groups) > 1:
        right.legend(fontsize=7)
    return save_figure(fig, path)


def facts_figure(table, slope, sweep, path=None):
    """Facts stored against parameters, one series per shape, with the fit, the paper's line
    (the TransformerSweep `sweep`'s facts per parameter) and the information bound."""
    import matplotlib.ticker

    fig, ax = subplots(figsize=(5.5, 4.5))
    for k, (shape, g) in enumerate(table.groupby("shape", sort=False)):
        ax.plot(g["parameters"], g["facts"], "o-", color=f"C{k}", label=f"(α, β, H) = ({shape})")
    # a factor of 2 either side: the lines show even over a single model size (one --d, one shape)
    x = np.geomspace(table["parameters"].min() / 2, table["parameters"].max() * 2, 50)
    ok = table[table["facts"] > 0]
    anchor_x, anchor_y = np.exp(np.log(ok["parameters"]).mean()), np.exp(np.log(ok["facts"]).mean())
    if slope is not None and not math.isnan(slope):
        ax.plot(x, anchor_y * (x / anchor_x) ** slope, "k-", lw=1, label=f"fit: slope {slope:.2f}")
    ax.plot(x, sweep.facts_per_parameter * x, "r--", lw=1.2,
            label=f"paper: {sweep.facts_per_parameter:g} facts per parameter")
    bits = sweep.bits_per_parameter
    ax.plot(x, bits * x / math.log2(sweep.answers), "r-.", lw=0.8, alpha=0.6,
            label=f"information bound at {bits:g} bits/parameter")
    ax.axhspan(*PAPER_FACTS_WINDOW, color="0.9", zorder=0, label="facts range the paper shows")
    ax.set(xscale="log", yscale="log", xlabel="parameters (4·H·d_h·d + 2·m·d)", ylabel="facts stored (S·R)",
           title="Facts stored against parameters")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    return save_figure(fig, path)
