"""The trainer's fast forward: last-position logits of K stacked one-layer models (deeper ones:
models/cores/deep.py).

The loss reads only the last position, and a one-layer model's keys and values depend on a
position only through its token and its positional embedding. So instead of projecting
every position (batch x T x d work), we project the vocabulary once (key and value tables
per head) and move scalars: the last query's scores are gathered from a [batch, vocab]
table per head, and the attention weights are summed per vocabulary entry (a scatter)
before one product with the value table; a positional embedding adds its own small
[head, T] tables (skipped when W_pos is zero, as in our models). No batch x T x d
activation is materialised.

Layout, measured on a 2-core CPU at config A (B = 1024, V = 129, d_head = 8): a product
whose output has d_head = 8 columns ([B, V] x [V, 8]) runs at a quarter of the speed of the
same product written with d_head as rows ([8, V] x [V, B]). So queries, key and value tables
and head outputs are kept transposed, [K, head, d_head, batch | vocab], and the attention
core (`VocabAttention`) has a hand-written backward that writes every gradient product in
that fast form and reuses the [batch, vocab] buffers instead of filling new ones; autograd's
own backward of the same forward picks the slow forms. Also measured and not kept: a
bag-of-tokens softmax over the vocabulary (slower at V = 129, T = 32), W_Q folded into the
key table (8x the FLOPs), gathering per-token key vectors (its backward is a large scatter),
the value mix as F.embedding_bag with the pattern as per-sample weights (exact, and 10x
slower: its CPU backward), one flat Adam buffer for all parameters (1% of the step).

On a GPU the [K, H, B, V] buffer is the step's cost: at 169 stacked models of the trade-off
grid's largest cell it is 2.9 GB, passed over about fourteen times a step. There the attention
core is `models.cores.fused_attention.FusedAttention` (Triton kernels that walk each prompt's tokens
and never write that buffer); `attention_core` chooses (`CORES`, `choose_core`).

Same math as TransformerLens (tests/test_parity.py pins the logits to the TransformerBridge
model to 1e-5 and the gradients to autograd's); analyses never use this, they use the
model's hooks.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

from models.cores import fused_attention
from models.cores.deep import deep_last_position_logits
from models.section import ATTN, MLP, attn

CORES = ("auto", "vocab", "fused")  # the attention core: chosen by rule, per vocabulary entry, per token


def has_positions(w: dict[str, torch.Tensor]) -> bool:
    """Whether the stack has a non-zero positional embedding (one host sync: call it once
    per run, not per step)."""
    return bool(w["pos_embed.W_pos"].any())


class VocabAttention(torch.autograd.Function):
    """The last query's attention over the prompt, scored and mixed per vocabulary entry.

    q [K, H, e, B] (already scaled), key and value tables [K, H, e, V], token index
    [K, H, B, T] (the prompt's tokens, expanded over heads), optional positional scores
    [K, H, B, T]; returns the head outputs z [K, H, e, B] and the pattern [K, H, B, T]
    (softmax over positions, or the raw scores for linear attention).

    One [K, H, B, V] buffer serves the whole step: scores, then pattern_vocab in the
    forward, then d_pattern_vocab and d_scores_vocab in the backward (fresh buffers of
    this size measured 30% slower for the attention). So the backward runs once per forward:
    a second one (retain_graph) raises instead of reading an overwritten buffer."""

    @staticmethod
    def forward(ctx, q, key, value, index, score_pos, linear: bool):
        scores_vocab = q.transpose(-1, -2) @ key  # [K, H, B, V]
        scores = scores_vocab.gather(-1, index)  # [K, H, B, T]
        if score_pos is not None:
            scores = scores + score_pos
        pattern = scores if linear else scores.softmax(-1)  # [K, H, B, T]
        pattern_vocab = scores_vocab.zero_().scatter_add_(-1, index, pattern)  # [K, H, B, V], same buffer
        z = value @ pattern_vocab.transpose(-1, -2)  # [K, H, e, B]
        ctx.save_for_backward(q, key, value, index, pattern)
        ctx.pattern_vocab = pattern_vocab  # an intermediate: the backward reuses its memory
        ctx.linear, ctx.positional = linear, score_pos is not None
        ctx.set_materialize_grads(False)
        return z, pattern

    @staticmethod
    def backward(ctx, d_z, d_pattern):
        if ctx.pattern_vocab is None:
            raise RuntimeError("VocabAttention's backward runs once per forward (retain_graph is not supported).")
        buffer, ctx.pattern_vocab = ctx.pattern_vocab, None  # [K, H, B, V]
        if d_z is None and d_pattern is None:
            return None, None, None, None, None, None
        q, key, value, index, pattern = ctx.saved_tensors
        d_value = None
        if d_z is None:
            d_pattern_total = d_pattern  # [K, H, B, T]
        else:
            if ctx.needs_input_grad[2]:
                d_value = d_z @ buffer  # [K, H, e, V] (buffer holds pattern_vocab)
            d_pattern_vocab = torch.matmul(d_z.transpose(-1, -2), value, out=buffer)  # [K, H, B, V]
            d_pattern_total = d_pattern_vocab.gather(-1, index)  # [K, H, B, T]
            if d_pattern is not None:
                d_pattern_total = d_pattern_total + d_pattern
        if ctx.linear:
            d_scores = d_pattern_total  # [K, H, B, T]
        else:  # p * (dp - <p, dp>) in one fused kernel (25x faster here than four elementwise ops)
            d_scores = torch._softmax_backward_data(d_pattern_total, pattern, -1, pattern.dtype)
        d_scores_vocab = buffer.zero_().scatter_add_(-1, index, d_scores)  # [K, H, B, V]
        d_query = key @ d_scores_vocab.transpose(-1, -2) if ctx.needs_input_grad[0] else None  # [K, H, e, B]
        d_key = q @ d_scores_vocab if ctx.needs_input_grad[1] else None  # [K, H, e, V]
        return d_query, d_key, d_value, None, d_scores if ctx.positional else None, None


MEASURED = Path(__file__).resolve().parents[2] / "results" / "gpu" / "measured.json"  # scripts/gpu_run.sh's


@functools.cache
def measured_cores() -> tuple[tuple[int, str], ...]:
    """The faster attention core of each bench line a GPU measured with both (MEASURED, read
    once: analyses.sweeps.gpu_records), by the line's [K, H, B, V] elements; () where none."""
    try:
        lines = json.loads(MEASURED.read_text()).values()
    except (OSError, ValueError, AttributeError):
        return ()
    both = [line for line in lines if isinstance(line, dict) and line.get("buffer_elements")
            and {"vocab", "fused"} <= set(line.get("steps_per_second", {}))]
    return tuple((line["buffer_elements"], max(("vocab", "fused"), key=line["steps_per_second"].get)) for line in both)


def choose_core(core: str, device: torch.device, elements: int | None = None) -> type[torch.autograd.Function]:
    """The attention core for `core` (one of CORES) on `device`. "auto": on CUDA, the core the
    GPU's measured record found faster at the bench line nearest in [K, H, B, V] `elements`
    to this step (the fused per-token core moves the pattern, not that buffer); the vocabulary
    core where no line measured both, and on every other device (on the CPU it is the faster:
    bench/README.md). "fused" asks for it (Triton on CUDA, or Triton's interpreter on the CPU)."""
    if core not in CORES:
        raise ValueError(f"attention core must be one of {', '.join(CORES)}, got {core!r}.")
    if core == "auto":
        lines = measured_cores() if device.type == "cuda" and elements and fused_attention.runs_on(device) else ()
        core = min(lines, key=lambda line: abs(math.log(line[0] / elements)))[1] if lines else "vocab"
    return fused_attention.FusedAttention if core == "fused" else VocabAttention


def _heads_transposed(W: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor,
                      scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Per-head projections with d_head as rows, scaled: (x W + b) * scale for
    W [K, H, d, e], b [K, H, e] (or None), x [K, n, d] -> [K, H, e, n]; the scale is one
    number or one per model ([K, 1, 1]). It goes on the small weight and bias, so the
    [.., n] output is written once; a scale of 1.0 multiplies nothing (x * 1.0 is x: two
    kernels fewer, forward and backward)."""
    K, H, d, e = W.shape
    weight = W.transpose(-1, -2).reshape(K, H * e, d)  # [K, H e, d]
    bias = None if b is None else b.reshape(K, H * e, 1)  # [K, H e, 1]
    if not (isinstance(scale, float) and scale == 1.0):
        weight, bias = weight * scale, None if b is None else bias * scale
    x_t = x.transpose(-1, -2)  # [K, d, n]
    out = weight @ x_t if b is None else torch.baddbmm(bias, weight, x_t)
    return out.view(K, H, e, x.shape[1])


def last_position_logits(w: dict[str, torch.Tensor], tokens: torch.Tensor, attention: str = "softmax",
                         positional: bool | None = None, query_scale: torch.Tensor | None = None,
                         attention_core: str = "auto") -> torch.Tensor:
    """Logits at the last position [K, batch, d_vocab_out] for a stack `w` ([K, ...]
    tensors) on tokens [K, batch, T]. `positional` says whether W_pos is non-zero (None:
    look, which costs a host sync). `query_scale` [K] is each model's 1/sqrt(d_head) when
    the stack zero-pads heads of different sizes (models.recall.shape_stack); None: the stack's
    own d_head. `attention_core`: one of CORES (choose_core). A stack of L-layer models (L >= 2,
    no padded heads) runs models.cores.deep, with no attention core of its own."""
    if attn(1) + "W_Q" in w:
        if query_scale is not None or attention_core == "fused":
            raise ValueError("a stack of padded head sizes, and the fused attention core, take one-layer models only.")
        return deep_last_position_logits(w, tokens, attention, has_positions(w) if positional is None else positional)
    E = w["embed.W_E"]  # [K, V, d]
    K, B, T = tokens.shape
    H, d_head = w[ATTN + "W_Q"].shape[1], w[ATTN + "W_Q"].shape[-1]
    if positional is None:
        positional = has_positions(w)

    x_last = torch.gather(E, 1, tokens[:, :, -1, None].expand(K, B, E.shape[-1]))  # [K, B, d]
    if positional:
        x_last = x_last + w["pos_embed.W_pos"][:, -1, None]
    # The scores' 1/sqrt(d_head) goes on the query, not on the [K, H, B, V] scores;
    # b_K and b_V are the same at every position: they belong in the vocabulary tables.
    scale = 1 / math.sqrt(d_head) if query_scale is None else query_scale.view(K, 1, 1)
    q = _heads_transposed(w[ATTN + "W_Q"], w[ATTN + "b_Q"], x_last, scale)  # [K, H, e, B]
    key = _heads_transposed(w[ATTN + "W_K"], w[ATTN + "b_K"], E)  # [K, H, e, V]
    value = _heads_transposed(w[ATTN + "W_V"], w[ATTN + "b_V"], E)  # [K, H, e, V]
    index = tokens[:, None].expand(K, H, B, T)  # [K, H, B, T]

    score_pos = None
    if positional:
        W_pos = w["pos_embed.W_pos"]  # [K, T, d]
        score_pos = q.transpose(-1, -2) @ _heads_transposed(w[ATTN + "W_K"], None, W_pos)  # [K, H, B, T]
    # The last query sees every position, so the causal mask removes nothing here.
    core = choose_core(attention_core, tokens.device, K * H * B * E.shape[1])
    z, pattern = core.apply(q, key, value, index, score_pos, attention != "softmax")  # [K, H, e, B]
    if positional:
        z = z + _heads_transposed(w[ATTN + "W_V"], None, W_pos) @ pattern.transpose(-1, -2)  # [K, H, e, B]
    W_O = w[ATTN + "W_O"].reshape(K, H * d_head, -1)  # [K, H e, d]
    attn_out = torch.baddbmm(w[ATTN + "b_O"][:, None], z.reshape(K, H * d_head, B).transpose(1, 2), W_O)  # [K, B, d]

    resid = x_last + attn_out  # [K, B, d]
    if MLP + "W_in" in w:
        hidden = torch.baddbmm(w[MLP + "b_in"][:, None], resid, w[MLP + "W_in"]).relu_()  # [K, B, m]
        resid = resid + torch.baddbmm(w[MLP + "b_out"][:, None], hidden, w[MLP + "W_out"])  # [K, B, d]
    return torch.baddbmm(w["unembed.b_U"][:, None], resid, w["unembed.W_U"])  # [K, B, d_vocab_out]
