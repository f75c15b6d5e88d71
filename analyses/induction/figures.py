"""The figures of `python -m analyses.induction`; each returns its matplotlib Figure (written to
`path` as PNG when one is given) and never touches pyplot's state."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.sweeps.output import save_figure, subplots

PROBE_NAMES = {"wk0": "W_KQ^1 (wk0)", "wk0_64": "W_KQ^1, t < 64 (wk0_64)", "wk1": "W_KQ^2 (wk1)",
               "wo1": "W_OV^2 (wo1)"}
COLORS = {"wk0": "C0", "wk0_64": "C0", "wk1": "C1", "wo1": "C2"}


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


def probes_figure(probes: pd.DataFrame, curves: pd.DataFrame, path: Path | None = None):
    """Left: the memory recall probes over training, joint (solid; wk0_64 dotted) and each memory in
    the run that trained it alone (dashed). Right: every run's held-out in-context accuracy."""
    fig, (ax, acc) = subplots(1, 2, figsize=(11, 3.8))
    joint = probes[probes["mode"] == "joint"]
    for probe, group in joint[joint.probe.isin(list(COLORS))].groupby("probe"):
        ax.plot(group.step, group.value, ls=":" if probe == "wk0_64" else "-", color=COLORS[probe],
                label=f"{PROBE_NAMES[probe]}, joint")
    alone = probes[(probes["mode"] == "alone") & (probes.probe == probes.get("trained_alone"))]
    for probe, group in alone.groupby("probe"):
        ax.plot(group.step, group.value, ls="--", color=COLORS[probe], label=f"{PROBE_NAMES[probe]}, alone")
    ax.set(xlabel="step", ylabel="memory recall", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    for (mode, trained), group in curves.groupby(["mode", "trained_alone"], sort=False):
        label = "joint" if mode == "joint" else f"{PROBE_NAMES[trained]} alone"
        acc.plot(group.step, group.in_context_accuracy, ls="-" if mode == "joint" else "--",
                 color="k" if mode == "joint" else COLORS[trained], label=label)
    acc.set(xlabel="step", ylabel="held-out in-context accuracy", ylim=(-0.02, 1.02))
    acc.legend(fontsize=7)
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
