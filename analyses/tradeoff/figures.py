"""The trade-off figures: the grid's heat maps, where the swap's facts go, the shrink's
survival curves."""
from __future__ import annotations

from dataclasses import asdict

import numpy as np

from analyses.sweeps.output import save_figure, subplots
from analyses.tradeoff.common import accuracy_column
from models.recall.config import RunConfig
from probe.storage import LABELS

PAPER_GRID = {"n_subjects": 32, "n_relations": 32, "answers_per_relation": 8, "d_model": 32, "d_head": 8}
# The authors' figure counts d d_h H attention and d m MLP parameters, a quarter and a half of the
# paper's 4 H d_h d and 2 m d used here: their floor of 1280 and frontier d m = 2300 - d d_h H / 2
# are, in these counts, 5120 attention parameters and MLP = 4600 - attention / 4.
PAPER_FLOOR = 4 * 1280  # attention parameters (H = 5) below which the authors' grid fails
PAPER_LINE = 2 * 2300  # the authors' frontier: MLP parameters = PAPER_LINE - attention parameters / 4


def paper_grid(task: dict, model: dict) -> bool:
    """Whether a grid is the paper's Figure 4 right grid (task and model settings as dicts)."""
    return all(task.get(k) == v or model.get(k) == v for k, v in PAPER_GRID.items())


def grid_figure(table, frontier, path=None, run: RunConfig | None = None):
    """Heat maps over the grid (accuracy; shares of facts in attention, in the MLP, and
    distributed: recalled only by the two paths together), two by two, H and m labelled with
    the attention (4 H d_h d) and MLP (2 m d) parameters, the measured 99% frontier with the
    values of its cells written in them (every value is in grid.csv), and, on the paper's Figure 4
    right grid, the authors' frontier and floor; the legend below the panels."""

    score = accuracy_column(table)
    panels = [(score, f"held-out accuracy ({'best over the run' if score == 'best_accuracy' else 'final'})",
               "viridis"), ("share_attention", "share of facts in attention", "Blues"),
              ("share_mlp", "share of facts in the MLP", "Oranges"),
              ("share_distributed", "share of facts distributed", "Greens")]
    paper = run is not None and paper_grid(asdict(run.task), asdict(run.model))
    fig, axes = panel_grid()
    for ax, (col, title, cmap) in zip(axes, panels):
        image = heat_map(ax, table, col, cmap, (0, 1), numbers=frontier_cells(frontier))
        frontier_line(ax, table, frontier, "r.-", "measured 99% frontier (smallest m; its values written)")
        if paper:
            paper_lines(ax, table)
        ax.set_title(title)
        fig.colorbar(image, ax=ax)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return save_figure(fig, path)


def panel_grid():
    """A figure of four heat-map panels, two by two (each wide enough to read at screen
    width), with room below them for the legend; the figure and its four axes."""
    fig, axes = subplots(2, 2, figsize=(11, 9.5))
    fig.set_layout_engine("constrained")
    return fig, axes.ravel()


def frontier_cells(frontier: dict) -> set[tuple[int, int]]:
    """The cells (H, m) of a 99% frontier ({H: smallest m, or None})."""
    return {(h, m) for h, m in frontier.items() if m is not None}


def _axes_of(table):
    """The grid's H and m (sorted), and their parameters as grid.csv counts them: 4 H d_h d and 2 m d."""
    heads, widths = sorted(table["heads"].unique()), sorted(table["width"].unique())
    attention = {h: int(table.loc[table["heads"] == h, "attention_parameters"].iloc[0]) for h in heads}
    mlp = {m: int(table.loc[table["width"] == m, "mlp_parameters"].iloc[0]) for m in widths}
    return heads, widths, attention, mlp


def heat_map(ax, table, column, cmap, limits, numbers=frozenset()):
    """One column of a grid table as an H x m heat map: the colour carries the value; the
    value is written only in the cells (H, m) of `numbers` (on a light box, readable over any
    colour and line). The axes are labelled with H, m and their parameters."""
    heads, widths, attention, mlp = _axes_of(table)
    grid = table.pivot(index="heads", columns="width", values=column).reindex(index=heads, columns=widths)
    image = ax.imshow(grid.to_numpy(float), origin="lower", cmap=cmap, vmin=limits[0], vmax=limits[1],
                      aspect="auto")
    for h, m in sorted(numbers):
        value = grid.loc[h, m] if h in grid.index and m in grid.columns else np.nan
        if np.isnan(value):  # a cell not recorded (yet)
            continue
        text = f"{value:.2f}" if round(value, 2) != 0 else "0.00"  # not -0.00
        ax.text(widths.index(m), heads.index(h), text, ha="center", va="center", fontsize=7,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
    ax.set_xticks(range(len(widths)), [f"{m} ({mlp[m]})" for m in widths], fontsize=7,
                  rotation=90 if len(widths) > 6 else 0)
    ax.set_yticks(range(len(heads)), [f"{h} ({attention[h]})" for h in heads], fontsize=7)
    ax.set(xlabel="MLP width m (MLP parameters 2 m d)", ylabel="heads H (attention parameters 4 H d_h d)")
    return image


def frontier_line(ax, table, frontier, style, label):
    """A 99% frontier ({H: smallest m, or None}) drawn over the grid's heat map."""
    heads, widths, _, _ = _axes_of(table)
    xs = [widths.index(frontier[h]) if frontier.get(h) is not None else np.nan for h in heads]
    ax.plot(xs, range(len(heads)), style, lw=1.5, label=label)


def paper_lines(ax, table):
    """The authors' floor and frontier, in grid coordinates (piecewise linear between cells)."""
    heads, widths, attention, mlp = _axes_of(table)
    floor = np.interp(PAPER_FLOOR, [attention[h] for h in heads], range(len(heads)))
    ax.axhline(floor, color="k", ls=":", lw=1.2, label=f"authors' floor: {PAPER_FLOOR} attention parameters")
    rows = np.linspace(0, len(heads) - 1, 200)
    at = np.interp(rows, range(len(heads)), [attention[h] for h in heads])
    cols = np.interp(PAPER_LINE - at / 4, [mlp[m] for m in widths], range(len(widths)), left=np.nan, right=np.nan)
    ax.plot(cols, rows, "k--", lw=1.2, label=f"authors' frontier: MLP = {PAPER_LINE} - attention / 4")


def stacked_shares(table, path=None):
    """The swap: each variant's facts stacked by storage label."""

    from analyses.plots import COLORS

    fig, ax = subplots(figsize=(5, 3.5))
    bottom = np.zeros(len(table))
    for label in LABELS:
        values = table[f"share_{label}"].to_numpy(float)
        ax.bar(table["variant"], values, bottom=bottom, color=COLORS[label], label=label)
        bottom += values
    ax.set(ylabel="share of facts", title="Where the facts go")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    return save_figure(fig, path)


def shrink_figure(curves, path=None):
    """The shrink: the share of each store's facts still recalled as MLP neurons, then heads, go."""

    from analyses.plots import COLORS

    fig, axes = subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, (component, title) in zip(axes, (("mlp", "pruning MLP neurons (smallest norm first)"),
                                             ("heads", "pruning heads (smallest OV norm first)"))):
        part = curves[(curves["component"] == component) | ((curves["component"] == "mlp") & (curves["removed"] == 0))]
        for label, g in part.groupby("store_before"):
            g = g.sort_values("fraction")
            ax.plot(g["fraction"], g["surviving_share"], "o-", color=COLORS[label], label=f"stored in {label}")
        ax.set(xlabel="fraction removed", title=title, ylim=(-0.02, 1.02))
    axes[0].set_ylabel("share of facts still recalled")
    axes[1].legend(fontsize=7)
    return save_figure(fig, path)
