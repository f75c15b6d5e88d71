"""The induction trainer's fast forwards: every position's logits of K stacked models of one
section on their own batches, the TransformerLens computation written with a leading model axis.

`sequence_logits` is the general one, the same math as the TransformerBridge
(models.bridge.build_bridge on the same weights): pre-norm blocks x + attn(ln1(x)), then
x + mlp(ln2(x)), ln_final before the unembedding (layer norms only with normalization_type "LN",
TransformerLens's centred LN with eps 1e-5), scores q.k / sqrt(d_head) under a causal mask.

`simplified_logits` is the same function for the simplified model as it trains (W_Q = I, every
bias zero: `forward_for` checks the weights once and picks it), with the work that form leaves
out left out: no W_Q product, the frozen W_V^1 W_O^1 and the layer-1 keys read from tables of the
N tokens and T positions (the layer's input is e_z + p_t) instead of B T products each, and the
second layer's values through the one matrix W_V^2 W_O^2. About 40% of the general forward's and
backward's floating-point work at the paper's size (bench/README.md).

The attention is written out, not torch's fused kernels: on a CPU their backward is slower here
(it computes the gradients of the layer-1 queries and values that nothing needs), and on a GPU it
may add in a varying order. tests/test_induction_models.py pins every path to the bridge.
Analyses never use these: they read the model through its hooks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from models.section import EPS, InductionSection


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TransformerLens's LN on x [K, B, T, d] with w, b [K, d]."""
    x = x - x.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + EPS).sqrt()
    return x * w[:, None, None] + b[:, None, None]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head) under the causal mask) v for q, k [..., T, d_head], v [..., T, e]
    -> [..., T, e]: the scale and the mask join the scores' product (baddbmm), one pass fewer each."""
    T, dh = q.shape[-2:]
    mask = torch.full((T, T), float("-inf"), device=q.device).triu(1)  # [T, T] -inf above the diagonal
    scores = torch.baddbmm(mask, q.reshape(-1, T, dh), k.reshape(-1, T, dh).transpose(-1, -2), alpha=dh ** -0.5)
    return (scores.softmax(-1) @ v.reshape(-1, T, v.shape[-1])).view(*q.shape[:-1], v.shape[-1])


def attention(w: dict, l: int, x: torch.Tensor) -> torch.Tensor:
    """Layer l's attention output [K, B, T, d] on its input x [K, B, T, d] (causal softmax)."""
    a = f"blocks.{l}.attn."
    q = torch.einsum("kbtd,khde->kbhte", x, w[a + "W_Q"]) + w[a + "b_Q"][:, None, :, None]  # [K, B, H, T, dh]
    k = torch.einsum("kbtd,khde->kbhte", x, w[a + "W_K"]) + w[a + "b_K"][:, None, :, None]
    v = torch.einsum("kbtd,khde->kbhte", x, w[a + "W_V"]) + w[a + "b_V"][:, None, :, None]
    z = causal_attention(q, k, v)  # [K, B, H, T, dh]
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


def is_simplified_form(w: dict[str, torch.Tensor], section: InductionSection) -> bool:
    """Whether stacked weights `w` are in the simplified model's training form: W_Q = I in both
    layers and every bias zero (what simplified_logits assumes)."""
    if section.architecture != "simplified":
        return False
    eye = torch.eye(section.d_model, device=w["embed.W_E"].device)
    identity = all(torch.equal(w[f"blocks.{l}.attn.W_Q"][:, 0], eye.expand_as(w[f"blocks.{l}.attn.W_Q"][:, 0]))
                   for l in range(section.n_layers))
    biases = [v for k, v in w.items() if k.split(".")[-1].startswith("b_")]
    return identity and not any(bool(b.any()) for b in biases)


def forward_for(w: dict[str, torch.Tensor], section: InductionSection):
    """The fast forward for these weights: simplified_logits where they are in the simplified
    training form, sequence_logits otherwise (decided once: training keeps the form)."""
    return simplified_logits if is_simplified_form(w, section) else sequence_logits


def _rows(table: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """table[token] + positions[t] [K, B, T, e] for per-model tables [K, N, e], [K, T, e] and tokens [K, B, T]."""
    K, B, T = tokens.shape
    picked = torch.gather(table, 1, tokens.reshape(K, B * T, 1).expand(-1, -1, table.shape[-1]))  # [K, B T, e]
    return picked.view(K, B, T, -1) + positions[:, None]


def _times(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """x [K, B, T, d] times each model's W [K, d, e] -> [K, B, T, e], as one product per model (a
    broadcast W would make autograd sum B per-sequence gradients of W)."""
    K, B, T, d = x.shape
    return (x.reshape(K, B * T, d) @ W).view(K, B, T, -1)


def simplified_logits(w: dict[str, torch.Tensor], tokens: torch.Tensor, section: InductionSection) -> torch.Tensor:
    """Logits [K, B, T, N] of stacked simplified models in training form (is_simplified_form) on
    tokens [K, B, T]: sequence_logits's function with less work (see the module's docstring)."""
    T = tokens.shape[-1]
    E, P = w["embed.W_E"], w["pos_embed.W_pos"][:, :T]  # [K, N, d], [K, T, d]
    a0, a1 = "blocks.0.attn.", "blocks.1.attn."
    W_K1, W_K2 = w[a0 + "W_K"][:, 0], w[a1 + "W_K"][:, 0]  # [K, d, d]
    OV1 = w[a0 + "W_V"][:, 0] @ w[a0 + "W_O"][:, 0]  # [K, d, d] the frozen remapping W_OV^1
    OV2 = w[a1 + "W_V"][:, 0] @ w[a1 + "W_O"][:, 0]  # [K, d, d] W_OV^2 (W_O^2 trains through it)
    x = _rows(E, P, tokens)  # [K, B, T, d] e_z + p_t; W_Q = I: the queries are x itself
    x = x + causal_attention(x, _rows(E @ W_K1, P @ W_K1, tokens), _rows(E @ OV1, P @ OV1, tokens))
    x = x + causal_attention(x, _times(x, W_K2), _times(x, OV2))
    if section.mlp_in(1):
        m = "blocks.1.mlp."
        act = F.relu if section.act_fn == "relu" else F.gelu
        x = x + _times(act(_times(x, w[m + "W_in"])), w[m + "W_out"])  # [K, B, T, d]
    return _times(x, w["unembed.W_U"])  # [K, B, T, N]
