"""Where a training step's GPU time goes: torch.profiler tables of the stacks a GPU run times,
so a GPU run brings back what it takes to optimise without one.

For each configuration: steps per second (timed before profiling), the model-FLOP
utilisation (the step's useful FLOPs, bench/step_cost.py, per second over the measured fp32
matmul rate), and the top --rows kernels by GPU time (self time; on the CPU by CPU time) over
--steps profiled steps, with their call counts. Configurations (models.recall.trainer's step, the
counter sampler, graphed on CUDA as the trainers run it):

  config-a            config A, one model
  tiny-k64            `tiny`, K = 64
  stack-vocab         169 models at the trade-off grid's largest cell (H = 32, m = 128), the vocabulary core
  stack-fused         the same, the fused core (only where Triton compiles: CUDA)

With --small every configuration runs at K <= 2 and B = 64 on `tiny`'s task (a dry run on the CPU).

Asked for by name, an L-layer step beside the TransformerLens loop's (bench/train_throughput.py's two
variants, eager, config A at depth L): its FLOPs counted by torch's FLOP counter (forward and backward),
its CPU seconds, and the top --rows operators by self CPU time (on a GPU by GPU time):

  ours-l2, tl-l2      our trainer's step, the TransformerLens loop's step, config A at L = 2 (-l4: L = 4)

    .venv/bin/python bench/step_profile.py [--device auto] [--configs NAME,...] [--steps 5] [--rows 25] [--small]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.train_throughput, run as a script

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from bench.step_cost import StepShape, step_flops  # noqa: E402
from bench.train_throughput import bench_run, make_ours, make_tl, matmul_flops_per_second, steps_per_second  # noqa: E402
from models.bridge import resolve_device  # noqa: E402
from models.cores import fused_attention  # noqa: E402

STACK = {"n_heads": 32, "d_mlp": 128}  # the trade-off grid's largest cell
CONFIGS = {"config-a": ("config-a", 1, {}, "vocab"),  # name: preset, K, model fields, attention core
           "tiny-k64": ("tiny", 64, {}, "vocab"),
           "stack-vocab": ("paper-tradeoff", 169, STACK, "vocab"),
           "stack-fused": ("paper-tradeoff", 169, STACK, "fused")}
DEPTH = {f"{variant}-l{L}": (variant, L) for variant in ("ours", "tl") for L in (2, 4)}  # asked for by name only


def profiled(step, steps: int, device: torch.device):
    """torch.profiler's record of `steps` calls of `step` on `device` (CUDA kernels too on a GPU)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return prof


def profile_depth(name: str, device: torch.device, batch: int, steps: int, rows: int) -> None:
    """One step at depth L, ours or the TransformerLens loop's (config A, one model, eager): its FLOPs,
    its CPU seconds a step, and the top operators by self time over `steps` profiled steps."""
    variant, n_layers = DEPTH[name]
    step = (make_ours if variant == "ours" else make_tl)("config-a", batch, 1, device, model={"n_layers": n_layers})
    step()  # warm-up
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    cpu, wall = (time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps
    prof = profiled(step, steps, device)
    flops = counter.get_total_flops()
    by_op = sorted(counter.get_flop_counts().get("Global", {}).items(), key=lambda kv: -kv[1])
    print(f"== {name}: config-a n_layers={n_layers} B={batch}, {'ours' if variant == 'ours' else 'TransformerLens'}, "
          f"eager, device {device}")
    print(f"depth_step {name} {flops / 1e9:.2f} GFLOP (torch's FLOP counter, forward and backward: "
          + ", ".join(f"{op} {n / 1e9:.2f}" for op, n in by_op) + f"); {cpu:.3f} CPU s, {wall:.3f} s a step "
          f"({flops / cpu / 1e9:.1f} GFLOP per CPU second)")
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"top {rows} operators by {sort} over {steps} steps (counts: '# of Calls')")
    print(prof.key_averages().table(sort_by=sort, row_limit=rows))


def profile_config(name: str, device: torch.device, batch: int, steps: int, rows: int, small: bool) -> None:
    """Time, then profile, one configuration of CONFIGS; print its utilisation and table."""
    preset_name, k, model, core = CONFIGS[name]
    if small:
        preset_name, k, model = "tiny", min(k, 2), {}
    graphed = device.type == "cuda"
    step = make_ours(preset_name, batch, k, device, sampler="counter", graphed=graphed, model=model,
                     attention_core=core)
    steps_per_second(step, 5, device)  # warm-up (and a graphed step's capture)
    rate = steps_per_second(step, steps, device, seconds=1.0)
    matmul = matmul_flops_per_second(device)
    useful = step_flops(StepShape.of(bench_run(preset_name, model=model), batch, k), core) * rate
    prof = profiled(step, steps, device)
    print(f"== {name}: {preset_name}{' ' + str(model) if model else ''} K={k} B={batch}, attention core {core}, "
          f"{'graphed' if graphed else 'eager'}, device {device}")
    print(f"model_flop_utilisation {name} {100 * useful / matmul:.1f}%  ({rate:.1f} steps/s, "
          f"{useful:.3e} useful FLOP/s, matmul {matmul:.3e} FLOP/s)")
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"top {rows} kernels by {sort} over {steps} steps (counts: '# of Calls')")
    print(prof.key_averages().table(sort_by=sort, row_limit=rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma separated, of {', '.join(CONFIGS)} (default: these), {', '.join(DEPTH)}")
    parser.add_argument("--steps", type=int, default=5, help="steps profiled per configuration")
    parser.add_argument("--rows", type=int, default=25, help="kernels in each table")
    parser.add_argument("--small", action="store_true", help="tiny sizes (K <= 2, B = 64): a dry run")
    args = parser.parse_args()
    device = resolve_device(args.device)
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS and n not in DEPTH]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; choose from {', '.join([*CONFIGS, *DEPTH])}")
    for name in names:
        if name in DEPTH:
            profile_depth(name, device, 64 if args.small else 1024, args.steps, args.rows)
            continue
        if CONFIGS[name][3] == "fused" and not (device.type == "cuda" and fused_attention.runs_on(device)):
            print(f"== {name}: not profiled on {device} (the fused core compiles only for CUDA, with Triton)")
            continue
        profile_config(name, device, 64 if args.small else 1024, args.steps, args.rows, args.small)


if __name__ == "__main__":
    main()
