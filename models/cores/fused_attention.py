"""The last query's attention as three Triton kernels that never write a [K, H, B, V] tensor.

`FusedAttention` computes what `models.cores.forward.VocabAttention` computes (same arguments,
same outputs, same gradients up to the order of float sums), but walks each prompt's T
tokens with the small key and value tables ([e, V] per head, a few KB, held in cache):
- forward, one program per (model, head, block of prompts): gathers the tokens' keys, scores
  them, takes the softmax over positions, mixes the tokens' values into z;
- backward, the same programs: the scores' gradient (stored) and the query's;
- tables, one program per (model, head, vocabulary entry): the key and value tables'
  gradients at its entry, summed over the positions that hold it (each model's positions
  sorted by token once per step, torch.sort and searchsorted: `token_order`) in registers
  and stored once.
No atomic adds: every float sum runs in one fixed order, so runs with this core are
bit-reproducible on a GPU too (by construction; not yet checked on one). Per step the
attention moves the pattern [K, H, B, T] and its gradient a few times and the queries,
outputs and their gradients once, instead of about fourteen passes over a [K, H, B, V]
buffer (bench/core_cost.py counts both; bench/README.md).

Triton is optional (`pip install -e .[kernels]`): the kernels compile for CUDA tensors and, in
a process without a GPU, run in Triton's interpreter on CPU tensors (exact, and far too slow to
train with: the tests use it). `runs_on(device)` says which; elsewhere models.cores.forward keeps
its vocabulary path.
"""
from __future__ import annotations

import torch

from tasks import triton_kernels

BLOCK_B = 16  # prompts per program of the forward and the backward
BLOCK_N = 128  # positions per step of the tables' loop (the positions holding one entry)
runs_on = triton_kernels.runs_on  # whether the fused core can run on a device: Triton compiles or interprets there


def _launch(kernel: str, grid: tuple[int, int, int], q: torch.Tensor, *args, **meta) -> None:
    """models.cores.fused_kernels.`kernel` on `grid` (blocks of prompts or of vocabulary entries,
    heads, models), its first argument the queries `q`."""
    if not runs_on(q.device):
        raise ValueError(f"the fused attention core cannot run on {q.device} here "
                         "(it needs Triton, and CUDA tensors, or CPU tensors in a process without a GPU)")
    getattr(triton_kernels.load("models.cores.fused_kernels"), kernel)[grid](q, *args, **meta)


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


def token_order(index: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's positions b * T + t sorted by the token they hold (stably: by position
    within a token), and where each entry's positions start: order [K, H', B * T] and starts
    [K, H', V + 1], H' = 1 when the tokens are shared by every head (index expanded over
    heads, stride 0), else H. Entry v's positions are order[..., starts[v]:starts[v + 1]]."""
    K, H, B, T = index.shape
    tokens = (index[:, :1] if index.stride(1) == 0 else index).reshape(K, -1, B * T)  # [K, H', B * T]
    sorted_tokens, order = tokens.sort(dim=-1, stable=True)
    entries = torch.arange(V + 1, device=index.device, dtype=sorted_tokens.dtype)  # [V + 1]
    starts = torch.searchsorted(sorted_tokens, entries.expand(K, tokens.shape[1], V + 1).contiguous())
    return order, starts


class FusedAttention(torch.autograd.Function):
    """models.cores.forward.VocabAttention's contract, computed per token: q [K, H, e, B] (already
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
        _launch("forward", (-(-B // BLOCK_B), H, K), q, key, value, index, pos, z, pattern, B, T,
                *q.stride(), *key.stride(), *value.stride(), *index.stride(), *pos.stride(), *z.stride(),
                *pattern.stride(), E=E, BLOCK_B=BLOCK_B, BLOCK_T=1 << (T - 1).bit_length(), POSITIONAL=positional,
                LINEAR=linear)
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
        d_scores = torch.empty_like(pattern)  # [K, H, B, T]
        at = pattern if d_pattern is None else d_pattern  # a placeholder pointer when absent
        block_t = 1 << (T - 1).bit_length()
        _launch("backward", (-(-B // BLOCK_B), H, K), q, key, value, index, pattern, d_z, at, d_q, d_scores, B, T,
                *q.stride(), *key.stride(), *value.stride(), *index.stride(), *pattern.stride(), *d_z.stride(),
                *at.stride(), E=E, BLOCK_B=BLOCK_B, BLOCK_T=block_t, HAS_DPATTERN=d_pattern is not None,
                LINEAR=ctx.linear)
        order, starts = token_order(index, V)
        d_key, d_value = key.new_empty(K, H, E, V), key.new_empty(K, H, E, V)  # [K, H, e, V], every entry stored
        shared = order.shape[1] == 1  # one order for every head: strides 0 over heads
        _launch("tables", (V, H, K), q, order, starts, pattern, d_z, d_scores, d_key, d_value, T,
                *q.stride(), order.stride(0), 0 if shared else order.stride(1), starts.stride(0),
                0 if shared else starts.stride(1), *pattern.stride(), *d_z.stride(), *d_scores.stride(),
                *d_key.stride(), E=E, BLOCK_E=1 << (E - 1).bit_length(), BLOCK_N=BLOCK_N)
        return d_q, d_key, d_value, None, d_scores if ctx.positional else None, None
