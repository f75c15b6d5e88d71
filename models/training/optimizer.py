"""The optimizer of the trainers: Adam or gradient descent with one learning rate per model, every
piece of state a device tensor (ready for CUDA-graph capture). The induction family adds SGD's
momentum and weight decay (torch.optim.SGD's update) and Adam's decoupled weight decay (AdamW)."""
from __future__ import annotations

import functools
import math

import torch

from tasks import triton_kernels

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
ADAM_BLOCK = 1024  # elements per program of the Adam kernel


@torch.library.custom_op("factual_recall::adam_step", mutates_args=("params", "m", "v"))
def adam_step(params: torch.Tensor, grads: torch.Tensor, m: torch.Tensor, v: torch.Tensor, lr: torch.Tensor,
              step: torch.Tensor, corrections: torch.Tensor, blocks: torch.Tensor) -> None:
    """Adam's update of the flat buffers `params`, `m`, `v` from `grads` [N] (float32) as one
    launch of models/training/adam_kernel.py: `blocks` [n, 4] int64 maps each program to its block
    (Optimizer), `lr` [K], `step` [1] the step count, `corrections` Adam's table. A torch
    operator, so that the capture check and the kernel count see it (as one operation)."""
    b1, b2 = ADAM_BETAS
    triton_kernels.load("models.training.adam_kernel").adam[(len(blocks),)](
        params, grads, m, v, lr, step, corrections, len(corrections), blocks, 1 - b1, b2, 1 - b2, ADAM_EPS,
        BLOCK=ADAM_BLOCK, enable_fp_fusion=False)


@adam_step.register_fake
def _(params, grads, m, v, lr, step, corrections, blocks) -> None:
    return None


def uses_kernel(device: torch.device) -> bool:
    """Whether Adam's update is the Triton kernel by default on `device`: on CUDA where Triton
    compiles (on the CPU the torch form is as fast, and Triton would only interpret)."""
    return device.type == "cuda" and triton_kernels.runs_on(device)


@functools.cache
def bias_corrections(betas: tuple[float, float] = ADAM_BETAS) -> torch.Tensor:
    """Adam's bias corrections (1 - b1^t, sqrt(1 - b2^t)) for t = 1, 2, ...: a table [n, 2]
    (CPU, shared: copy it, never write to it), computed in float64 Python arithmetic and
    rounded once to float32, as the Python-float formulas of the step were before. It stops
    at the first t with b^t < 2^-55 for both betas, where both entries are exactly 1 in
    float64 and stay so: later steps read its last row (t = 38,105 for the default betas)."""
    b1, b2 = betas
    steps = range(1, max(math.ceil(-55 * math.log(2) / math.log(b)) for b in betas) + 1)
    columns = [[1 - b1 ** t for t in steps], [math.sqrt(1 - b2 ** t) for t in steps]]
    return torch.tensor(columns, dtype=torch.float64).T.float().contiguous()


class Optimizer:
    """Adam or plain gradient descent with one learning rate per model ([K]).

    Ready for CUDA-graph capture: every piece of state is a device tensor updated in place
    (the step count `t` [1] int64, the moments, the learning rates), the bias corrections are
    read from a table on the device at index t, and a step reads nothing back to the host.
    Gradients are consumed and released (`p.grad = None`, set_to_none): the next backward
    writes fresh ones instead of accumulating. Under a capture of the whole step (backward
    included) that rebinding happens once, while capturing; each replay's backward writes
    the gradients into the same graph-pool memory the captured update reads.

    `kernel` (Adam only; default: on CUDA where Triton compiles): the update as one Triton
    kernel (adam_step) instead of about fourteen torch operations, the same float32 arithmetic
    (bit-identical in Triton's interpreter). The weights then live in one flat buffer, each
    parameter a view of it (its tensor kept: `p.data` rebound once, here), the moments too, and
    each step copies the gradients into a flat buffer with one `cat`. AdamW (a weight decay)
    keeps the torch form."""

    def __init__(self, params: dict[str, torch.Tensor], lr: torch.Tensor, kind: str, momentum: float = 0.0,
                 weight_decay: float = 0.0, kernel: bool | None = None):
        self.params, self.kind = params, kind
        self.momentum, self.weight_decay = momentum, weight_decay
        self.t = torch.zeros(1, dtype=torch.long, device=lr.device)  # [1] steps taken
        self.rates = lr  # [K] every model's learning rate; self.lr holds views of it
        self.lr = {k: lr.view(-1, *([1] * (p.dim() - 1))) for k, p in params.items()}
        if kernel is None:
            kernel = uses_kernel(lr.device)
        self.kernel = (kernel and kind == "adam" and not weight_decay
                       and len({p.dtype for p in params.values()} | {lr.dtype}) == 1)
        if kind == "adam":
            self.corrections = bias_corrections().to(lr.device, copy=True)  # [n, 2] float32
            if self.kernel:
                self._flatten(lr)
            else:
                self.m = {k: torch.zeros_like(p) for k, p in params.items()}
                self.v = {k: torch.zeros_like(p) for k, p in params.items()}
        if kind == "sgd" and momentum:
            self.buffers = {k: torch.zeros_like(p) for k, p in params.items()}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every piece of state but the step count, by the name a saved training state gives it."""
        state = {}
        if self.kind == "adam":
            state.update({f"adam.m.{k}": m for k, m in self.m.items()})
            state.update({f"adam.v.{k}": v for k, v in self.v.items()})
        if self.kind == "sgd" and self.momentum:
            state.update({f"sgd.momentum.{k}": b for k, b in self.buffers.items()})
        return state

    @torch.no_grad()
    def _flatten(self, lr: torch.Tensor) -> None:
        """The weights, moments and gradients of every parameter as flat buffers [N], each
        parameter a view (its values kept), and the kernel's block table."""
        sizes = [p.numel() for p in self.params.values()]
        self.flat = lr.new_empty(sum(sizes))  # [N]
        self.flat_m, self.flat_v, self.flat_grad = (lr.new_zeros(sum(sizes)) for _ in range(3))
        self.m, self.v, blocks, start = {}, {}, [], 0
        for (k, p), n in zip(self.params.items(), sizes):
            view = self.flat[start:start + n].view(p.shape)
            view.copy_(p)
            p.data = view
            self.m[k], self.v[k] = (b[start:start + n].view(p.shape) for b in (self.flat_m, self.flat_v))
            blocks += [[b, start + n, start, n // len(lr)] for b in range(start, start + n, ADAM_BLOCK)]
            start += n
        self.blocks = torch.tensor(blocks, dtype=torch.long).to(lr.device)  # [blocks, 4]

    @torch.no_grad()
    def stop(self, k: int) -> None:
        """Model k moves no more: its learning rate and Adam moments zero, in place (a captured
        step reads these tensors)."""
        self.rates[k] = 0.0
        for moments in (getattr(self, "m", {}), getattr(self, "v", {})):
            for t in moments.values():
                t[k].zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter, each formula applied to all parameters at once
        (torch._foreach_*: on a GPU one kernel for all of them where their shapes agree, so a
        step launches about a third as many kernels; on a CPU the same per-tensor operations,
        in the same order, as one parameter at a time)."""
        self.t.add_(1)
        keys = list(self.params)
        params = [self.params[k] for k in keys]
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None  # the next backward starts from zero
        rates = [self.lr[k] for k in keys]  # [K, 1, ...] views of the one [K] tensor
        if self.kind == "sgd":
            if self.weight_decay:  # torch.optim.SGD: the decay joins the gradient, momentum and all
                grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
            if self.momentum:  # buf = momentum buf + g (buf = g at the first step: zero start, same)
                buffers = [self.buffers[k] for k in keys]
                torch._foreach_mul_(buffers, self.momentum)
                torch._foreach_add_(buffers, grads)
                grads = buffers
            torch._foreach_sub_(params, torch._foreach_mul(rates, grads))
            return
        if self.kernel:
            torch.cat([g.reshape(-1) for g in grads], out=self.flat_grad)
            adam_step(self.flat, self.flat_grad, self.flat_m, self.flat_v, self.rates, self.t, self.corrections,
                      self.blocks)
            return
        if self.weight_decay:  # AdamW: decoupled, p <- p (1 - lr wd) before the Adam update
            torch._foreach_sub_(params, torch._foreach_mul(torch._foreach_mul(rates, params), self.weight_decay))
        row = self.corrections.index_select(0, self.t.clamp(max=len(self.corrections)) - 1)  # [1, 2]
        first, second = row[0, 0], row[0, 1]  # 1 - b1^t, sqrt(1 - b2^t)
        b1, b2 = ADAM_BETAS
        m, v = [self.m[k] for k in keys], [self.v[k] for k in keys]
        torch._foreach_lerp_(m, grads, 1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, second)
        torch._foreach_add_(denom, ADAM_EPS)
        update = torch._foreach_mul(torch._foreach_div(rates, first), m)  # lr / first * m
        torch._foreach_div_(update, denom)
        torch._foreach_sub_(params, update)
