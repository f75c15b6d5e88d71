"""Weights of the factual-recall models: shapes, initialisation, trainable keys, stacks.

Weights use the HookedTransformer state-dict keys (`blocks.0.attn.W_Q`, ...; their prefixes
ATTN and MLP, the bias keys and their shapes are models.section's, shared by every family). A
*stack* maps each key to a tensor [K, *shape]: K models trained at once. `model_weights(stack, k)`
is model k's plain checkpoint dict.
"""
from __future__ import annotations

import math

import torch

from models.recall import parameterisation as param
from models.recall.config import ModelConfig
from models.section import ATTN, BIASES, MLP, ModelSection, in_layer, shapes
from tasks.factual_recall import FactualRecallTask

# Written to the residual stream at random and never trained (paper section 2).
FROZEN = ("embed.W_E", "pos_embed.W_pos", "unembed.W_U", "unembed.b_U")
# Biases (models.section.BIASES) are zero and stay zero (the paper counts 4*H*d_h*d attention and
# 2*m*d MLP parameters), but for two of the authors' departures: b_O cancels the EOS embedding
# (frozen), b_in is trained.
OV = (ATTN + "W_V", ATTN + "b_V", ATTN + "W_O", ATTN + "b_O")


def random_directions(n: int, d: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    """n random vectors in R^d [n, d]: unit-norm ("sphere") or N(0, 1/d) entries ("gaussian")."""
    x = torch.randn(n, d, generator=generator)
    if kind == "sphere":
        return x / x.norm(dim=-1, keepdim=True)
    if kind == "gaussian":
        return x / math.sqrt(d)
    raise ValueError(f"embedding must be 'sphere' or 'gaussian', got {kind!r}.")


def init_weights(cfg: ModelConfig, task: FactualRecallTask, seed: int) -> dict[str, torch.Tensor]:
    """One model's initial weights (CPU, float32): frozen embeddings and unembedding (random,
    one-hot, or random tokens with answers on their own axes), zero positional embedding and biases,
    trainable matrices N(0, init_scale^2/fan_in) or constant init_scale; merged attention weights
    fix W_Q and W_V. The parameterisation's departures (models/recall/parameterisation.py) change
    the scales, the MLP's distribution and the first block's b_O. Blocks are drawn in order, block
    0 first: a one-layer model's weights are those of every L-layer model's block 0."""
    cfg = cfg.for_task(task)
    g = torch.Generator().manual_seed(seed)
    d = cfg.d_model
    w = {key: torch.zeros(shape) for key, shape in shapes(cfg.checkpoint_section(task)).items()}
    if cfg.embedding == "onehot":
        V, O = task.d_vocab, task.d_vocab_out
        w["embed.W_E"] = torch.eye(V, d)  # token z on axis z
        w["unembed.W_U"] = torch.eye(d, V + O)[:, V:].contiguous()  # answer a read from axis V + a
    elif cfg.readout == "direct":  # tokens on the first d - O axes, answer a read from axis d - O + a
        O = task.d_vocab_out
        w["embed.W_E"][:, :d - O] = random_directions(task.d_vocab, d - O, cfg.embedding, g)
        w["unembed.W_U"] = torch.eye(d)[:, d - O:].contiguous()
    else:
        w["embed.W_E"] = random_directions(task.d_vocab, d, cfg.embedding, g)
        w["unembed.W_U"] = random_directions(task.d_vocab_out, d, cfg.embedding, g).T.contiguous()
    for layer in range(cfg.n_layers):  # block 0 draws first, as the one-layer model always did
        _init_block(w, cfg, layer, g)
    if "residual" in cfg.departures:
        # the last position's residual after attention is then the attention output alone, so
        # the MLP and the unembedding read `attn @ O` as in the official code
        w[ATTN + "b_O"] = -(w["embed.W_E"][task.eos] + w["pos_embed.W_pos"][-1])
    return w


def _init_block(w: dict[str, torch.Tensor], cfg: ModelConfig, layer: int, g: torch.Generator) -> None:
    """Block `layer`'s trainable matrices drawn into `w` in DRAW_ORDER (merged attention's
    fixed W_Q and W_V set)."""
    d, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    departures = cfg.departures
    qkv_fan_in = dh if "qkv_init" in departures else d
    fan_in = {ATTN + "W_Q": qkv_fan_in, ATTN + "W_K": qkv_fan_in, ATTN + "W_V": qkv_fan_in,
              ATTN + "W_O": d if "o_init" in departures else H * dh}
    if cfg.attention_weights == "merged":
        # q = sqrt(d_head) x_t cancels the scores' 1/sqrt(d_head): score_j = x_j W_K x_t, so W_K
        # is the paper's key-query matrix (transposed); v = x, so W_O is its output-value matrix.
        w[in_layer(ATTN + "W_Q", layer)] = math.sqrt(dh) * torch.eye(d).expand(H, d, d).clone()
        w[in_layer(ATTN + "W_V", layer)] = torch.eye(d).expand(H, d, d).clone()
        del fan_in[ATTN + "W_Q"], fan_in[ATTN + "W_V"]
    if not cfg.attn_only:
        fan_in.update({MLP + "W_in": d, MLP + "W_out": cfg.d_mlp})
    for key in DRAW_ORDER[param.base(cfg.parameterisation)]:
        if key not in fan_in:
            continue
        at = in_layer(key, layer)
        if key.startswith(MLP) and "mlp_init" in departures:
            std = 1 / math.sqrt(fan_in[key]) / TRUNCATED_STD  # flax's lecun_normal, init_scale not applied
            torch.nn.init.trunc_normal_(w[at], std=std, a=-2 * std, b=2 * std, generator=g)
        elif cfg.init == "constant":
            w[at] = torch.full(w[at].shape, cfg.init_scale)
        else:
            w[at] = torch.randn(w[at].shape, generator=g) * (cfg.init_scale / math.sqrt(fan_in[key]))


# The order in which each base draws its trainable matrices: fixed, so that a seed gives the
# same standard and authors' models as it always did.
DRAW_ORDER = {
    "standard": (ATTN + "W_K", ATTN + "W_O", ATTN + "W_Q", ATTN + "W_V", MLP + "W_in", MLP + "W_out"),
    "authors": (ATTN + "W_Q", ATTN + "W_K", ATTN + "W_V", ATTN + "W_O", MLP + "W_in", MLP + "W_out"),
}
# flax's lecun_normal: a normal truncated at two standard deviations, rescaled to variance 1/fan_in
TRUNCATED_STD = 0.87962566103423978  # the standard deviation of N(0, 1) truncated to [-2, 2]


def trainable_keys(weights: dict, cfg: ModelConfig | None = None, freeze_ov: bool = False) -> list[str]:
    """The keys the optimizer updates: attention and MLP matrices (OV too unless frozen;
    W_Q and W_V stay fixed when the attention weights are merged), and the MLP's input bias
    where the parameterisation trains it (`mlp_bias`)."""
    frozen = set(FROZEN) | set(BIASES) | (set(OV) if freeze_ov else set())
    if cfg is not None and "mlp_bias" in cfg.departures:
        frozen.discard(MLP + "b_in")
    if cfg is not None and cfg.attention_weights == "merged":
        frozen |= {ATTN + "W_Q", ATTN + "W_V"}
    return [key for key in weights if first_block(key) not in frozen]


def first_block(key: str) -> str:
    """Block l's key named as block 0's ('blocks.2.mlp.W_in' -> 'blocks.0.mlp.W_in'): what a rule for
    every block matches."""
    return "blocks.0." + key.split(".", 2)[2] if key.startswith("blocks.") else key


def stack(models: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """K checkpoint dicts -> one stack [K, ...]."""
    return {key: torch.stack([m[key] for m in models]) for key in models[0]}


def model_weights(weights: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Model k of a stack, as a contiguous CPU checkpoint dict."""
    return {key: t[k].detach().to("cpu").contiguous() for key, t in weights.items()}


def parameter_count(section: ModelSection) -> dict[str, int]:
    """The paper's counts: attention 4*H*d_h*d, MLP 2*m*d (0 when attention-only), per layer."""
    attention = 4 * section.n_heads * section.d_head * section.d_model * section.n_layers
    mlp = 2 * section.mlp_width * section.d_model * section.n_layers
    return {"attention": attention, "mlp": mlp, "total": attention + mlp}
