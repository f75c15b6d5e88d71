"""One training step, run eagerly or captured once in a CUDA graph and replayed.

On a GPU the trainers' eager step is bound by kernel launches, not arithmetic: a step of a
one-layer model launches a few hundred small kernels (config A on an H200: 232 steps/s
eager, 1,935 captured, bit-identical). Capturing the whole step (sampling, forward,
backward, update) and replaying it launches them as one graph.

A step can be captured when it reads every changing input from device tensors updated in
place (the step count is the optimizer's `t`, the data come from the counter sampler or
from a data set already on the device), never waits for the host, and keeps no tensor the
host allocates per step. The trainers' steps are written that way; what they do between
steps (evaluation, snapshots, early stop, the finite checks, saving state) stays eager,
between replays, reading the same tensors the graph updates in place.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

CUDA_GRAPH_MODES = ("auto", "on", "off")
CUDA_GRAPH_HELP = ("capture the whole training step in a CUDA graph and replay it: auto (where the run is on CUDA "
                   "and its data can be replayed) | on (refuse a run that cannot be) | off (eager)")
WARMUP_STEPS = 3  # eager steps on a side stream before the capture, as torch.cuda.graphs asks


def not_capturable(device: torch.device, sampler: str = "counter") -> str | None:
    """Why a run on `device` drawing its data with `sampler` cannot capture its step, or None."""
    if device.type != "cuda":
        return f"the run is on {device.type}, and CUDA graphs need a CUDA device"
    if sampler == "generator":
        return ("the generator sampler draws from torch.Generators that a replay would not advance; "
                "use --sampler counter")
    return None


def use_cuda_graph(mode: str, device: torch.device, sampler: str = "counter") -> bool:
    """Whether a run captures its step: `off` never, `auto` where it can, `on` always
    (ValueError naming the reason where it cannot)."""
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graph must be one of {', '.join(CUDA_GRAPH_MODES)}, got {mode!r}.")
    reason = None if mode == "off" else not_capturable(device, sampler)
    if mode == "on" and reason:
        raise ValueError(f"--cuda-graph on: {reason}.")
    return mode != "off" and reason is None


class Step:
    """Calls `step()` once per training step and returns its outputs (tensors).

    Eager: each call runs `step()`. Graphed: the first WARMUP_STEPS calls run it on a side
    stream (real steps: the allocator and autograd settle), the next captures it in a CUDA
    graph and replays it once, and every later call replays it. A graphed call returns the
    same output tensors every time, overwritten by each replay: read them before the next
    call. Each call is exactly one step, so the caller's bookkeeping is the same either way."""

    def __init__(self, step: Callable[[], tuple[torch.Tensor, ...]], graphed: bool):
        self.step, self.graphed = step, graphed
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()

    def __call__(self) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        if not self.graphed:
            return self.step()
        if self.calls <= WARMUP_STEPS:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                outputs = self.step()
            torch.cuda.current_stream().wait_stream(side)
            return outputs
        if self.graph is None:  # capturing records the step's kernels without running them
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = self.step()
        self.graph.replay()
        return self.outputs
