"""The induction trainer's step at a given size: seconds per step and the floating-point work of one
step (forward, loss, backward, SGD update of the simplified model), per fast forward.

Each forward of models.induction.forward (`general`: sequence_logits, the TransformerLens
computation; `simplified`: simplified_logits, the same function in the simplified model's training
form) trains the same model from the same start; they take turns in --rounds rounds of --steps
steps and each prints its median seconds per step. The work is counted once per forward with
torch.utils.flop_counter (the matrix products: every attention score, value and weight product,
forward and backward) and printed in GFLOP per step beside the rate it implies.

    .venv/bin/python bench/induction_step.py [--batch 512] [--seq-len 256] [--d-model 256] [--rounds 3]

On a checkout whose trainer has one forward (no `Training.forward`), only that one is timed, as
`trainer`: the script also measures the code before the simplified forward existed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from models.induction import forward as forwards  # noqa: E402
from models.induction.config import preset  # noqa: E402
from models.induction.trainer import Training  # noqa: E402


def training(args, name: str) -> Training:
    task, model, cfg = preset("paper")
    task = replace(task, seq_len=args.seq_len)
    run = Training(task.build(), replace(model, d_model=args.d_model),
                   replace(cfg, batch_size=args.batch, eval_size=8, device=args.device))
    if name != "trainer":
        run.forward = {"general": forwards.sequence_logits, "simplified": forwards.simplified_logits}[name]
    return run


def gflop(run: Training) -> float:
    with FlopCounterMode(display=False) as counter:
        run.train_step()
    return counter.get_total_flops() / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--steps", type=int, default=2, help="timed steps per round and forward")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    names = ["general", "simplified"] if hasattr(forwards, "simplified_logits") else ["trainer"]
    runs = {name: training(args, name) for name in names}
    work = {name: gflop(run) for name, run in runs.items()}  # also the warm-up step
    times = {name: [] for name in names}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                run.train_step()
            times[name].append((time.perf_counter() - start) / args.steps)
    print(f"B = {args.batch}, T = {args.seq_len}, d = {args.d_model}, K = 5, {args.threads} thread(s), {args.device}")
    for name in names:
        s = statistics.median(times[name])
        print(f"{name:>10}: {s:6.2f} s/step ({1 / s:.3f} steps/s), {work[name]:6.1f} GFLOP/step, "
              f"{work[name] / s:5.1f} GFLOP/s   rounds: {', '.join(f'{t:.2f}' for t in times[name])}")


if __name__ == "__main__":
    main()
