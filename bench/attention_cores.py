"""The attention core alone, and where a training step's time goes.

Cores: forward and backward of the last query's attention at K stacked models of H heads of
size e, B prompts of T tokens, vocabulary V, for each (V, T) of --shapes:

  vocab      models.cores.forward.VocabAttention (the [K, H, B, V] buffer)
  per-token  models.cores.fused_attention.per_token_attention (plain torch: [K, H, e, B, T] gathers,
             autograd's scatter_add backward)
  fused      models.cores.fused_attention.FusedAttention (Triton; timed only where it compiles, on a GPU)

Interleaved rounds, median ms per forward + backward; beside it each core's cost from its
kernels' arithmetic (bench/core_cost.py: launches, global atomics, bytes). With --profile, also one training step
of --preset at --k models (models.recall.trainer, eager) under torch.profiler: the ops by self time.

    .venv/bin/python bench/attention_cores.py [--k 13] [--heads 32] [--batch 1024] \
        [--shapes 129x32,129x8,513x32,1025x8] [--profile] [--preset paper-tradeoff --d-mlp 128]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.train_throughput, run as a script

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.core_cost import core_cost, cost_line  # noqa: E402
from bench.train_throughput import make_ours  # noqa: E402
from models.bridge import resolve_device  # noqa: E402
from models.cores import fused_attention  # noqa: E402
from models.cores.forward import VocabAttention  # noqa: E402


def cores(device: torch.device) -> dict:
    """The attention cores that run on `device`, compiled (the interpreter is not timed)."""
    found = {"vocab": VocabAttention.apply, "per-token": fused_attention.per_token_attention}
    if device.type == "cuda" and fused_attention.runs_on(device):
        found["fused"] = fused_attention.FusedAttention.apply
    return found


def core_inputs(K: int, H: int, e: int, B: int, V: int, T: int, device: torch.device):
    """Random q [K, H, e, B], key and value tables [K, H, e, V], tokens expanded over heads."""
    g = torch.Generator().manual_seed(0)
    q, key, value = (torch.randn(K, H, e, n, generator=g).to(device).requires_grad_() for n in (B, V, V))
    tokens = torch.randint(0, V, (K, B, T), generator=g).to(device)
    return q, key, value, tokens[:, None].expand(K, H, B, T)


def core_step(core, inputs):
    """One forward and backward of `core` (a function of no arguments)."""
    def step():
        z, _ = core(*inputs, None, False)
        z.backward(torch.ones_like(z))
    return step


def milliseconds(step, device: torch.device, seconds: float) -> float:
    """Mean ms per call over at least `seconds` (synchronised on CUDA)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda _: None
    sync(device)
    start, done = time.perf_counter(), 0
    while done == 0 or time.perf_counter() - start < seconds:
        step()
        done += 1
    sync(device)
    return 1e3 * (time.perf_counter() - start) / done


def time_cores(args, device: torch.device) -> None:
    found = cores(device)
    print(f"attention core, forward + backward: K={args.k} H={args.heads} e={args.d_head} B={args.batch} | "
          f"device {device} | torch threads {torch.get_num_threads()} | median ms of {args.repeats} rounds")
    print(f"{'V':>6}{'T':>5}" + "".join(f"{name:>12}" for name in found) + "   ratio to vocab")
    for V, T in args.shapes:
        inputs = core_inputs(args.k, args.heads, args.d_head, args.batch, V, T, device)
        steps = {name: core_step(core, inputs) for name, core in found.items()}
        for step in steps.values():  # warm-up (and compilation)
            step()
        times = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, step in steps.items():
                times[name].append(milliseconds(step, device, args.round_seconds))
        median = {name: statistics.median(t) for name, t in times.items()}
        print(f"{V:>6}{T:>5}" + "".join(f"{m:>12.2f}" for m in median.values()) + "   " +
              ", ".join(f"{name} {m / median['vocab']:.2f}" for name, m in median.items() if name != "vocab"))
        for name in ("vocab", "fused"):
            cost = core_cost(name, args.k, args.heads, args.d_head, args.batch, V, T)
            print(f"{'':>11}{cost_line(name, cost, median.get(name))}")


def profile_step(args, device: torch.device) -> None:
    model = {key: value for key, value in (("n_heads", args.heads), ("d_mlp", args.d_mlp)) if value is not None}
    step = make_ours(args.preset, args.batch, args.k, device, model=model, attention_core=args.attention_core)
    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.profile_steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"profile: {args.profile_steps} training steps of {args.preset} {model} at K={args.k}, "
          f"B={args.batch}, attention core {args.attention_core}, device {device}")
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=13, help="models stacked")
    parser.add_argument("--heads", type=int, default=32, help="heads per model")
    parser.add_argument("--d-head", type=int, default=8, help="head size e")
    parser.add_argument("--batch", type=int, default=1024, help="prompts per model")
    parser.add_argument("--shapes", type=lambda s: [tuple(int(x) for x in p.split("x")) for p in s.split(",")],
                        default=[(129, 32), (129, 8), (513, 32), (1025, 8)], help="VxT pairs, comma separated")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--round-seconds", type=float, default=0.5, help="least seconds per core per round")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--profile", action="store_true", help="also profile one training step")
    parser.add_argument("--preset", default="paper-tradeoff", help="the profiled step's preset")
    parser.add_argument("--d-mlp", type=int, default=128, help="the profiled model's MLP width")
    parser.add_argument("--attention-core", default="auto", help="the profiled step's attention core")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled")
    parser.add_argument("--rows", type=int, default=15, help="ops in the profile table")
    args = parser.parse_args()
    device = resolve_device(args.device)
    time_cores(args, device)
    if args.profile:
        profile_step(args, device)


if __name__ == "__main__":
    main()
