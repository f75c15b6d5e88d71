"""The optimizer of both trainers: Adam or plain gradient descent with one learning rate per
model, every piece of state a device tensor (ready for CUDA-graph capture)."""
from __future__ import annotations

import functools
import math

import torch

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


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
    the gradients into the same graph-pool memory the captured update reads."""

    def __init__(self, params: dict[str, torch.Tensor], lr: torch.Tensor, kind: str):
        self.params, self.kind = params, kind
        self.t = torch.zeros(1, dtype=torch.long, device=lr.device)  # [1] steps taken
        self.rates = lr  # [K] every model's learning rate; self.lr holds views of it
        self.lr = {k: lr.view(-1, *([1] * (p.dim() - 1))) for k, p in params.items()}
        if kind == "adam":
            self.m = {k: torch.zeros_like(p) for k, p in params.items()}
            self.v = {k: torch.zeros_like(p) for k, p in params.items()}
            self.corrections = bias_corrections().to(lr.device, copy=True)  # [n, 2] float32

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
            torch._foreach_sub_(params, torch._foreach_mul(rates, grads))
            return
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
