"""Find the hallucination phase in metric curves over training steps.

A snapshot is *in the phase* when the loss sits within `level_tolerance` (relative) of
the relation-only level H(a | r), the relation-only loss is near zero and the
subject-only loss is still high: the model answers from the relation alone. The phase is
the longest run of consecutive such snapshots, and it must last: at least
`min_snapshots` snapshots spanning `min_octaves` doublings of the step. A curve that only
passes through the level on its way down has no phase; none is invented.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class PhaseRule:
    """When a snapshot is in the hallucination phase, and how long a phase must last."""

    level_tolerance: float = field(default=0.10, metadata={
        "help": "the loss lies within this fraction of H(a|r), the loss of answering from the relation alone"})
    relation_only_max: float = field(default=0.05, metadata={
        "help": "relation-only loss at most this (nats): the model has learned each relation's answers"})
    subject_only_min: float = field(default=0.5, metadata={
        "help": "subject-only loss at least this (nats): the subject is not yet used"})
    min_snapshots: int = field(default=3, metadata={"help": "a phase spans at least this many snapshots"})
    min_octaves: float = field(default=0.5, metadata={
        "help": "a phase lasts at least this many octaves of steps, log2((end + 1) / (start + 1))"})

    def __post_init__(self):
        for name in ("level_tolerance", "relation_only_max", "subject_only_min", "min_octaves"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}.")
        if self.min_snapshots < 1:
            raise ValueError(f"--min-snapshots must be >= 1, got {self.min_snapshots}.")


@dataclass(frozen=True)
class Phase:
    start_step: int  # first snapshot in the phase
    end_step: int  # last snapshot in the phase
    exit_step: int | None  # first snapshot after it (None: training ended in the phase)
    plateau_loss: float  # median loss over the phase, nats
    relation_only_loss: float  # median over the phase
    subject_only_loss: float  # median over the phase
    length_steps: int
    length_octaves: float
    n_snapshots: int

    def to_dict(self) -> dict:
        return asdict(self)


def in_phase(loss: float, relation_only: float, subject_only: float, level: float, rule: PhaseRule) -> bool:
    return (abs(loss - level) <= rule.level_tolerance * level and relation_only <= rule.relation_only_max
            and subject_only >= rule.subject_only_min)


def hallucination_phase(steps: Sequence[int], loss: Sequence[float], relation_only_loss: Sequence[float],
                        subject_only_loss: Sequence[float], level: float,
                        rule: PhaseRule = PhaseRule()) -> Phase | None:
    """The hallucination phase of curves sampled at increasing `steps`, or None."""
    if not len(steps) == len(loss) == len(relation_only_loss) == len(subject_only_loss):
        raise ValueError("steps and the three loss curves must have the same length.")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError("steps must be strictly increasing.")
    inside = [in_phase(*x, level, rule) for x in zip(loss, relation_only_loss, subject_only_loss)]
    runs, start = [], None
    for i, flag in enumerate(inside + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i - 1))
            start = None

    def octaves(run):
        return math.log2((steps[run[1]] + 1) / (steps[run[0]] + 1))
    lasting = [r for r in runs if r[1] - r[0] + 1 >= rule.min_snapshots and octaves(r) >= rule.min_octaves]
    if not lasting:
        return None
    first, last = max(lasting, key=octaves)

    def median(values):
        return float(sorted(values[first:last + 1])[(last - first) // 2])
    return Phase(start_step=int(steps[first]), end_step=int(steps[last]),
                 exit_step=int(steps[last + 1]) if last + 1 < len(steps) else None,
                 plateau_loss=median(loss), relation_only_loss=median(relation_only_loss),
                 subject_only_loss=median(subject_only_loss), length_steps=int(steps[last] - steps[first]),
                 length_octaves=round(octaves((first, last)), 3), n_snapshots=last - first + 1)
