"""Pruning a trained model's weights: MLP neurons by weight norm, heads by OV norm.

Works on a checkpoint weight dict (HookedTransformer keys) and returns a pruned copy, so a
TransformerBridge built from it (models.bridge.build_bridge) runs the pruned model through
the usual hooks. A pruned neuron has its input column W_in[:, i] and output row
W_out[i, :] zeroed (it then writes nothing); a pruned head has W_V[h] and W_O[h] zeroed
(its output hook_z and its write to the residual stream are zero).
"""
from __future__ import annotations

import torch

from models.section import ATTN, MLP


def neuron_norms(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per MLP neuron, ||W_in[:, i]|| * ||W_out[i, :]|| [m]: the scale of what it can write."""
    return weights[MLP + "W_in"].norm(dim=0) * weights[MLP + "W_out"].norm(dim=1)


def head_norms(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per head, the Frobenius norm of its OV matrix W_V[h] W_O[h] [H]."""
    return (weights[ATTN + "W_V"] @ weights[ATTN + "W_O"]).flatten(1).norm(dim=1)


def prune_order(norms: torch.Tensor) -> list[int]:
    """Indices from the smallest norm to the largest (ties by index)."""
    return sorted(range(len(norms)), key=lambda i: (float(norms[i]), i))


def prune(weights: dict[str, torch.Tensor], neurons: list[int] = (), heads: list[int] = ()) -> dict[str, torch.Tensor]:
    """A copy of `weights` with the given MLP neurons and heads removed (weights zeroed)."""
    out = {k: v.clone() for k, v in weights.items()}
    neurons, heads = list(neurons), list(heads)
    if neurons:
        out[MLP + "W_in"][:, neurons] = 0
        out[MLP + "b_in"][neurons] = 0
        out[MLP + "W_out"][neurons, :] = 0
    if heads:
        for key in ("W_V", "W_O", "b_V"):
            out[ATTN + key][heads] = 0
    return out
