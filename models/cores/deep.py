"""The trainer's forward of L-layer models (L >= 2): last-position logits of K stacked models.

Only the last layer keeps the one-layer model's shortcut: its query, MLP and unembedding run
at the last position alone, and its keys and values are never formed — the last query's
scores are the residual stream read along W_K q (resid_t . (W_K q) + q . b_K) and its values
are the residual stream mixed by the pattern first, then projected (p @ resid) W_V + (sum p) b_V.
Every earlier layer writes the residual stream that the later layers read at every position,
so it runs at every position: the full causal attention and the MLP on [K, B, T, d].

The first layer's queries, keys and values depend on a position only through its token and its
positional embedding, so they are gathered from [K, V, H e] tables (E W + b) instead of projected
per position (an embedding is frozen: no gradient flows into it). Its MLP at every position is
the step's main cost (bench/README.md).

Same math as TransformerLens (tests/test_depth.py pins the logits to the TransformerBridge model
at every L and the gradients to autograd's of the plain full-sequence model).
"""
from __future__ import annotations

import math

import torch

from models.section import attn, mlp, n_layers_of


def _rows(table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each token's row of a per-model table: table [K, V, n], tokens [K, B, T] -> [K, B, T, n]
    (one index_select over the K V rows; its backward is one index_add)."""
    K, V, n = table.shape
    offsets = torch.arange(0, K * V, V, device=tokens.device).view(K, 1, 1)
    return table.reshape(K * V, n).index_select(0, (tokens + offsets).flatten()).view(*tokens.shape, n)


def _first_layer_qkv(w: dict, E: torch.Tensor, W_pos: torch.Tensor | None, tokens: torch.Tensor):
    """The first layer's queries, keys and values at every position, [K, B, T, H, e] each, gathered
    from one [K, V, 3 H e] table E [W_Q W_K W_V] + [b_Q b_K b_V] (plus W_pos W at each position)."""
    A = attn(0)
    K, H, d, e = w[A + "W_Q"].shape
    flat = torch.cat([w[A + "W_" + x].permute(0, 2, 1, 3).reshape(K, d, H * e) for x in "QKV"], -1)  # [K, d, 3He]
    bias = torch.cat([w[A + "b_" + x].reshape(K, 1, H * e) for x in "QKV"], -1)  # [K, 1, 3 H e]
    out = _rows(torch.baddbmm(bias, E, flat), tokens)  # [K, B, T, 3 H e]
    if W_pos is not None:
        out = out + (W_pos @ flat)[:, None]  # [K, 1, T, 3 H e]
    B, T = tokens.shape[1:]
    return out.view(K, B, T, 3, H, e).unbind(3)


def _projected(w: dict, layer: int, name: str, resid: torch.Tensor) -> torch.Tensor:
    """resid [K, B, T, d] projected by layer `layer`'s W_name, b_name -> [K, B, T, H, e]."""
    W, b = w[attn(layer) + "W_" + name], w[attn(layer) + "b_" + name]
    K, H, d, e = W.shape
    B, T = resid.shape[1:3]
    flat = W.permute(0, 2, 1, 3).reshape(K, d, H * e)
    return torch.baddbmm(b.reshape(K, 1, H * e), resid.reshape(K, B * T, d), flat).view(K, B, T, H, e)


def _full_attention(q, k, v, linear: bool) -> torch.Tensor:
    """Causal attention at every position: q, k, v [K, B, T, H, e] -> z [K, B, T, H, e]
    (softmax: torch's fused scaled_dot_product_attention on [K B, H, T, e], the fastest
    measured here; linear attention has no fused form)."""
    K, B, T, H, e = q.shape
    q, k, v = (t.reshape(K * B, T, H, e).transpose(1, 2) for t in (q, k, v))  # [K B, H, T, e]
    if linear:
        scores = q @ k.transpose(-1, -2) / math.sqrt(e)  # [K B, H, T, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        z = scores.masked_fill(~causal, 0.0) @ v
    else:
        z = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # [K B, H, T, e]
    return z.transpose(1, 2).reshape(K, B, T, H, e)


def _mlp(w: dict, layer: int, resid: torch.Tensor) -> torch.Tensor:
    """resid [K, n, d] plus layer `layer`'s MLP (none when attention-only)."""
    M = mlp(layer)
    if M + "W_in" not in w:
        return resid
    hidden = torch.baddbmm(w[M + "b_in"][:, None], resid, w[M + "W_in"]).relu()  # [K, n, m]
    return resid + torch.baddbmm(w[M + "b_out"][:, None], hidden, w[M + "W_out"])


def _write(w: dict, layer: int, z: torch.Tensor) -> torch.Tensor:
    """Heads' outputs z [K, n, H, e] through W_O, plus b_O -> [K, n, d]."""
    W_O = w[attn(layer) + "W_O"]  # [K, H, e, d]
    K, H, e, d = W_O.shape
    return torch.baddbmm(w[attn(layer) + "b_O"][:, None], z.reshape(K, -1, H * e), W_O.reshape(K, H * e, d))


def deep_last_position_logits(w: dict[str, torch.Tensor], tokens: torch.Tensor, attention: str = "softmax",
                              positional: bool = True) -> torch.Tensor:
    """Logits at the last position [K, B, d_vocab_out] of a stack `w` of L-layer models
    (blocks.0 .. blocks.{L-1}) on tokens [K, B, T]; `positional`: W_pos is non-zero."""
    L = n_layers_of(w)
    E = w["embed.W_E"]  # [K, V, d]
    K, B, T = tokens.shape
    d = E.shape[-1]
    linear = attention != "softmax"
    W_pos = w["pos_embed.W_pos"][:, :T] if positional else None  # [K, T, d]
    resid = _rows(E, tokens)  # [K, B, T, d]
    if W_pos is not None:
        resid = resid + W_pos[:, None]
    for layer in range(L - 1):  # every position: the later layers read them all
        if layer == 0:
            q, k, v = _first_layer_qkv(w, E, W_pos, tokens)
        else:
            q, k, v = (_projected(w, layer, name, resid) for name in "QKV")
        z = _full_attention(q, k, v, linear)  # [K, B, T, H, e]
        resid = resid + _write(w, layer, z.reshape(K, B * T, *z.shape[-2:])).view(K, B, T, d)
        resid = _mlp(w, layer, resid.view(K, B * T, d)).view(K, B, T, d)
    return _last_layer(w, L - 1, resid, linear)


def _last_layer(w: dict, layer: int, resid: torch.Tensor, linear: bool) -> torch.Tensor:
    """The last layer at the last position only, on the residual stream resid [K, B, T, d]:
    logits [K, B, O]."""
    A = attn(layer)
    W_Q, W_K, W_V = w[A + "W_Q"], w[A + "W_K"], w[A + "W_V"]  # [K, H, d, e]
    K, H, d, e = W_Q.shape
    last = resid[:, :, -1]  # [K, B, d]
    q = (torch.einsum("kbd,khde->kbhe", last, W_Q) + w[A + "b_Q"][:, None]) / math.sqrt(e)  # [K, B, H, e]
    read = torch.einsum("kbhe,khde->kbhd", q, W_K)  # [K, B, H, d]: W_K q, what the query reads
    scores = read @ resid.transpose(-1, -2) + (q * w[A + "b_K"][:, None]).sum(-1, keepdim=True)  # [K, B, H, T]
    pattern = scores if linear else scores.softmax(-1)  # [K, B, H, T]
    mixed = pattern @ resid  # [K, B, H, d]
    z = torch.einsum("kbhd,khde->kbhe", mixed, W_V) + pattern.sum(-1, keepdim=True) * w[A + "b_V"][:, None]
    out = _mlp(w, layer, last + _write(w, layer, z))  # [K, B, d]
    return torch.baddbmm(w["unembed.b_U"][:, None], out, w["unembed.W_U"])  # [K, B, O]
