"""The task's metrics, read at the last position, in the form TransformerLens's `patching`
functions take (a function of the logits [batch, pos, d_vocab_out] returning a scalar):

    metric = logit_diff_metric(answers, rivals)
    transformer_lens.patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)

The task is scored at the last position only, in the separate answer vocabulary:
`last_position_loss` is the task's loss as a function of the logits (on the analysis model,
`model(tokens, return_type="loss")` gives the same number: models/answer_calls.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def answer_logit_diff(last_logits: torch.Tensor, answers: torch.Tensor, rivals: torch.Tensor) -> torch.Tensor:
    """logit(answer) - logit(rival) per prompt [n], from last-position logits [n, d_vocab_out]."""
    return last_logits.gather(-1, answers[:, None])[:, 0] - last_logits.gather(-1, rivals[:, None])[:, 0]


def last_position_loss(logits: torch.Tensor, answers: torch.Tensor, per_prompt: bool = False) -> torch.Tensor:
    """Cross-entropy (nats) of the answers [batch] at the last position of logits
    [batch, pos, d_vocab_out]: the mean, or one value per prompt [batch]."""
    return F.cross_entropy(logits[:, -1].float(), answers.to(logits.device), reduction="none" if per_prompt else "mean")


def logit_diff_metric(answers: torch.Tensor, rivals: torch.Tensor, per_prompt: bool = False,
                      normalise: tuple[float, float] | None = None) -> Callable:
    """A patching metric: the mean (per_prompt: [batch]) last-position logit difference
    logit(answer) - logit(rival), in logits. `normalise` = (clean, corrupted), two numbers:
    this metric's value on the clean run and on the corrupted run (e.g.
    `logit_diff_metric(answers, rivals)(clean_logits).item()`), not logits; the metric is
    then rescaled so the corrupted run scores 0 and the clean run 1. Anything else is refused
    (ValueError) here, not deep inside a patching call."""
    if normalise is not None:
        clean, corrupted = _normalising_values(normalise)

    def metric(logits: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_vocab_out]
        device = logits.device
        diff = answer_logit_diff(logits[:, -1], answers.to(device), rivals.to(device))  # [batch]
        diff = diff if per_prompt else diff.mean()
        if normalise is not None:
            diff = (diff - corrupted) / (clean - corrupted)
        return diff
    return metric


def _normalising_values(normalise) -> tuple[float, float]:
    """(clean, corrupted) as two distinct finite floats; a one-element tensor counts as its number."""
    def number(value, name: str) -> float:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"normalise: {name} must be one number, the metric's value on the {name} run "
                                 f"(metric(logits).item()), got a tensor of shape {list(value.shape)}.")
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"normalise: {name} must be a finite number, got {value!r}.")
        return float(value)

    if not isinstance(normalise, (tuple, list)) or len(normalise) != 2:
        raise ValueError(f"normalise must be (clean, corrupted), the metric's values on the clean and the corrupted "
                         f"run, got {type(normalise).__name__}.")
    clean, corrupted = number(normalise[0], "clean"), number(normalise[1], "corrupted")
    if clean == corrupted:
        raise ValueError(f"normalise: the clean and the corrupted values are equal ({clean:g}): nothing to "
                         "rescale by.")
    return clean, corrupted


def loss_metric(answers: torch.Tensor, per_prompt: bool = False) -> Callable:
    """A patching metric: the last-position loss of the answers (nats)."""
    return lambda logits: last_position_loss(logits, answers, per_prompt)
