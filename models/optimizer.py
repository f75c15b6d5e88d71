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
        self.lr = {k: lr.view(-1, *([1] * (p.dim() - 1))) for k, p in params.items()}
        if kind == "adam":
            self.m = {k: torch.zeros_like(p) for k, p in params.items()}
            self.v = {k: torch.zeros_like(p) for k, p in params.items()}
            self.corrections = bias_corrections().to(lr.device, copy=True)  # [n, 2] float32

    @torch.no_grad()
    def step(self) -> None:
        self.t.add_(1)
        if self.kind == "adam":
            row = self.corrections.index_select(0, self.t.clamp(max=len(self.corrections)) - 1)  # [1, 2]
            first, second = row[:, 0], row[:, 1]  # [1] each: 1 - b1^t, sqrt(1 - b2^t)
        b1, b2 = ADAM_BETAS
        for key, p in self.params.items():
            g, p.grad = p.grad, None  # the next backward starts from zero
            if self.kind == "sgd":
                p.sub_(self.lr[key] * g)
                continue
            self.m[key].lerp_(g, 1 - b1)
            self.v[key].mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (self.v[key].sqrt() / second).add_(ADAM_EPS)
            p.sub_(self.lr[key] / first * self.m[key] / denom)
