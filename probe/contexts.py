"""Per-prompt values grouped by fact, and logits read within a relation's answer block A_r."""
from __future__ import annotations

import torch


def per_fact(values: torch.Tensor, contexts: int) -> torch.Tensor:
    """[n_prompts, ...] fact-major -> [n_facts, contexts, ...]."""
    return values.reshape(-1, contexts, *values.shape[1:])


def answer_block(logits: torch.Tensor, relations: torch.Tensor, D: int) -> torch.Tensor:
    """The D logits of each prompt's relation block A_r [n, D] from logits [n, R*D]."""
    index = relations[:, None] * D + torch.arange(D, device=logits.device)  # [n, D]
    return logits.gather(-1, index)


def correct(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """1.0 where the model's top answer over all R*D answers is a*, per prompt [n]."""
    return (logits.argmax(-1) == answers).float()


TIE = 1e-4  # logits closer than this are a tie (float rounding), not a pick


def ranks_first_in_block(logits: torch.Tensor, relations: torch.Tensor, answers: torch.Tensor, D: int):
    """1.0 where a* is the top logit within A_r by more than a rounding tie, and a*'s
    margin over the best other answer of A_r (logit units), per prompt: two [n] tensors."""
    block = answer_block(logits, relations, D)  # [n, D]
    target = answers - relations * D  # [n] index within the block
    own = block.gather(-1, target[:, None])[:, 0]
    others = block.scatter(-1, target[:, None], float("-inf")).amax(-1)
    return (own - others > TIE).float(), own - others
