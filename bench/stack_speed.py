"""A stack of tasks and sizes against the same cells trained alone, on one device.

The cells are Figure 4 left's kind (capacity sweep: S = R, N = S + R, D answers per
relation, T, one learning-rate triple per cell, the authors' parameterisation, the counter
sampler): one shape (alpha, beta, H) at several (d, S). The stack is models.recall.shape_trainer's
(one padded stack of every cell's models, as train_shapes trains it); alone is
models.recall.trainer's (each cell its own run, as train trains it). After one warm-up step each,
they are interleaved for --rounds rounds of --steps steps (the machine's speed drifts), and
the time per model-step (a step's seconds over the models it updates) of each is printed per
round, with the median of the per-round ratios alone / stack (> 1: the stack is faster).

    .venv/bin/python bench/stack_speed.py [--cells 24:16,28:20,32:24] [--shape 1,1,4] [--steps 10] \\
        [--rounds 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from analyses.capacity.transformer import TransformerSweep
from models.recall.shape_stack import buckets
from models.recall.shape_trainer import _start_shapes
from models.recall.trainer import _start
from models.training.subnormals import flushed


def seconds_per_model_step(step, models: int, steps: int) -> float:
    """Wall seconds of `steps` calls of `step` over steps x models."""
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / (steps * models)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default="24:16,28:20,32:24", help="d:S of each cell")
    parser.add_argument("--shape", default="1,1,4", help="alpha,beta,H")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sweep = TransformerSweep(batch_size=args.batch_size, sampler="counter")
    shape = tuple(float(v) for v in args.shape.split(","))
    runs = [sweep.run(shape, int(d), int(S), "cpu") for d, S in (cell.split(":") for cell in args.cells.split(","))]
    print(f"buckets (the padding rule): {buckets(runs)}; torch threads {torch.get_num_threads()}")
    device = torch.device("cpu")
    with flushed(device, True):
        stack = _start_shapes(runs, device)
        alone = [_start(run, device, None) for run in runs]
        K = len(stack.lr)
        for state in [stack, *alone]:
            state.step_once()
        ratios = []
        for r in range(args.rounds):
            together = seconds_per_model_step(stack.step_once, K, args.steps)
            apart = sum(seconds_per_model_step(s.step_once, len(s.run.train.runs), args.steps)
                        * len(s.run.train.runs) for s in alone) / K
            ratios.append(apart / together)
            print(f"round {r}: stack {together * 1e3:.2f} ms, alone {apart * 1e3:.2f} ms per model-step "
                  f"({K} models), alone / stack {apart / together:.2f}")
    print(f"median alone / stack: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
