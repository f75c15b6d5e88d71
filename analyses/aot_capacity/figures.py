"""capacity.png (one panel per sweep) and head_roles.png."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analyses.aot_capacity.sweep import AotSweep
from analyses.sweeps.output import save_figure, subplots
from tasks.association import AssociationTask

LAYOUT_STYLE = {"standard": ("C0", "o"), "dana": ("C1", "^")}


def figure(capacity: pd.DataFrame, fits: dict, task: AssociationTask, settings: AotSweep, path: Path | None = None):
    """One panel per sweep (the paper's Figures 1a, 1b, 2a, 3 and, with --equal-dims, 2b),
    every head layout in its own colour, the lower bound of Corollary 2 dashed red."""
    fig, axes = subplots(2, 3, figsize=(16, 8.5))
    chance = 1 / task.n_tokens
    panels = [("heads", "n_heads", f"H (d_h = {settings.d_head}, d = {settings.d_model})", axes[0, 0]),
              ("d_head", "d_head", f"d_h (H = {settings.fixed_heads}, d = {settings.d_model})", axes[0, 1]),
              ("d_model", "d_model", f"d (H = {settings.fixed_heads}, d_h = {settings.d_head})", axes[0, 2])]
    for sweep, x, label, ax in panels:
        if capacity.loc[capacity.sweep == sweep, x].nunique() < 2:  # a single point is no sweep
            ax.set_visible(False)
            continue
        for layout, f in fits.items():
            rows = capacity[(capacity.sweep == sweep) & (capacity.head_layout == layout)].sort_values(x)
            color, marker = LAYOUT_STYLE[layout]
            ax.errorbar(rows[x], rows.accuracy, yerr=rows.accuracy_std.fillna(0), fmt=marker, color=color,
                        label=f"{layout} layout (mean over seeds)")
            grid = np.linspace(rows[x].min(), rows[x].max(), 100)
            if sweep == "heads" and "fit_H_r2" in f:  # a determined fit only
                ax.plot(grid, f["fit_H"]["intercept"] + f["fit_H"]["slope"] * grid, color=color, lw=1,
                        label=f"linear fit, {f['fit_H']['slope']:.4f}/head, R$^2$ = {f['fit_H']['r2']:.3f}")
            if sweep == "d_head" and "fit_dh_exponent" in f:
                g = f["fit_dh"]
                ax.plot(grid, g["intercept"] + g["coefficient"] * grid ** g["exponent"], color=color, lw=1,
                        label=f"fit a + b d_h^k, k = {g['exponent']:.2f}")
        rows = capacity[capacity.sweep == sweep].drop_duplicates(x).sort_values(x)
        ax.plot(rows[x], rows.lower_bound, "s--", color="C3", ms=4, label="lower bound (Corollary 2)")
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance 1/N")
        ax.set(xlabel=label, ylabel="accuracy (share of T_0 associations)")
        ax.legend(fontsize=7)
    ax = axes[1, 0]
    for layout in fits:
        color, marker = LAYOUT_STYLE[layout]
        for kind, style in (("attention-only", "-"), ("one head + MLP", ":")):
            rows = capacity[(capacity.head_layout == layout) & (capacity.model_type == kind)
                            & capacity.sweep.isin(["heads", "mlp"])]
            rows = rows.drop_duplicates("parameters").sort_values("parameters")
            if not rows.empty:
                ax.errorbar(rows.parameters, rows.accuracy, yerr=rows.accuracy_std.fillna(0), fmt=marker + style,
                            color=color, mfc="none" if kind != "attention-only" else color, label=f"{layout}: {kind}")
    ax.axhline(chance, color="grey", lw=0.8, ls=":")
    ax.set(xlabel=f"trainable parameters (d = {settings.d_model}, d_h = {settings.d_head})", ylabel="accuracy")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    for layout, f in fits.items():
        if "d_equal_slopes" in f:
            color, marker = LAYOUT_STYLE[layout]
            slopes = pd.DataFrame(f["d_equal_slopes"]).dropna()  # undetermined slopes (two points) left out
            label = f"{layout} layout" + (f", slope ~ d^{f['fit_d_equal_exponent']:.2f}"
                                          if "fit_d_equal_exponent" in f else "")
            ax.plot(slopes.d, slopes.slope, marker + "-", color=color, label=label)
    if ax.lines:
        ax.set(xlabel="d = d_h", ylabel="accuracy per head (slope before saturation)", yscale="log", xscale="log")
        ax.legend(fontsize=7)
    else:
        ax.set_visible(False)
    axes[1, 2].set_visible(False)
    fig.suptitle(f"Memorisation by one-layer attention-only transformers: {task}", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


def roles_figure(heads: pd.DataFrame, table: pd.DataFrame | None, path: Path | None = None):
    fig, axes = subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    ax = axes[0]
    points = ax.scatter(heads.mass_pos0, heads.token_dependence, c=heads.accuracy_drop, cmap="viridis", s=14)
    fig.colorbar(points, ax=ax, label="accuracy drop when mean-ablated")
    ax.set(xlabel="mean attention on position 0", ylabel="token dependence (0 = position head)",
           title="Every head of the heads sweep")
    if table is not None:
        image = axes[1].imshow(table.to_numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
        axes[1].set(xlabel="token at position 0", ylabel="head",
                    title=f"Largest model ({table.shape[0]} heads): attention on position 0 by its token")
        fig.colorbar(image, ax=axes[1], label="attention mass")
    fig.tight_layout()
    return save_figure(fig, path)
