"""The trainer's fast forward: last-position logits of K stacked one-layer models.

The loss reads only the last position, and a one-layer model's keys and values depend on a
position only through its token and its positional embedding. So we project the
vocabulary once (key and value tables [head, vocab]) and never materialise a batch x T x d
activation. Without a positional embedding a prompt is, for the last query, a bag of
tokens: the attention a vocabulary entry receives is its count times its softmax weight,
so the pattern per vocabulary entry is softmax(scores + log counts) over the vocabulary —
no per-position gather or scatter at all, and memory independent of T. With a positional
embedding the scores are gathered per position and the pattern is summed per vocabulary
entry (scalars moved, never vectors), plus a small position table. Same math as
TransformerLens either way (tests/test_parity.py pins both to the TransformerBridge model
to 1e-5); analyses never use this, they use the model's hooks.
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


def token_counts(tokens: torch.Tensor, d_vocab: int, dtype=torch.float32) -> torch.Tensor:
    """How often each vocabulary entry occurs in each prompt [K, batch, vocab] (no gradient)."""
    ones = torch.ones(tokens.shape, dtype=dtype, device=tokens.device)
    return torch.zeros(*tokens.shape[:-1], d_vocab, dtype=dtype, device=tokens.device).scatter_add_(-1, tokens, ones)


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
    q = einsum(x_last, w[ATTN + "W_Q"], "k b d, k h d e -> k b h e") + w[ATTN + "b_Q"][:, None]  # [K, B, H, dh]
    key_vocab = einsum(E, w[ATTN + "W_K"], "k v d, k h d e -> k h v e")  # [K, H, V, dh]
    value_vocab = einsum(E, w[ATTN + "W_V"], "k v d, k h d e -> k h v e")  # [K, H, V, dh]
    # b_K and b_V are the same at every position: they belong in the vocabulary tables.
    key_vocab = key_vocab + w[ATTN + "b_K"][:, :, None]
    value_vocab = value_vocab + w[ATTN + "b_V"][:, :, None]
    scores_vocab = einsum(q, key_vocab, "k b h e, k h v e -> k b h v") / math.sqrt(d_head)  # [K, B, H, V]

    # The last query sees every position, so the causal mask removes nothing here.
    if not positional:
        counts = token_counts(tokens, V, scores_vocab.dtype)[:, :, None]  # [K, B, 1, V]
        if attention == "softmax":
            pattern_vocab = (scores_vocab + counts.log()).softmax(-1)  # [K, B, H, V]; absent tokens get 0
        else:
            pattern_vocab = scores_vocab * counts
        z = einsum(pattern_vocab, value_vocab, "k b h v, k h v e -> k b h e")  # [K, B, H, dh]
    else:
        W_pos = w["pos_embed.W_pos"]  # [K, T, d]
        H = key_vocab.shape[1]
        token_index = tokens[:, :, None, :].expand(K, B, H, T)  # [K, B, H, T]
        key_pos = einsum(W_pos, w[ATTN + "W_K"], "k t d, k h d e -> k h t e")  # [K, H, T, dh]
        value_pos = einsum(W_pos, w[ATTN + "W_V"], "k t d, k h d e -> k h t e")  # [K, H, T, dh]
        scores = torch.gather(scores_vocab, -1, token_index) \
            + einsum(q, key_pos, "k b h e, k h t e -> k b h t") / math.sqrt(d_head)  # [K, B, H, T]
        pattern = scores.softmax(-1) if attention == "softmax" else scores  # [K, B, H, T]
        pattern_vocab = torch.zeros(K, B, H, V, dtype=pattern.dtype, device=pattern.device)
        pattern_vocab = pattern_vocab.scatter_add(-1, token_index, pattern)  # [K, B, H, V]
        z = einsum(pattern_vocab, value_vocab, "k b h v, k h v e -> k b h e") \
            + einsum(pattern, value_pos, "k b h t, k h t e -> k b h e")  # [K, B, H, dh]
    attn_out = einsum(z, w[ATTN + "W_O"], "k b h e, k h e d -> k b d") + w[ATTN + "b_O"][:, None]  # [K, B, d]

    resid = x_last + attn_out  # [K, B, d]
    if MLP + "W_in" in w:
        hidden = F.relu(torch.baddbmm(w[MLP + "b_in"][:, None], resid, w[MLP + "W_in"]))  # [K, B, m]
        resid = resid + torch.baddbmm(w[MLP + "b_out"][:, None], hidden, w[MLP + "W_out"])  # [K, B, d]
    return torch.baddbmm(w["unembed.b_U"][:, None], resid, w["unembed.W_U"])  # [K, B, d_vocab_out]
