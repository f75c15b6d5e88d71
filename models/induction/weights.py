"""Initial weights of the induction family, in HookedTransformer keys (models.section.InductionSection),
with the authors' initialisations (albietz/transformer-birth, PyTorch defaults):

- token embeddings N(0, 1) (nn.Embedding), positional embeddings N(0, 1) (the simplified model's
  random buffer; the generic model's nn.Embedding);
- every matrix U(-1/sqrt(fan_in), +1/sqrt(fan_in)) (nn.Linear without bias): W_K, W_V, W_O, the
  unembedding, MLP W_in (fan_in d) and W_out (fan_in m); the generic model's W_Q too;
- every bias zero and never trained (the authors' layers have none); layer norms w = 1, b = 0.

The simplified model (Bietti et al. 2023, section 4.2) has W_Q = I in both layers (the query is the
residual stream itself, so W_K is the whole key-query matrix W_KQ) and trains W_K^1, W_K^2 and W_O^2
(with the final MLP when there is one); everything else is frozen at its random initial value:
W_OV^1 = W_V^1 W_O^1 (the remapping e_k -> e~_k), W_V^2, the embeddings, positions and unembedding.
"""
from __future__ import annotations

import math

import torch

from models.section import InductionSection


def init_weights(section: InductionSection, seed: int) -> dict[str, torch.Tensor]:
    """One model's initial weights (CPU, float32)."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for key, shape in section.weight_shapes().items():
        name = key.split(".")[-1]
        if key in ("embed.W_E", "pos_embed.W_pos"):
            w[key] = torch.randn(shape, generator=g)
        elif name == "w":  # layer norm's scale
            w[key] = torch.ones(shape)
        elif name == "b" or name.startswith("b_"):
            w[key] = torch.zeros(shape)
        else:  # x @ W: the rows are the inputs; W_O [H, d_h, d] reads all H d_h of them
            fan_in = shape[-3] * shape[-2] if name == "W_O" else shape[-2]
            w[key] = (2 * torch.rand(shape, generator=g) - 1) / math.sqrt(fan_in)
    for l in range(section.n_layers):
        if section.architecture == "simplified":
            w[f"blocks.{l}.attn.W_Q"] = torch.eye(section.d_model)[None].clone()  # [1, d, d]: the query is x
        if not section.attn_only and not section.mlp_in(l):
            for name in ("W_in", "W_out"):
                w[f"blocks.{l}.mlp.{name}"].zero_()  # the simplified model's first layer has no MLP
    return w


def trainable_keys(section: InductionSection, frozen: tuple[str, ...] = ()) -> list[str]:
    """The keys training updates, less those in `frozen` (an unknown key is refused)."""
    keys = list(section.weight_shapes())
    unknown = [k for k in frozen if k not in keys]
    if unknown:
        raise ValueError(f"cannot freeze {unknown[0]!r}: not a weight of this model (its weights: {', '.join(keys)}).")
    if section.architecture == "simplified":
        last = f"blocks.{section.n_layers - 1}."
        train = ["blocks.0.attn.W_K", last + "attn.W_K", last + "attn.W_O"]
        if not section.attn_only:
            train += [last + "mlp.W_in", last + "mlp.W_out"]
    else:
        train = [k for k in keys if not k.split(".")[-1].startswith("b_")]  # biases stay zero: the authors' have none
    return [k for k in train if k not in frozen]
