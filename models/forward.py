"""The trainer's fast forward: last-position logits of K stacked one-layer models.

The loss reads only the last position, and a one-layer model's keys and values depend on a
position only through its token and its positional embedding. So instead of projecting
every position (batch x T x d work), we project the vocabulary once (tables [head, vocab])
and move scalars: the EOS query's scores are gathered from a [batch, head, vocab] table,
and the attention weights are summed per vocabulary entry before one product with the
value table. Same math as TransformerLens (tests/test_parity.py pins it to the
TransformerBridge model to 1e-5); analyses never use this, they use the model's hooks.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum

ATTN = "blocks.0.attn."
MLP = "blocks.0.mlp."


def last_position_logits(w: dict[str, torch.Tensor], tokens: torch.Tensor,
                         attention: str = "softmax") -> torch.Tensor:
    """Logits at the last position [K, batch, d_vocab_out] for a stack `w` ([K, ...]
    tensors) on tokens [K, batch, T]."""
    E, W_pos = w["embed.W_E"], w["pos_embed.W_pos"]  # [K, V, d], [K, T, d]
    K, B, T = tokens.shape
    d_head = w[ATTN + "W_Q"].shape[-1]

    x_last = torch.gather(E, 1, tokens[:, :, -1, None].expand(K, B, E.shape[-1])) + W_pos[:, -1, None]  # [K, B, d]
    q = einsum(x_last, w[ATTN + "W_Q"], "k b d, k h d e -> k b h e") + w[ATTN + "b_Q"][:, None]  # [K, B, H, dh]

    # Keys: a table per vocabulary entry plus a table per position (W_pos is zero in our models).
    key_vocab = einsum(E, w[ATTN + "W_K"], "k v d, k h d e -> k h v e")  # [K, H, V, dh]
    key_pos = einsum(W_pos, w[ATTN + "W_K"], "k t d, k h d e -> k h t e") + w[ATTN + "b_K"][:, :, None]  # [K, H, T, dh]
    H = key_vocab.shape[1]
    token_index = tokens[:, :, None, :].expand(K, B, H, T)  # [K, B, H, T]
    scores = torch.gather(einsum(q, key_vocab, "k b h e, k h v e -> k b h v"), -1, token_index) \
        + einsum(q, key_pos, "k b h e, k h t e -> k b h t")  # [K, B, H, T]
    scores = scores / math.sqrt(d_head)
    # The last query sees every position, so the causal mask removes nothing here.
    pattern = scores.softmax(-1) if attention == "softmax" else scores  # [K, B, H, T]

    # Values: sum the attention per vocabulary entry, then one product with the value table.
    value_vocab = einsum(E, w[ATTN + "W_V"], "k v d, k h d e -> k h v e")  # [K, H, V, dh]
    value_pos = einsum(W_pos, w[ATTN + "W_V"], "k t d, k h d e -> k h t e") + w[ATTN + "b_V"][:, :, None]  # [K, H, T, dh]
    pattern_vocab = torch.zeros(K, B, H, E.shape[1], dtype=pattern.dtype, device=pattern.device)
    pattern_vocab = pattern_vocab.scatter_add(-1, token_index, pattern)  # [K, B, H, V]
    z = einsum(pattern_vocab, value_vocab, "k b h v, k h v e -> k b h e") \
        + einsum(pattern, value_pos, "k b h t, k h t e -> k b h e")  # [K, B, H, dh]
    attn_out = einsum(z, w[ATTN + "W_O"], "k b h e, k h e d -> k b d") + w[ATTN + "b_O"][:, None]  # [K, B, d]

    resid = x_last + attn_out  # [K, B, d]
    if MLP + "W_in" in w:
        hidden = F.relu(torch.baddbmm(w[MLP + "b_in"][:, None], resid, w[MLP + "W_in"]))  # [K, B, m]
        resid = resid + torch.baddbmm(w[MLP + "b_out"][:, None], hidden, w[MLP + "W_out"])  # [K, B, d]
    return torch.baddbmm(w["unembed.b_U"][:, None], resid, w["unembed.W_U"])  # [K, B, d_vocab_out]
