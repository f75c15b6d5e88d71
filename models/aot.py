"""Models of the memorisation tasks (Dana et al.): a one-layer attention-only transformer
with trainable token and positional embeddings and unembedding, or the comparison model
(one head followed by a GELU MLP). Weights use the HookedTransformer state-dict keys of
../shared/CHECKPOINT_FORMAT.md; biases are zero and frozen, so the trainable parameters
are the paper's d(S + 2N + 4 H d_h) (+ 2 m d for the MLP).

Models of different sizes are trained as one stack: each tensor is zero-padded to the
largest size along a leading model axis [K, ...] and multiplied by a 0/1 mask in the
forward, so the padding never receives a gradient and model k computes exactly its own
function (tests/test_aot.py pins the padded forward to the TransformerBridge model).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import einsum

from models.checkpoint import CheckpointError, read_envelope, read_weights
from models.weights import ATTN, MLP, shapes
from probe.association import SequenceTask, task_from_config

BIASES = (ATTN + "b_Q", ATTN + "b_K", ATTN + "b_V", ATTN + "b_O", MLP + "b_in", MLP + "b_out", "unembed.b_U")


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class AoTModelConfig:
    d_model: int = _f(10, "d, embedding dimension")
    n_heads: int = _f(1, "H, number of attention heads")
    d_head: int = _f(10, "d_h, head dimension")
    d_mlp: int = _f(0, "m, MLP width after the heads (0: attention-only)")
    act_fn: str = _f("gelu", "MLP non-linearity (the paper's GELU, or relu)")

    @property
    def attn_only(self) -> bool:
        return self.d_mlp == 0

    def validate(self) -> None:
        for name in ("d_model", "n_heads", "d_head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if isinstance(self.d_mlp, bool) or not isinstance(self.d_mlp, int) or self.d_mlp < 0:
            raise ValueError(f"d_mlp must be an integer >= 0, got {self.d_mlp!r}.")
        if self.act_fn not in ("gelu", "relu"):
            raise ValueError(f"act_fn must be 'gelu' or 'relu', got {self.act_fn!r}.")

    def checkpoint_section(self, task: SequenceTask) -> dict:
        """The `model` section of config.json (TransformerLens field names)."""
        self.validate()
        return {"n_layers": 1, "d_model": self.d_model, "n_heads": self.n_heads, "d_head": self.d_head,
                "d_mlp": None if self.attn_only else self.d_mlp, "attn_only": self.attn_only,
                "act_fn": self.act_fn, "normalization_type": None, "n_ctx": task.seq_len,
                "d_vocab": task.d_vocab, "d_vocab_out": task.d_vocab_out, "attention": "softmax",
                "positional_embedding": "trainable"}

    def parameters(self, task: SequenceTask) -> int:
        """Trainable parameters: d(S + 2N) embeddings, 4 H d_h d attention, 2 m d MLP."""
        d = self.d_model
        return d * (task.seq_len + 2 * task.n_tokens) + 4 * self.n_heads * self.d_head * d + 2 * self.d_mlp * d

    @property
    def name(self) -> str:
        return f"d{self.d_model}_H{self.n_heads}_dh{self.d_head}" + (f"_m{self.d_mlp}" if self.d_mlp else "")


def init_weights(model: AoTModelConfig, task: SequenceTask, seed: int) -> dict[str, torch.Tensor]:
    """One model's initial weights (CPU, float32, true shapes): N(0, 1) token and positional
    embeddings (as torch.nn.Embedding), N(0, 1/fan_in) matrices, zero biases."""
    section = model.checkpoint_section(task)
    g = torch.Generator().manual_seed(seed)
    w = {key: torch.zeros(shape) for key, shape in shapes(section).items()}
    d, H, dh = model.d_model, model.n_heads, model.d_head
    fan_in = {"embed.W_E": 1, "pos_embed.W_pos": 1, ATTN + "W_Q": d, ATTN + "W_K": d, ATTN + "W_V": d,
              ATTN + "W_O": H * dh, "unembed.W_U": d}
    if not model.attn_only:
        fan_in.update({MLP + "W_in": d, MLP + "W_out": model.d_mlp})
    for key, n_in in fan_in.items():
        w[key] = torch.randn(w[key].shape, generator=g) / math.sqrt(n_in)
    return w


@dataclass
class Stack:
    """K models of possibly different sizes, zero-padded to the largest along each axis."""

    weights: dict[str, torch.Tensor]  # [K, *max shape]
    masks: dict[str, torch.Tensor]  # [K, *max shape], 1 where model k has the entry
    score_scale: torch.Tensor  # [K] 1/sqrt(d_head) of each model
    shapes: list[dict[str, tuple[int, ...]]]  # each model's true shapes
    act_fn: str

    def effective(self) -> dict[str, torch.Tensor]:
        """The weights each model computes with (padding zeroed)."""
        return {k: w * self.masks[k] for k, w in self.weights.items()}

    def model(self, k: int, weights: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Model k's checkpoint dict (its true shapes, CPU, contiguous)."""
        weights = self.weights if weights is None else weights
        return {key: weights[key][k][tuple(slice(0, n) for n in shape)].detach().to("cpu").contiguous()
                for key, shape in self.shapes[k].items()}

    def to(self, device) -> Stack:
        return Stack({k: v.to(device) for k, v in self.weights.items()}, {k: v.to(device) for k, v in self.masks.items()},
                     self.score_scale.to(device), self.shapes, self.act_fn)


def stack_models(models: list[dict[str, torch.Tensor]], sections: list[dict]) -> Stack:
    """Pad K checkpoint dicts (with their config.json model sections) into one Stack."""
    acts = {s["act_fn"] for s in sections if not s.get("attn_only")}
    if len(acts) > 1:
        raise ValueError(f"one stack needs one MLP non-linearity, got {sorted(acts)}.")
    model_shapes = [shapes(s) for s in sections]
    widths = [s.get("d_mlp") or 0 for s in sections]
    biggest = shapes({**sections[0], **{k: max(s[k] for s in sections) for k in ("d_model", "n_heads", "d_head")},
                      "attn_only": max(widths) == 0, "d_mlp": max(widths)})  # every axis at its largest
    weights = {key: torch.zeros(len(models), *shape) for key, shape in biggest.items()}
    masks = {key: torch.zeros(len(models), *shape) for key, shape in biggest.items()}
    for k, (w, s) in enumerate(zip(models, model_shapes)):
        for key, shape in s.items():
            index = (k, *(slice(0, n) for n in shape))
            weights[key][index] = w[key]
            masks[key][index] = 1.0
    scale = torch.tensor([1 / math.sqrt(s["d_head"]) for s in sections])
    return Stack(weights, masks, scale, model_shapes, acts.pop() if acts else "gelu")


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


# --------------------------------------------------------------------------- checkpoints
def read_config(ckpt: str | Path) -> tuple[dict, SequenceTask]:
    """config.json of an association or distribution checkpoint, validated, and its task."""
    config = read_envelope(ckpt)
    path = Path(ckpt) / "config.json"
    model = config["model"]
    try:
        task = task_from_config(config["task"])
        AoTModelConfig(model["d_model"], model["n_heads"], model["d_head"], model.get("d_mlp") or 0,
                       model.get("act_fn", "gelu")).validate()
    except ValueError as e:
        raise CheckpointError(f"{path}: {str(e).splitlines()[0]}") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: malformed model or task section ({type(e).__name__}: {e}).") from None
    expected = {"n_layers": 1, "normalization_type": None, "n_ctx": task.seq_len, "d_vocab": task.d_vocab,
                "d_vocab_out": task.d_vocab_out}
    for key, value in expected.items():
        if model.get(key, "absent") != value:
            raise CheckpointError(f"{path}: model.{key} is {model.get(key, 'absent')!r}, expected {value!r} for {task}.")
    if model.get("attention", "softmax") != "softmax":
        raise CheckpointError(f"{path}: only softmax attention is supported for {task.kind} checkpoints.")
    return config, task


def load(ckpt: str | Path, device: str = "auto"):
    """(TransformerBridge, task) for an association or distribution checkpoint."""
    from models.bridge import build_bridge, resolve_device

    config, task = read_config(ckpt)
    weights = read_weights(Path(ckpt) / "model.safetensors", config["model"])
    return build_bridge(config["model"], weights, resolve_device(device)), task
