"""Figures of the locate_facts and hallucination measurements, drawn without pyplot: each
returns its matplotlib Figure (a notebook shows it) and writes it as PNG when given a path."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.sweeps.output import save_figure, subplots
from probe import columns
from probe.storage import LABELS

COLORS = {"attention": "#4C72B0", "mlp": "#DD8452", "both": "#8172B3", "distributed": "#55A868",
          "not_stored": "#C7C7C7"}


def labels_per_relation(facts: pd.DataFrame, path: Path | None = None):
    """Stacked bars: per relation, how many of its facts carry each storage label."""
    counts = (facts.groupby([columns.RELATION, columns.LABEL]).size().unstack(fill_value=0)
              .reindex(columns=LABELS, fill_value=0))
    fig, ax = subplots(figsize=(max(5, 0.3 * len(counts) + 2), 3.5))
    bottom = pd.Series(0, index=counts.index)
    for label in LABELS:
        ax.bar(counts.index, counts[label], bottom=bottom, color=COLORS[label], label=label, width=0.8)
        bottom += counts[label]
    ax.set_xticks(counts.index, [f"R{r}" for r in counts.index], fontsize=8 if len(counts) <= 32 else 6)
    ax.set(xlabel="relation", ylabel="facts", title="Where each relation's facts are stored")
    ax.legend(fontsize=8, ncol=len(LABELS), loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    return save_figure(fig, path)


def head_token_heatmap(table: pd.DataFrame, path: Path | None = None):
    """Head x token heat map of the EOS query's attention on each subject and relation."""
    fig, ax = subplots(figsize=(max(5, 0.18 * table.shape[1] + 2), max(2.5, 0.35 * table.shape[0] + 1.5)))
    image = ax.imshow(table.to_numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
    step = max(1, table.shape[1] // 40)
    ax.set_xticks(range(0, table.shape[1], step), table.columns[::step], rotation=90, fontsize=7)
    ax.set_yticks(range(table.shape[0]), [f"head {h}" for h in table.index], fontsize=8)
    ax.set_title("Attention of the EOS query on the subject / relation token")
    fig.colorbar(image, ax=ax, label="attention mass")
    return save_figure(fig, path)


def margin_scatter(facts: pd.DataFrame, path: Path | None = None):
    """Per fact, the logit margin written by attention against the one written by the MLP."""
    fig, ax = subplots(figsize=(5, 4.5))
    for label in LABELS:
        rows = facts[facts[columns.LABEL] == label]
        if len(rows):
            ax.scatter(rows[columns.margin("attention")], rows[columns.margin("mlp")], s=12, alpha=0.7,
                       color=COLORS[label], label=label)
    ax.axhline(0, color="k", lw=0.5)
    ax.axvline(0, color="k", lw=0.5)
    ax.set(xlabel="attention margin (logits)", ylabel="MLP margin (logits)",
           title="Who writes each fact's answer")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _shade_phase(ax, summary: dict) -> None:
    phase = summary["phase"]
    if phase:
        ax.axvspan(phase["start_step"], phase["end_step"], color="#F2C14E", alpha=0.25, label="hallucination phase")


def _step_axis(ax) -> None:
    """The step on a log axis that still shows step 0: symmetric log, linear from 0 to 1."""
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=0)
    ax.set_xlabel("training step (log; linear from 0 to 1, so the step-0 snapshot shows)")


def hallucination_curves(metrics: pd.DataFrame, summary: dict, path: Path | None = None):
    """Figure 5 of the paper: loss, relation-only and subject-only loss against the step (log
    axis, step 0 included), the relation-only level log D drawn and the hallucination phase shaded."""
    fig, ax = subplots(figsize=(6, 3.8))
    for column, label, color in (("loss", "loss", "black"), ("relation_only_loss", "relation-only loss", "#4C72B0"),
                                 ("subject_only_loss", "subject-only loss", "#DD8452")):
        ax.plot(metrics["step"], metrics[column], label=label, color=color, lw=1.8)
    ax.axhline(summary["log_D"], color="gray", ls="--", lw=1, label=f"log D = {summary['log_D']:.2f}")
    if abs(summary["conditional_entropy"] - summary["log_D"]) > 1e-6:
        ax.axhline(summary["conditional_entropy"], color="gray", ls=":", lw=1, label="H(a | r)")
    _shade_phase(ax, summary)
    _step_axis(ax)
    ax.set(ylabel="nats", ylim=(0, None),
           title="Sequential learning: " + ("a hallucination phase" if summary["phase"] else "no hallucination phase"))
    ax.legend(fontsize=8, frameon=False)
    return save_figure(fig, path)


def storage_over_time(metrics: pd.DataFrame, summary: dict, path: Path | None = None):
    """Shares of facts recalled by the attention path and by the MLP path alone, and the
    accuracy and hallucination rate, against the step (log axis, step 0 included), the phase shaded."""
    fig, ax = subplots(figsize=(6, 3.8))
    ax.plot(metrics["step"], metrics["accuracy"], color="black", lw=1.5, label="accuracy")
    ax.plot(metrics["step"], metrics["hallucination_rate"], color="#C44E52", lw=1.5, label="hallucination rate")
    for name in ("attention", "mlp"):
        column = f"{name}_recall_share"
        if column in metrics and metrics[column].notna().any():
            points = metrics.dropna(subset=[column])
            ax.plot(points["step"], points[column], "o-", color=COLORS[name],
                    label=f"facts recalled by the {name} path")
    _shade_phase(ax, summary)
    _step_axis(ax)
    ax.set(ylabel="share", ylim=(-0.02, 1.02), title="Where the facts go over training")
    ax.legend(fontsize=8, frameon=False)
    return save_figure(fig, path)
