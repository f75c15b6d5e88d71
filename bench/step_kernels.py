"""Kernels a training step launches, by phase: a graphed step on a GPU is bound by their
number (one graph node each), so this count is the CPU-measurable map of where a GPU step
spends its launches.

Counts the aten operations that do work (views and other metadata operations left out) of
one step of models.recall.trainer on one model with the counter sampler, after two warm-up steps:
the batch, the forward and loss, the backward, the optimizer. A torch._foreach_* operation
counts once: on a GPU it is one kernel where its tensors' shapes agree. Counted twice: as
the CPU runs the step, and as CUDA runs it, the batch drawn with one Triton kernel (the
sampler's form there) and Adam's update one Triton kernel (models/training/adam_kernel.py, after one
`cat` of the gradients), so the second count is the graphed GPU step's.

    .venv/bin/python bench/step_kernels.py [--preset config-a] [--batch 64]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.cores.forward import has_positions, last_position_logits
from models.recall.presets import preset
from models.recall.trainer import summed_loss
from models.recall.training_data import TrainingData
from models.recall.weights import init_weights, stack, trainable_keys
from models.training.optimizer import Optimizer
from tasks import counter_sampler

METADATA = {"aten::view", "aten::transpose", "aten::expand", "aten::unsqueeze", "aten::detach", "aten::t",
            "aten::permute", "aten::reshape", "aten::_unsafe_view", "aten::as_strided", "aten::slice",
            "aten::select", "aten::squeeze", "aten::alias", "aten::split", "aten::split_with_sizes",
            "aten::unbind", "aten::_reshape_alias", "aten::lift_fresh", "aten::empty", "aten::empty_like",
            "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided"}


class Kernels(TorchDispatchMode):
    """Counts the operations that do work, by name; `one_launch` counts a Triton kernel's
    launch as one (not the operations Triton's interpreter runs inside it)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.inside = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside and func._schema.name not in METADATA:
            self.ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))

    def one_launch(self, name: str, launch):
        """`launch` (a function that launches one Triton kernel), counted as one operation `name`."""
        def counted(*args, **kwargs):
            self.ops[name] += 1
            self.inside = True
            try:
                return launch(*args, **kwargs)
            finally:
                self.inside = False
        return counted


def step_kernels(preset_name: str, batch: int, cuda: bool = False) -> dict[str, collections.Counter]:
    """The operations of one training step by phase; with `cuda`, as CUDA runs it: the counter
    sampler's batch and Adam's update each one Triton kernel (run here by Triton's interpreter)."""
    run = preset(preset_name)
    task = run.task.build()
    weights = stack([init_weights(run.model, task, 0)])
    params = {k: weights[k].requires_grad_() for k in trainable_keys(weights, run.model)}
    optimizer = Optimizer(params, torch.tensor([run.train.lr[0]]), run.train.optimizer, kernel=cuda)
    data = TrainingData(task, [(run.train.lr[0], 0)], batch, torch.device("cpu"), "counter")
    positional = has_positions(weights)

    def phases():
        phase = collections.defaultdict(collections.Counter)
        with Kernels() as k, contextlib.ExitStack() as sampler:
            if cuda:
                sampler.enter_context(mock.patch.object(counter_sampler, "counter_prompts", functools.partial(
                    counter_sampler.counter_prompts, kernel=True)))
                sampler.enter_context(mock.patch.object(counter_sampler, "_kernel_prompts", k.one_launch(
                    "triton::counter_kernel.prompts", counter_sampler._kernel_prompts)))
            tokens, answers = data.batch(optimizer.t)  # [1, B, T], [1, B]
        phase["batch" + (" (one Triton kernel)" if cuda else "")] = k.ops
        with Kernels() as k:
            logits = last_position_logits(weights, tokens, run.model.attention, positional)  # [1, B, O]
            loss = summed_loss(logits, answers)
        phase["forward and loss"] = k.ops
        with Kernels() as k:
            loss.backward()
        phase["backward"] = k.ops
        with Kernels() as k:
            optimizer.step()
        kernel = ", one Triton kernel" if optimizer.kernel else ""
        phase[f"optimizer ({run.train.optimizer}, {len(params)} parameters{kernel})"] = k.ops
        return phase

    phases(), phases()  # warm-up: the sampler's tables are built on the first step
    return phases()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="config-a", help="models.recall.presets preset (task + model)")
    p.add_argument("--batch", type=int, default=64, help="prompts per step (the count does not depend on it)")
    args = p.parse_args()
    for cuda in (False, True):
        print("on CUDA: the counter sampler and Adam each one Triton kernel (counted in Triton's interpreter)"
              if cuda else "on the CPU: torch operations")
        phases = step_kernels(args.preset, args.batch, cuda)
        for name, ops in phases.items():
            top = ", ".join(f"{op.removeprefix('aten::')} {n}" for op, n in ops.most_common(6))
            print(f"  {name:<46}{sum(ops.values()):>5}   {top}")
        print(f"  {'a whole step':<46}{sum(sum(ops.values()) for ops in phases.values()):>5}")


if __name__ == "__main__":
    main()
