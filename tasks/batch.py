"""A batch of factual-recall prompts and their targets, as every sampler of the task draws it
(tasks.factual_recall's generator sampler, tasks.counter_sampler's counter sampler)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class Batch:
    """One batch of prompts and their targets, all on one device (with a leading model axis
    [K, ...] on every field when drawn by sample_counter)."""

    tokens: torch.Tensor  # [batch, T] input ids, EOS last
    subjects: torch.Tensor  # [batch] subject index s in 0..S-1
    relations: torch.Tensor  # [batch] relation index r in 0..R-1
    answers: torch.Tensor  # [batch] answer id a*(s, r) in 0..R*D-1
    subject_pos: torch.Tensor  # [batch] position of the subject token
    relation_pos: torch.Tensor  # [batch] position of the relation token

    def __len__(self) -> int:
        return self.tokens.shape[-2]

    def to(self, device: str | torch.device) -> Batch:
        """The same prompts with every field on `device`."""
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))
