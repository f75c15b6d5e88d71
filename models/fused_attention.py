"""The last query's attention as two Triton kernels that never write a [K, H, B, V] tensor.

`FusedAttention` computes what `models.forward.VocabAttention` computes (same arguments,
same outputs, same gradients up to the order of float sums), but walks each prompt's T
tokens with the small key and value tables ([e, V] per head, a few KB, held in cache): one
program per (model, head, block of prompts) gathers the tokens' keys, scores them, takes the
softmax over positions and mixes the tokens' values. The backward recomputes nothing but the
gathers and scatters the key and value gradients into their tables with atomic adds. Per step
the attention then moves the pattern [K, H, B, T] twice and the queries, outputs and their
gradients once, instead of about fourteen passes over a [K, H, B, V] buffer (bench/README.md).

Triton is optional (`pip install -e .[kernels]`): the kernels compile for CUDA tensors and, in
a process without a GPU, run in Triton's interpreter on CPU tensors (exact, and far too slow to
train with: the tests use it). `runs_on(device)` says which; elsewhere models.forward keeps
its vocabulary path.
The atomic adds make the key and value gradients' float sums run in no fixed order on a GPU
(as torch's scatter_add_ there): GPU runs with this core are not bit-reproducible.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # no GPU to compile for: Triton can only interpret (set before its import)
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton
    import triton.language as tl
except ImportError:  # the optional extra is absent: models.forward keeps its vocabulary path
    triton = None

BLOCK_B = 16  # prompts per program


def runs_on(device: torch.device) -> bool:
    """Whether the fused core can run on `device`: Triton is installed, and compiles for CUDA
    or, in a process without a GPU, interprets on the CPU."""
    if triton is None:
        return False
    interpreted = triton.knobs.runtime.interpret
    return device.type == "cpu" if interpreted else device.type == "cuda"


if triton is not None:
    @triton.jit
    def _forward(q, key, value, index, score_pos, z, pattern, B, T,
                 sq_k, sq_h, sq_e, sq_b, skey_k, skey_h, skey_e, skey_v, sval_k, sval_h, sval_e, sval_v,
                 si_k, si_h, si_b, si_t, ss_k, ss_h, ss_b, ss_t, sz_k, sz_h, sz_e, sz_b, sp_k, sp_h, sp_b, sp_t,
                 E: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
                 POSITIONAL: tl.constexpr, LINEAR: tl.constexpr):
        """One (block of prompts, head, model): scores of the last query against the prompt's
        tokens, the pattern over positions, the value mix z."""
        k, h = tl.program_id(2), tl.program_id(1)
        b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
        t = tl.arange(0, BLOCK_T)  # [BT]
        row, col = b < B, t < T
        inside = row[:, None] & col[None, :]  # [BB, BT]
        tokens = tl.load(index + k * si_k + h * si_h + b[:, None] * si_b + t[None, :] * si_t, mask=inside, other=0)
        q_at = q + k * sq_k + h * sq_h + b * sq_b
        key_at = key + k * skey_k + h * skey_h + tokens * skey_v
        scores = tl.zeros([BLOCK_B, BLOCK_T], dtype=q.dtype.element_ty)
        for e in tl.static_range(E):
            q_e = tl.load(q_at + e * sq_e, mask=row, other=0.0)  # [BB]
            scores += q_e[:, None] * tl.load(key_at + e * skey_e, mask=inside, other=0.0)  # [BB, BT]
        if POSITIONAL:
            scores += tl.load(score_pos + k * ss_k + h * ss_h + b[:, None] * ss_b + t[None, :] * ss_t,
                              mask=inside, other=0.0)
        if LINEAR:
            p = scores
        else:
            scores = tl.where(col[None, :], scores, float("-inf"))
            weights = tl.exp(scores - tl.max(scores, axis=1)[:, None])
            p = weights / tl.sum(weights, axis=1)[:, None]  # [BB, BT]
        tl.store(pattern + k * sp_k + h * sp_h + b[:, None] * sp_b + t[None, :] * sp_t, p, mask=inside)
        value_at = value + k * sval_k + h * sval_h + tokens * sval_v
        z_at = z + k * sz_k + h * sz_h + b * sz_b
        for e in tl.static_range(E):
            v_e = tl.load(value_at + e * sval_e, mask=inside, other=0.0)  # [BB, BT]
            tl.store(z_at + e * sz_e, tl.sum(p * v_e, axis=1), mask=row)

    @triton.jit
    def _backward(q, key, value, index, pattern, d_z, d_pattern, d_q, d_key, d_value, d_scores, B, T,
                  sq_k, sq_h, sq_e, sq_b, skey_k, skey_h, skey_e, skey_v, sval_k, sval_h, sval_e, sval_v,
                  si_k, si_h, si_b, si_t, sp_k, sp_h, sp_b, sp_t, sz_k, sz_h, sz_e, sz_b,
                  sd_k, sd_h, sd_b, sd_t, sg_k, sg_h, sg_e, sg_v,
                  E: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
                  HAS_DPATTERN: tl.constexpr, POSITIONAL: tl.constexpr,
                  LINEAR: tl.constexpr):
        """One (block of prompts, head, model): the pattern's gradient from z's, the scores'
        gradient through the softmax, the query's gradient, and the key and value tables'
        gradients added into their entries. d_q and d_z have q's strides (sq_*, sz_*: both
        passed), d_pattern and d_scores one layout (sd_*), d_key and d_value one (sg_*)."""
        k, h = tl.program_id(2), tl.program_id(1)
        b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
        t = tl.arange(0, BLOCK_T)  # [BT]
        row, col = b < B, t < T
        inside = row[:, None] & col[None, :]  # [BB, BT]
        tokens = tl.load(index + k * si_k + h * si_h + b[:, None] * si_b + t[None, :] * si_t, mask=inside, other=0)
        p = tl.load(pattern + k * sp_k + h * sp_h + b[:, None] * sp_b + t[None, :] * sp_t, mask=inside, other=0.0)
        grad_at = k * sg_k + h * sg_h + tokens * sg_v  # [BB, BT] entries of the table gradients
        dp = tl.zeros([BLOCK_B, BLOCK_T], dtype=p.dtype)
        d_z_at = d_z + k * sz_k + h * sz_h + b * sz_b
        value_at = value + k * sval_k + h * sval_h + tokens * sval_v
        for e in tl.static_range(E):
            d_z_e = tl.load(d_z_at + e * sz_e, mask=row, other=0.0)  # [BB]
            dp += d_z_e[:, None] * tl.load(value_at + e * sval_e, mask=inside, other=0.0)
            tl.atomic_add(d_value + grad_at + e * sg_e, d_z_e[:, None] * p, mask=inside)
        pattern_at = k * sd_k + h * sd_h + b[:, None] * sd_b + t[None, :] * sd_t
        if HAS_DPATTERN:
            dp += tl.load(d_pattern + pattern_at, mask=inside, other=0.0)
        if LINEAR:
            ds = dp
        else:
            ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])  # [BB, BT]
        if POSITIONAL:
            tl.store(d_scores + pattern_at, ds, mask=inside)
        q_at = q + k * sq_k + h * sq_h + b * sq_b
        d_q_at = d_q + k * sz_k + h * sz_h + b * sz_b
        key_at = key + k * skey_k + h * skey_h + tokens * skey_v
        for e in tl.static_range(E):
            k_e = tl.load(key_at + e * skey_e, mask=inside, other=0.0)  # [BB, BT]
            tl.store(d_q_at + e * sz_e, tl.sum(ds * k_e, axis=1), mask=row)
            q_e = tl.load(q_at + e * sq_e, mask=row, other=0.0)  # [BB]
            tl.atomic_add(d_key + grad_at + e * sg_e, q_e[:, None] * ds, mask=inside)


def _launch(kernel, like: torch.Tensor, *args, **meta) -> None:
    """`kernel` on a grid of (blocks of prompts, heads, models) for q-shaped `like` [K, H, e, B]."""
    if not runs_on(like.device):
        raise ValueError(f"the fused attention core cannot run on {like.device} here "
                         "(it needs Triton, and CUDA tensors, or CPU tensors in a process without a GPU)")
    K, H, _, B = like.shape
    kernel[(triton.cdiv(B, BLOCK_B), H, K)](*args, BLOCK_B=BLOCK_B, **meta)


def per_token_attention(q, key, value, index, score_pos, linear):
    """FusedAttention's contract in plain torch, differentiated by autograd: each token's key
    and value gathered from the tables ([K, H, e, B, T] each). The tests' reference, and the
    pure-torch per-token form bench/attention_cores.py times (its backward is a scatter_add
    per table)."""
    K, H, E, B = q.shape
    T = index.shape[-1]
    flat = index.reshape(K, H, 1, B * T).expand(K, H, E, B * T)
    keys = key.gather(-1, flat).view(K, H, E, B, T)  # [K, H, e, B, T]
    values = value.gather(-1, flat).view(K, H, E, B, T)
    scores = (q[..., None] * keys).sum(2)  # [K, H, B, T]
    if score_pos is not None:
        scores = scores + score_pos
    pattern = scores if linear else scores.softmax(-1)
    return (pattern[:, :, None] * values).sum(-1), pattern  # [K, H, e, B], [K, H, B, T]


class FusedAttention(torch.autograd.Function):
    """models.forward.VocabAttention's contract, computed per token: q [K, H, e, B] (already
    scaled), key and value tables [K, H, e, V], token index [K, H, B, T] (any strides: the
    tokens expanded over heads), optional positional scores [K, H, B, T]; returns the head
    outputs z [K, H, e, B] and the pattern [K, H, B, T]."""

    @staticmethod
    def forward(ctx, q, key, value, index, score_pos, linear: bool):
        K, H, E, B = q.shape
        T = index.shape[-1]
        z = q.new_empty(K, H, E, B)  # [K, H, e, B]
        pattern = q.new_empty(K, H, B, T)  # [K, H, B, T]
        positional = score_pos is not None
        pos = score_pos if positional else pattern  # a placeholder pointer when absent
        _launch(_forward, q, q, key, value, index, pos, z, pattern, B, T,
                *q.stride(), *key.stride(), *value.stride(), *index.stride(), *pos.stride(), *z.stride(),
                *pattern.stride(), E=E, BLOCK_T=triton.next_power_of_2(T), POSITIONAL=positional, LINEAR=linear)
        ctx.save_for_backward(q, key, value, index, pattern)
        ctx.linear, ctx.positional = linear, positional
        ctx.set_materialize_grads(False)
        return z, pattern

    @staticmethod
    def backward(ctx, d_z, d_pattern):
        if d_z is None and d_pattern is None:
            return None, None, None, None, None, None
        q, key, value, index, pattern = ctx.saved_tensors
        K, H, E, B = q.shape
        T, V = index.shape[-1], key.shape[-1]
        # d_z and d_q share one contiguous layout, d_pattern and d_scores the pattern's
        d_z = q.new_zeros(q.shape) if d_z is None else d_z.contiguous()  # [K, H, e, B]
        d_q = torch.empty_like(d_z)  # [K, H, e, B]
        d_pattern = None if d_pattern is None else d_pattern.contiguous()  # [K, H, B, T]
        d_scores = torch.empty_like(pattern) if ctx.positional else None  # [K, H, B, T]
        d_key, d_value = key.new_zeros(K, H, E, V), key.new_zeros(K, H, E, V)  # [K, H, e, V]
        at = pattern if d_pattern is None else d_pattern  # a placeholder pointer when absent
        _launch(_backward, q, q, key, value, index, pattern, d_z, at, d_q, d_key, d_value,
                at if d_scores is None else d_scores, B, T,
                *q.stride(), *key.stride(), *value.stride(), *index.stride(), *pattern.stride(), *d_z.stride(),
                *at.stride(), *d_key.stride(), E=E, BLOCK_T=triton.next_power_of_2(T),
                HAS_DPATTERN=d_pattern is not None, POSITIONAL=ctx.positional, LINEAR=ctx.linear)
        return d_q, d_key, d_value, None, d_scores, None
