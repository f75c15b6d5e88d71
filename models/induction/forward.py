"""The induction trainer's fast forward: every position's logits of K stacked models of one
section on their own batches, the TransformerLens computation written with a leading model axis.

Same math as the TransformerBridge (models.bridge.build_bridge on the same weights):
pre-norm blocks x + attn(ln1(x)), then x + mlp(ln2(x)), ln_final before the unembedding (layer
norms only with normalization_type "LN", TransformerLens's centred LN with eps 1e-5), scores
q.k / sqrt(d_head) under a causal mask. tests/test_induction_models.py pins it to the bridge.
Analyses never use this: they read the model through its hooks.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.section import EPS, InductionSection


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TransformerLens's LN on x [K, B, T, d] with w, b [K, d]."""
    x = x - x.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + EPS).sqrt()
    return x * w[:, None, None] + b[:, None, None]


def attention(w: dict, l: int, x: torch.Tensor) -> torch.Tensor:
    """Layer l's attention output [K, B, T, d] on its input x [K, B, T, d] (causal softmax)."""
    a = f"blocks.{l}.attn."
    K, B, T, d = x.shape
    q = torch.einsum("kbtd,khde->kbhte", x, w[a + "W_Q"]) + w[a + "b_Q"][:, None, :, None]  # [K, B, H, T, dh]
    k = torch.einsum("kbtd,khde->kbhte", x, w[a + "W_K"]) + w[a + "b_K"][:, None, :, None]
    v = torch.einsum("kbtd,khde->kbhte", x, w[a + "W_V"]) + w[a + "b_V"][:, None, :, None]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [K, B, H, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    z = pattern @ v  # [K, B, H, T, dh]
    return torch.einsum("kbhte,khed->kbtd", z, w[a + "W_O"]) + w[a + "b_O"][:, None, None]


def mlp(w: dict, l: int, x: torch.Tensor, act_fn: str) -> torch.Tensor:
    """Layer l's MLP output [K, B, T, d] on x [K, B, T, d]."""
    m = f"blocks.{l}.mlp."
    act = F.relu if act_fn == "relu" else F.gelu
    hidden = act(torch.einsum("kbtd,kdm->kbtm", x, w[m + "W_in"]) + w[m + "b_in"][:, None, None])  # [K, B, T, m]
    return torch.einsum("kbtm,kmd->kbtd", hidden, w[m + "W_out"]) + w[m + "b_out"][:, None, None]


def sequence_logits(w: dict[str, torch.Tensor], tokens: torch.Tensor, section: InductionSection) -> torch.Tensor:
    """Logits [K, B, T, N] of the stacked models `w` ([K, ...] HookedTransformer keys) at every
    position of their token batches [K, B, T] (T <= n_ctx)."""
    T = tokens.shape[-1]
    ln = section.normalization_type == "LN"
    E = w["embed.W_E"]  # [K, N, d]
    x = torch.gather(E, 1, tokens.flatten(1)[..., None].expand(-1, -1, E.shape[-1])).view(*tokens.shape, -1)
    x = x + w["pos_embed.W_pos"][:, None, :T]  # [K, B, T, d]
    for l in range(section.n_layers):
        b = f"blocks.{l}."
        x = x + attention(w, l, layer_norm(x, w[b + "ln1.w"], w[b + "ln1.b"]) if ln else x)
        if section.mlp_in(l):
            x = x + mlp(w, l, layer_norm(x, w[b + "ln2.w"], w[b + "ln2.b"]) if ln else x, section.act_fn)
    if ln:
        x = layer_norm(x, w["ln_final.w"], w["ln_final.b"])
    return torch.einsum("kbtd,kdn->kbtn", x, w["unembed.W_U"]) + w["unembed.b_U"][:, None, None]
