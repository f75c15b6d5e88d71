"""The figures of `python -m analyses.induction`; each returns its matplotlib Figure (written to
`path` as PNG when one is given) and never touches pyplot's state."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.sweeps.output import save_figure, subplots

PROBE_NAMES = {"wk0": "W_KQ^1 (wk0)", "wk1": "W_KQ^2 (wk1)", "wo1": "W_OV^2 (wo1)"}


def layers_figure(curves: pd.DataFrame, path: Path | None = None):
    """In-context accuracy and bigram loss over training, one line per layer count."""
    fig, (acc, loss) = subplots(1, 2, figsize=(10, 3.6))
    for layers, group in curves.groupby("layers"):
        acc.plot(group.step, group.in_context_accuracy, label=f"{layers} layer{'s' * (layers > 1)}")
        loss.plot(group.step, group.bigram_loss, label=f"{layers} layer{'s' * (layers > 1)}")
    acc.axhline(0.55, ls=":", c="grey", label="talk: 1 layer ~55%")
    acc.axhline(0.99, ls="--", c="grey", label="talk: 2 layers ~99%")
    acc.set(xlabel="step", ylabel="in-context accuracy (counter >= 2)", ylim=(0, 1.02))
    loss.set(xlabel="step", ylabel="bigram loss (nats)")
    acc.legend(fontsize=8)
    loss.legend(fontsize=8)
    return save_figure(fig, path)


def probes_figure(curves: pd.DataFrame, path: Path | None = None):
    """The memory recall probes over training: joint (solid) and each memory alone, the others at
    their target (dashed)."""
    fig, ax = subplots(figsize=(6, 3.6))
    for (probe, mode), group in curves.groupby(["probe", "mode"]):
        ax.plot(group.step, group.value, ls="-" if mode == "joint" else "--", label=f"{PROBE_NAMES[probe]}, {mode}",
                color={"wk0": "C0", "wk1": "C1", "wo1": "C2"}[probe])
    ax.set(xlabel="step", ylabel="memory recall", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def location_figure(table: pd.DataFrame, path: Path | None = None):
    """Per variant: share of in-context positions predicted in context / globally, and the bigram KL."""
    fig, (share, kl) = subplots(1, 2, figsize=(10, 3.6))
    x = range(len(table))
    share.bar([i - 0.2 for i in x], table["in_context"], 0.4, label="predicts the in-context output")
    share.bar([i + 0.2 for i in x], table["global"], 0.4, label="predicts the global bigram")
    kl.bar(list(x), table["bigram_kl"])
    for ax in (share, kl):
        ax.set_xticks(list(x), table.index, rotation=30, ha="right", fontsize=8)
    share.set(ylabel="share of in-context positions\n(output != global top)", ylim=(0, 1))
    kl.set(ylabel="KL(pi_b || model) at bigram positions (nats)")
    share.legend(fontsize=8)
    return save_figure(fig, path)
