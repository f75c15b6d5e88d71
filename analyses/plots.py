"""Figures of the locate_facts measurements (PNG, matplotlib's Agg backend)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analyses.output import save_figure  # noqa: E402
from probe.storage import LABELS  # noqa: E402

COLORS = {"attention": "#4C72B0", "mlp": "#DD8452", "both": "#8172B3", "distributed": "#55A868", "not_stored": "#C7C7C7"}


def labels_per_relation(facts: pd.DataFrame, path: Path) -> None:
    """Stacked bars: per relation, how many of its facts carry each storage label."""
    counts = facts.groupby(["relation", "label"]).size().unstack(fill_value=0).reindex(columns=LABELS, fill_value=0)
    fig, ax = plt.subplots(figsize=(max(5, 0.3 * len(counts) + 2), 3.5))
    bottom = pd.Series(0, index=counts.index)
    for label in LABELS:
        ax.bar(counts.index, counts[label], bottom=bottom, color=COLORS[label], label=label, width=0.8)
        bottom += counts[label]
    ax.set(xlabel="relation", ylabel="facts", title="Where each relation's facts are stored")
    ax.legend(fontsize=8, ncol=len(LABELS), loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    save_figure(fig, path)


def head_token_heatmap(table: pd.DataFrame, path: Path) -> None:
    """Head x token heat map of the EOS query's attention on each subject and relation."""
    fig, ax = plt.subplots(figsize=(max(5, 0.18 * table.shape[1] + 2), max(2.5, 0.35 * table.shape[0] + 1.5)))
    image = ax.imshow(table.to_numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
    step = max(1, table.shape[1] // 40)
    ax.set_xticks(range(0, table.shape[1], step), table.columns[::step], rotation=90, fontsize=7)
    ax.set_yticks(range(table.shape[0]), [f"head {h}" for h in table.index], fontsize=8)
    ax.set_title("Attention of the EOS query on the subject / relation token")
    fig.colorbar(image, ax=ax, label="attention mass")
    save_figure(fig, path)


def margin_scatter(facts: pd.DataFrame, path: Path) -> None:
    """Per fact, the logit margin written by attention against the one written by the MLP."""
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for label in LABELS:
        rows = facts[facts["label"] == label]
        if len(rows):
            ax.scatter(rows["attention_margin"], rows["mlp_margin"], s=12, alpha=0.7, color=COLORS[label], label=label)
    ax.axhline(0, color="k", lw=0.5)
    ax.axvline(0, color="k", lw=0.5)
    ax.set(xlabel="attention margin (logits)", ylabel="MLP margin (logits)",
           title="Who writes each fact's answer")
    ax.legend(fontsize=8)
    save_figure(fig, path)
