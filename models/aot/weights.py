"""Weights of the memorisation tasks' models (Dana et al.): shapes, initialisation, the dana
head layout and its conversion to TransformerLens weights, padded stacks of K models.

The model (models.aot.config.AoTModelConfig) is a one-layer attention-only transformer with
trainable token and positional embeddings and unembedding, or the comparison model (one
head followed by a GELU MLP), in one of two head layouts:

- `standard` (the paper's equations): each head has its own W_Q, W_K, W_V [d, d_h] and W_O
  [d_h, d] on the d-dimensional residual stream, positions are d-dimensional. Weights use
  the HookedTransformer state-dict keys of docs/checkpoint_format.md; biases are zero
  and frozen, so the trainable parameters are the paper's d(S + 2N + 4 H d_h) (+ 2 m d).
- `dana` (the authors' code): one shared map W_C [d, d_h] compresses the token embedding,
  a d_h-dimensional positional embedding is added after it, H single-head attentions
  (each like torch's nn.MultiheadAttention(d_h, 1): its own [d_h, d_h] query, key, value
  and output maps with biases) read that same input with scores scaled by 1/sqrt(d_h),
  their outputs are summed in d_h space and one shared map W_D [d_h, d] decompresses them
  into the residual stream, which holds the token embedding (positions never enter it) and
  is read by the unembedding. Trained in its own parametrisation (`dana.*` keys, PyTorch's
  default initialisations) and saved as the exact TransformerLens model of
  `to_transformer_lens` (d_model = d + d_h: see there what is represented).

Models of different sizes are trained as one stack: each tensor is zero-padded to the
largest size along a leading model axis [K, ...] and multiplied by a 0/1 mask in the
forward (models.aot.forward), so the padding never receives a gradient and model k computes
exactly its own function (tests/test_aot_models.py pins the padded forward to the TransformerBridge
model).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from einops import einsum

from models.aot.config import AoTModelConfig
from models.section import ATTN, BIASES, MLP, ModelSection, shapes
from tasks.association import SequenceTask

FROZEN_BIASES = BIASES + ("unembed.b_U",)  # the standard layout's biases, all zero and never trained


def init_aot_weights(cfg: AoTModelConfig, task: SequenceTask, seed: int) -> dict[str, torch.Tensor]:
    """One model's initial weights in its layout's trainable parametrisation (CPU, float32,
    true shapes). standard: N(0, 1) token and positional embeddings (as torch.nn.Embedding),
    N(0, 1/fan_in) matrices, zero biases (HookedTransformer keys). dana: `init_dana`."""
    if cfg.dana:
        return init_dana(cfg, task, seed)
    g = torch.Generator().manual_seed(seed)
    w = {key: torch.zeros(shape) for key, shape in shapes(cfg.checkpoint_section(task)).items()}
    d, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    fan_in = {"embed.W_E": 1, "pos_embed.W_pos": 1, ATTN + "W_Q": d, ATTN + "W_K": d, ATTN + "W_V": d,
              ATTN + "W_O": H * dh, "unembed.W_U": d}
    if not cfg.attn_only:
        fan_in.update({MLP + "W_in": d, MLP + "W_out": cfg.d_mlp})
    for key, n_in in fan_in.items():
        w[key] = torch.randn(w[key].shape, generator=g) / math.sqrt(n_in)
    return w


# --------------------------------------------------------------------------- the dana layout
def dana_shapes(section: ModelSection) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the dana layout's own parameters, for a model section; every map is
    written x @ W (input rows, output columns), as TransformerLens does."""
    d, H, dh = section.d_embed, section.n_heads, section.d_head
    out = {"dana.W_E": (section.d_vocab, d), "dana.W_pos": (section.n_ctx, dh), "dana.W_C": (d, dh),
           "dana.W_Q": (H, dh, dh), "dana.W_K": (H, dh, dh), "dana.W_V": (H, dh, dh),
           "dana.b_Q": (H, dh), "dana.b_K": (H, dh), "dana.b_V": (H, dh),
           "dana.W_O": (H, dh, dh), "dana.b_O": (H, dh), "dana.W_D": (dh, d), "dana.W_U": (d, section.d_vocab_out)}
    if not section.attn_only:
        out.update({"dana.W_in": (d, section.d_mlp), "dana.W_out": (section.d_mlp, d)})
    return out


def layout_shapes(section: ModelSection) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the trainable parametrisation of a model section's head layout."""
    return dana_shapes(section) if section.dana else shapes(section)


def init_dana(cfg: AoTModelConfig, task: SequenceTask, seed: int) -> dict[str, torch.Tensor]:
    """PyTorch's default initialisations of the authors' modules: nn.Embedding N(0, 1) token
    and positional embeddings; nn.Linear U(+-1/sqrt(fan_in)) compression, decompression,
    unembedding and MLP weights (no biases; the MLP's stay zero as in the standard layout);
    per head an nn.MultiheadAttention(d_h, 1): query, key and value maps Xavier-uniform over
    the packed [3 d_h, d_h] in_proj, U(+-sqrt(6 / (4 d_h))), output map U(+-1/sqrt(d_h)),
    all four biases zero (and trained)."""
    g = torch.Generator().manual_seed(seed)
    dh = cfg.d_head
    w = {}
    for key, shape in dana_shapes(cfg.checkpoint_section(task)).items():
        if key in ("dana.W_E", "dana.W_pos"):
            w[key] = torch.randn(shape, generator=g)
        elif key.startswith("dana.b_"):
            w[key] = torch.zeros(shape)
        else:
            fan_in = shape[-2]  # x @ W: rows are the inputs
            bound = math.sqrt(6 / (4 * dh)) if key in ("dana.W_Q", "dana.W_K", "dana.W_V") else 1 / math.sqrt(fan_in)
            w[key] = (2 * torch.rand(shape, generator=g) - 1) * bound
    return w


def to_transformer_lens(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The dana layout's weights `w` (leading axes [...] allowed: a stack) as the exact
    standard one-layer TransformerLens model with d_model = d + d_h, differentiably.

    Residual coordinates 0..d-1 are the authors' d-dimensional stream: the token embedding,
    the heads' decompressed sum (W_O^h = O_h W_D, b_O = sum_h b_O^h W_D), the MLP, and all
    that the unembedding reads. Coordinates d..d+d_h-1 carry the d_h-dimensional positional
    embedding and nothing else: only the queries, keys and values read them (W_Q^h =
    [W_C Q_h; Q_h], same for K, V), nothing writes there and W_U ignores them. So every
    logit, pattern, q, k, v, z and head output equals the layout's own, at every position.

    Why not d_model = d: that needs W_pos [S, d] with W_pos W_C = the d_h-dimensional
    positions, possible only when d >= d_h (W_pos = P W_C^+, W_C of rank d_h), and W_pos then
    also reaches the unembedding; b_U = -W_pos[S-1] W_U cancels that at the last position only.
    With d < d_h (appendix B: d = 2, d_h = 5) no d-dimensional W_pos reproduces the positions."""
    C, D = w["dana.W_C"], w["dana.W_D"]  # [..., d, dh], [..., dh, d]
    d, dh = C.shape[-2:]
    lead = C.shape[:-2]  # the stack's model axis, if any
    out = {"embed.W_E": F.pad(w["dana.W_E"], (0, dh)), "pos_embed.W_pos": F.pad(w["dana.W_pos"], (d, 0))}
    for name in "QKV":
        own = w[f"dana.W_{name}"]  # [..., H, dh, dh]
        out[ATTN + f"W_{name}"] = torch.cat([einsum(C, own, "... d e, ... h e f -> ... h d f"), own], -2)
        out[ATTN + f"b_{name}"] = w[f"dana.b_{name}"]
    # [..., H, dh, d + dh]
    out[ATTN + "W_O"] = F.pad(einsum(w["dana.W_O"], D, "... h e f, ... f d -> ... h e d"), (0, dh))
    # the sum of the heads' biases
    out[ATTN + "b_O"] = F.pad(einsum(w["dana.b_O"], D, "... h f, ... f d -> ... d"), (0, dh))
    if "dana.W_in" in w:
        m = w["dana.W_in"].shape[-1]
        out[MLP + "W_in"] = F.pad(w["dana.W_in"], (0, 0, 0, dh))  # [..., d + dh, m]
        out[MLP + "b_in"] = C.new_zeros(*lead, m)
        out[MLP + "W_out"] = F.pad(w["dana.W_out"], (0, dh))
        out[MLP + "b_out"] = C.new_zeros(*lead, d + dh)
    out["unembed.W_U"] = F.pad(w["dana.W_U"], (0, 0, 0, dh))  # [..., d + dh, N]
    out["unembed.b_U"] = C.new_zeros(*lead, w["dana.W_U"].shape[-1])
    return out


@dataclass
class Stack:
    """K models of one head layout and possibly different sizes, in that layout's trainable
    parametrisation, zero-padded to the largest along each axis."""

    weights: dict[str, torch.Tensor]  # [K, *max shape]
    masks: dict[str, torch.Tensor]  # [K, *max shape], 1 where model k has the entry
    score_scale: torch.Tensor  # [K] 1/sqrt(d_head) of each model
    shapes: list[dict[str, tuple[int, ...]]]  # each model's true shapes
    act_fn: str
    head_layout: str = "standard"

    def effective(self) -> dict[str, torch.Tensor]:
        """The weights each model computes with (padding zeroed)."""
        return {k: w * self.masks[k] for k, w in self.weights.items()}

    def transformer_lens(self) -> dict[str, torch.Tensor]:
        """The effective weights as stacked HookedTransformer weights (models.aot.forward.population_logits' input)."""
        w = self.effective()
        return to_transformer_lens(w) if self.head_layout == "dana" else w

    def trainable(self) -> list[str]:
        """Keys trained: the standard layout's biases stay zero; every dana parameter trains."""
        if self.head_layout == "dana":
            return list(self.weights)
        return [k for k in self.weights if k not in FROZEN_BIASES]

    def model(self, k: int, weights: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Model k's weights in its own parametrisation (true shapes, CPU, contiguous)."""
        weights = self.weights if weights is None else weights
        return {key: weights[key][k][tuple(slice(0, n) for n in shape)].detach().to("cpu").contiguous()
                for key, shape in self.shapes[k].items()}

    def checkpoint(self, k: int, weights: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Model k's checkpoint dict: HookedTransformer keys (the dana layout converted)."""
        w = self.model(k, weights)
        return to_transformer_lens(w) if self.head_layout == "dana" else w

    def to(self, device) -> Stack:
        return Stack({k: v.to(device) for k, v in self.weights.items()},
                     {k: v.to(device) for k, v in self.masks.items()},
                     self.score_scale.to(device), self.shapes, self.act_fn, self.head_layout)


def stack_models(models: list[dict[str, torch.Tensor]], sections: list[ModelSection]) -> Stack:
    """Pad K models' weights (in their layout's parametrisation, with their model sections)
    into one Stack."""
    acts = {s.act_fn for s in sections if not s.attn_only}
    if len(acts) > 1:
        raise ValueError(f"one stack needs one MLP non-linearity, got {sorted(acts)}.")
    layouts = {s.head_layout for s in sections}
    if len(layouts) > 1:
        raise ValueError(f"one stack needs one head layout, got {sorted(layouts)}.")
    model_shapes = [layout_shapes(s) for s in sections]
    width = max(s.mlp_width for s in sections)
    sizes = {k: max(getattr(s, k) for s in sections) for k in ("d_model", "n_heads", "d_head")}
    if sections[0].dana:
        sizes["d_embed"] = max(s.d_embed for s in sections)
    biggest = layout_shapes(replace(sections[0], **sizes, attn_only=width == 0, d_mlp=width or None))
    dtype = next(iter(models[0].values())).dtype
    weights = {key: torch.zeros(len(models), *shape, dtype=dtype) for key, shape in biggest.items()}
    masks = {key: torch.zeros(len(models), *shape, dtype=dtype) for key, shape in biggest.items()}
    for k, (w, s) in enumerate(zip(models, model_shapes)):
        for key, shape in s.items():
            index = (k, *(slice(0, n) for n in shape))
            weights[key][index] = w[key]
            masks[key][index] = 1.0
    scale = torch.tensor([1 / math.sqrt(s.d_head) for s in sections], dtype=dtype)
    return Stack(weights, masks, scale, model_shapes, acts.pop() if acts else "gelu", layouts.pop())
