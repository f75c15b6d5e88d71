"""The trainer's fast forward: last-position logits of K stacked one-layer models.

The loss reads only the last position, and a one-layer model's keys and values depend on a
position only through its token and its positional embedding. So instead of projecting
every position (batch x T x d work), we project the vocabulary once (tables [head, vocab])
and move scalars: the last query's scores are gathered from a [batch, head, vocab] table,
and the attention weights are summed per vocabulary entry before one product with the
value table; a positional embedding adds its own small [head, T] tables (skipped when W_pos
is zero, as in our models). No batch x T x d activation is materialised. Measured here:
scoring the vocabulary as a bag of tokens (softmax over the vocabulary with log counts) was
slower than this gather and scatter at V = 129, T = 32. Same math as TransformerLens
(tests/test_parity.py pins it to the TransformerBridge model to 1e-5); analyses never use
this, they use the model's hooks.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum

ATTN = "blocks.0.attn."
MLP = "blocks.0.mlp."


def has_positions(w: dict[str, torch.Tensor]) -> bool:
    """Whether the stack has a non-zero positional embedding (one host sync: call it once
    per run, not per step)."""
    return bool(w["pos_embed.W_pos"].any())


def last_position_logits(w: dict[str, torch.Tensor], tokens: torch.Tensor, attention: str = "softmax",
                         positional: bool | None = None) -> torch.Tensor:
    """Logits at the last position [K, batch, d_vocab_out] for a stack `w` ([K, ...]
    tensors) on tokens [K, batch, T]. `positional` says whether W_pos is non-zero (None:
    look, which costs a host sync)."""
    E = w["embed.W_E"]  # [K, V, d]
    K, B, T = tokens.shape
    V, d_head = E.shape[1], w[ATTN + "W_Q"].shape[-1]
    if positional is None:
        positional = has_positions(w)

    x_last = torch.gather(E, 1, tokens[:, :, -1, None].expand(K, B, E.shape[-1]))  # [K, B, d]
    if positional:
        x_last = x_last + w["pos_embed.W_pos"][:, -1, None]
    # The scores' 1/sqrt(d_head) goes on the query ([K, B, H, dh]), not on the [K, B, H, V] scores.
    q = (einsum(x_last, w[ATTN + "W_Q"], "k b d, k h d e -> k b h e") + w[ATTN + "b_Q"][:, None]) / math.sqrt(d_head)
    key_vocab = einsum(E, w[ATTN + "W_K"], "k v d, k h d e -> k h v e")  # [K, H, V, dh]
    value_vocab = einsum(E, w[ATTN + "W_V"], "k v d, k h d e -> k h v e")  # [K, H, V, dh]
    # b_K and b_V are the same at every position: they belong in the vocabulary tables.
    key_vocab = key_vocab + w[ATTN + "b_K"][:, :, None]
    value_vocab = value_vocab + w[ATTN + "b_V"][:, :, None]
    scores_vocab = einsum(q, key_vocab, "k b h e, k h v e -> k b h v")  # [K, B, H, V]

    H = key_vocab.shape[1]
    token_index = tokens[:, :, None, :].expand(K, B, H, T)  # [K, B, H, T]
    scores = torch.gather(scores_vocab, -1, token_index)  # [K, B, H, T]
    if positional:
        W_pos = w["pos_embed.W_pos"]  # [K, T, d]
        key_pos = einsum(W_pos, w[ATTN + "W_K"], "k t d, k h d e -> k h t e")  # [K, H, T, dh]
        scores = scores + einsum(q, key_pos, "k b h e, k h t e -> k b h t")
    # The last query sees every position, so the causal mask removes nothing here.
    pattern = scores.softmax(-1) if attention == "softmax" else scores  # [K, B, H, T]
    pattern_vocab = torch.zeros_like(scores_vocab).scatter_add(-1, token_index, pattern)  # [K, B, H, V]
    z = einsum(pattern_vocab, value_vocab, "k b h v, k h v e -> k b h e")  # [K, B, H, dh]
    if positional:
        value_pos = einsum(W_pos, w[ATTN + "W_V"], "k t d, k h d e -> k h t e")  # [K, H, T, dh]
        z = z + einsum(pattern, value_pos, "k b h t, k h t e -> k b h e")
    attn_out = einsum(z, w[ATTN + "W_O"], "k b h e, k h e d -> k b d") + w[ATTN + "b_O"][:, None]  # [K, B, d]

    resid = x_last + attn_out  # [K, B, d]
    if MLP + "W_in" in w:
        hidden = F.relu(torch.baddbmm(w[MLP + "b_in"][:, None], resid, w[MLP + "W_in"]))  # [K, B, m]
        resid = resid + torch.baddbmm(w[MLP + "b_out"][:, None], hidden, w[MLP + "W_out"])  # [K, B, d]
    return torch.baddbmm(w["unembed.b_U"][:, None], resid, w["unembed.W_U"])  # [K, B, d_vocab_out]
