"""The synthetic tasks models are trained on, and what every task provides.

- factual recall (Nichani, Lee & Bietti 2024): tasks.factual_recall.FactualRecallTask
- association and distribution (Dana, Pydi & Chevaleyre): tasks.association.AssociationTask,
  tasks.association.DistributionTask
- in-context associations, the induction-head task (Bietti et al. 2023): tasks.induction.InductionTask
- two-hop recall (relations from entities to entities, composed): tasks.two_hop.TwoHopTask

A checkpoint's config.json `task` section names its `kind` (absent: factual_recall);
`task_from_config` builds the task of any kind from it (docs/checkpoint_format.md).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from tasks.association import AssociationTask, DistributionTask, SequenceBatch, SequenceTask
from tasks.factual_recall import Batch, FactualRecallTask, zipf_probs
from tasks.induction import InductionBatch, InductionTask
from tasks.two_hop import TwoHopBatch, TwoHopTask


@runtime_checkable
class Task(Protocol):
    """What the models, checkpoints and instruments read from any task."""

    @property
    def kind(self) -> str:
        """The config.json `task.kind`: factual_recall, association or distribution."""

    @property
    def d_vocab(self) -> int:
        """Number of input token ids."""

    @property
    def d_vocab_out(self) -> int:
        """Number of output (logit) ids."""

    @property
    def seq_len(self) -> int:
        """Prompt length, = the model's n_ctx."""

    def token_label(self, token: int) -> str:
        """Readable name of an input id."""

    def answer_label(self, answer: int) -> str:
        """Readable name of an output (logit) id (factual recall: R1:a3, relation 1's answer 3)."""

    def eval_set(self, n: int, seed: int = 1234, device="cpu"):
        """A held-out set: the same `n` prompts for every call with this seed, on `device`;
        its `tokens` [n, T] and `answers` [n] (output ids) are every task's."""

    def to_config(self) -> dict:
        """The config.json `task` section (with its kind)."""

    @classmethod
    def from_config(cls, cfg: dict) -> Task:
        """The task of a config.json `task` section of this kind."""


TASKS: dict[str, type[Task]] = {task.kind: task for task in (FactualRecallTask, AssociationTask, DistributionTask,
                                                              InductionTask, TwoHopTask)}
DEFAULT_KIND = FactualRecallTask.kind  # the kind of a task section that names none


def task_kind(cfg: dict) -> str:
    """The kind a config.json `task` section names (absent: factual_recall)."""
    return cfg.get("kind", DEFAULT_KIND)


def task_from_config(cfg: dict) -> Task:
    """The task of a config.json `task` section, of the kind it names."""
    kind = task_kind(cfg)
    if kind not in TASKS:
        raise ValueError(f"task kind {kind!r} is not one of {', '.join(TASKS)}.")
    return TASKS[kind].from_config(cfg)


__all__ = ["Task", "TASKS", "task_kind", "task_from_config", "Batch", "FactualRecallTask", "zipf_probs",
           "SequenceTask", "SequenceBatch", "AssociationTask", "DistributionTask", "InductionTask", "InductionBatch",
           "TwoHopTask", "TwoHopBatch"]
