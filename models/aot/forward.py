"""The attention-only trainer's fast forward: last-position logits of K stacked models of
the memorisation tasks (Dana et al.) on the whole population of N^S sequences.

A different algorithm from models.cores.forward (factual recall: each sampled prompt's scores
gathered from per-head vocabulary tables): here every one of the N^S sequences is scored at
once, so the forward is a grid of per-position contractions over the vocabulary. Same math as TransformerLens;
tests/test_aot_models.py pins it to the TransformerBridge model (1e-5) and, for the dana head
layout, to a torch.nn reference (1e-10 in float64). Analyses never use this: they use the
model's hooks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import einsum

from models.section import ATTN, MLP


def population_logits(w: dict[str, torch.Tensor], context: int, score_scale: torch.Tensor,
                      act_fn: str = "gelu") -> torch.Tensor:
    """Last-position logits of the stacked models `w` ([K, ...], padding already zeroed) on
    all N^S sequences [K, N^S, N], in the order of SequenceTask.sequences().

    The sequences form a grid [N] * S, and a position's key, value and output depend only on
    its token: so the vocabulary is projected once per position (tables [K, H, S, N, ...]),
    the EOS-free last query's scores are an [N x N] table per position, and the attention
    output is one contraction over heads per position, broadcast over the grid. Same math
    as TransformerLens (scores scaled by 1/sqrt(d_head), softmax over positions)."""
    E, P = w["embed.W_E"], w["pos_embed.W_pos"]  # [K, N, d], [K, S, d]
    K, N, d = E.shape
    S = context
    grid = list(range(2, 2 + S))  # einsum axis ids of the token at each position
    x = E[:, None] + P[:, :, None]  # [K, S, N, d]: every (position, token) input vector
    q = einsum(x[:, -1], w[ATTN + "W_Q"], "k v d, k h d e -> k h v e") + w[ATTN + "b_Q"][:, :, None]  # [K, H, N, dh]
    keys = einsum(x, w[ATTN + "W_K"], "k s v d, k h d e -> k h s v e") + w[ATTN + "b_K"][:, :, None, None]
    values = einsum(x, w[ATTN + "W_V"], "k s v d, k h d e -> k h s v e") + w[ATTN + "b_V"][:, :, None, None]
    ov = einsum(values, w[ATTN + "W_O"], "k h s v e, k h e d -> k h s v d")  # [K, H, S, N, d]
    table = einsum(q, keys, "k h q e, k h s v e -> k h s q v") * score_scale[:, None, None, None, None]
    H = q.shape[1]
    scores = []  # per position: the last query's score on it, [K, H, N, ..., N] over the grid
    for p in range(S):
        if p == S - 1:  # query and key are the same token
            part = table[:, :, p].diagonal(dim1=-2, dim2=-1)  # [K, H, N] along the last grid axis
            shape = [1] * (S - 1) + [N]
        else:  # [K, H, query token, key token] -> axes (p, S-1) of the grid
            part = table[:, :, p].transpose(-1, -2)  # [K, H, t_p, t_last]
            shape = [1] * S
            shape[p], shape[-1] = N, N
        scores.append(part.reshape(K, H, *shape).expand(K, H, *[N] * S))
    pattern = torch.stack(scores, 2).softmax(2)  # [K, H, S, N, ..., N] (positions first: a fast softmax)
    attn = sum(torch.einsum(pattern[:, :, p], [0, 1, *grid], ov[:, :, p], [0, 1, grid[p], 51], [0, *grid, 51])
               for p in range(S))  # [K, N, ..., N, d]
    x_last = x[:, -1].reshape(K, *[1] * (S - 1), N, d)  # [K, 1, ..., N, d]
    resid = (x_last + attn + w[ATTN + "b_O"].reshape(K, *[1] * S, d)).reshape(K, N ** S, d)  # [K, T_0, d]
    if MLP + "W_in" in w:
        act = F.gelu if act_fn == "gelu" else F.relu
        hidden = act(torch.baddbmm(w[MLP + "b_in"][:, None], resid, w[MLP + "W_in"]))  # [K, T_0, m]
        resid = resid + torch.baddbmm(w[MLP + "b_out"][:, None], hidden, w[MLP + "W_out"])
    return torch.baddbmm(w["unembed.b_U"][:, None], resid, w["unembed.W_U"])  # [K, T_0, N]
