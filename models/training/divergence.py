"""Models whose loss or weights become NaN or infinite, among K trained at once.

The K models of a stack are independent (each its own rows of every tensor, its own loss
term, its own Adam state), so one that diverges is dropped and the others train on
(`drop`): a mask, not a re-stack. Its trainable weights and Adam moments are set to zero and
its learning rate to zero, in place, between steps: a captured CUDA graph reads the same
tensors, the step's work is unchanged and nothing in the step waits for the host. From then
on it computes finite nonsense that is never recorded. The checks (`nonfinite`) run where the
trainer already reads values back to the host: at its evaluations and snapshots.
"""
from __future__ import annotations

import torch

from models.training.optimizer import Optimizer


class TrainingDiverged(ValueError):
    """Every model (or, in a shape stack, one) has a NaN or infinite loss or weight."""


def nonfinite(tensors: dict[str, torch.Tensor], K: int) -> dict[int, str]:
    """The models with a NaN or inf in any of `tensors` (each [K, ...]), and what: model ->
    'loss' or 'weight NAME' (the first tensor that has one)."""
    names = list(tensors)
    bad = torch.stack([~torch.isfinite(tensors[n].detach().reshape(K, -1)).all(-1) for n in names])  # [tensor, K]
    found = {}
    for i, k in bad.nonzero().tolist():
        found.setdefault(k, "loss" if names[i] == "loss" else f"weight {names[i]}")
    return dict(sorted(found.items()))


def describe(step: int, k: int, runs: list, what: str) -> str:
    """'step S: model k of K (lr=..., seed=...) has a non-finite WHAT'."""
    return f"step {step}: model {k} of {len(runs)} (lr={runs[k][0]:g}, seed={runs[k][1]}) has a non-finite {what}"


def stopped(step: int, k: int, runs: list, what: str, snapshots: dict) -> TrainingDiverged:
    """The error of a run that cannot go on: the model, what diverged, the last good snapshot."""
    last = max(snapshots, default=None)
    return TrainingDiverged(describe(step, k, runs, what) + "; training stopped"
                            + (f", the last good snapshot is step {last}." if last is not None else "."))


def check_finite(tensors: dict, runs: list, step: int, snapshots: dict) -> None:
    """Raise TrainingDiverged naming the step and the first model with a NaN or inf (a shape
    stack stops whole)."""
    bad = nonfinite(tensors, len(runs))
    if bad:
        k, what = next(iter(bad.items()))
        raise stopped(step, k, runs, what, snapshots)


def drop(k: int, params: dict[str, torch.Tensor], optimizer: Optimizer) -> None:
    """Stop model k for good: its trainable weights, Adam moments and learning rate zero, in
    place (the tensors a captured step reads)."""
    with torch.no_grad():
        for p in params.values():
            p[k].zero_()
    optimizer.stop(k)
