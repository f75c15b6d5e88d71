"""What every family's trainer shares about a run: the trained model it returns (TrainResult,
ready to be written as a checkpoint), the offset of its data seeds and its snapshot schedule."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.checkpoint import write_checkpoint
from models.section import ModelSection
from tasks import Task

DATA_SEED_OFFSET = 1_000_000  # every trainer draws the data of seed s from seed s + DATA_SEED_OFFSET


@dataclass
class TrainResult:
    """One trained model of any family, ready to be written as a checkpoint: its task,
    config.json model and training sections, weights, curve and snapshots."""

    task: Task
    section: ModelSection  # the config.json model section
    weights: dict[str, torch.Tensor]  # the model's checkpoint dict (HookedTransformer keys), CPU
    training: dict  # the config.json training section (final_accuracy, final_loss, seed, ...)
    metrics: list[dict]  # metrics.jsonl: one row per evaluation
    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # checkpoint dicts by step
    stacked: dict[str, torch.Tensor] | None = None  # factual recall: all K final models [K, ...], CPU
    session: dict | None = None  # factual recall: this call's part of the run (from_step, steps, seconds)

    @property
    def accuracy(self) -> float:
        """Final accuracy: held-out (factual recall), or on all T_0 sequences (attention-only)."""
        return self.training["final_accuracy"]

    @property
    def loss(self) -> float:
        """Final loss in nats: cross-entropy, or KL for the distribution task."""
        return self.training["final_loss"]

    def save(self, out: str | Path) -> Path:
        return write_checkpoint(out, self.section, self.task, self.training, self.weights,
                                self.metrics, self.snapshots)


def snapshot_schedule(max_steps: int, per_octave: int) -> set[int]:
    """Log-spaced steps: 0 and round(2^(i/per_octave)) up to max_steps."""
    if per_octave == 0:
        return set()
    n = int(math.log2(max(max_steps, 1)) * per_octave) + 1
    steps = {0} | {round(2 ** (i / per_octave)) for i in range(n + 1)}
    return {s for s in steps if s <= max_steps}
