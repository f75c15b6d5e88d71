"""Training throughput: our batched trainer vs the straightforward TransformerLens loop.

Both variants train the same preset (task + model) at the same batch size with Adam at the
preset's first learning rate, sampling a fresh batch every step inside the timed loop:

  ours  models.recall.trainer.train_step on K stacked models (last-position forward, models.cores.forward)
  tl    a TransformerBridge (models.bridge.build_bridge), full-sequence forward, cross-entropy
        on the last position, torch.optim.Adam over the attention and MLP weight matrices

Throughput is in training steps per second (one step = one batch of B prompts per model and
one optimizer update). After one warm-up step each, the two are interleaved for --repeats
rounds, a variant running blocks of --steps steps until --round-seconds have passed (steady
state): min/median/max over rounds. The machine's speed drifts (+-25% over minutes on this
shared VM), so the two ratios are taken per round, seconds apart, and their median printed:
the speedup (ours / tl; with --k > 1, model-steps per second) and our step time over the
FLOP floor at the matmul throughput measured right after ours.
Both are also timed on a model trained --trained-steps steps by our trainer (seed 0, its
state kept in --trained-state), whose subnormal floats slow a CPU down: `ours-trained`
flushes them to zero as our trainer does (models.training.subnormals), `ours-trained-kept` keeps
them, `tl-trained` runs as a user would (kept). Peak memory, in a fresh process per variant:
torch.cuda.max_memory_allocated, or the peak RSS growth from model set-up. With --counter,
ours is also timed with the counter sampler (`ours-counter`). See bench/README.md.

    .venv/bin/python bench/train_throughput.py [--preset config-a] [--batch 1024] [--k 1] \
        [--trained-steps 8192] [--trained-state DIR] [--counter] [--graphed] [--n-heads H] [--d-mlp M] [--n-layers L] \
        [--attention-core auto|vocab|fused] [--compare-core vocab|fused] [--peak-flops F] [--peak-bandwidth B]

It also prints the step's FLOPs and bytes moved by tensor (bench/step_cost.py) and the rates
achieved against the device's peaks: the datasheet's of a GPU it knows by name
(bench/step_cost.py KNOWN_PEAKS), else the matmul and copy rates it measured; it says which.
For each variant of ours it prints the model-FLOP utilisation: the step's useful FLOPs per
second over the measured matmul rate.
"""
from __future__ import annotations

import argparse
import functools
import math
import multiprocessing as mp
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.step_cost, run as a script

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.step_cost import StepShape, copy_bandwidth, cost_lines, device_peaks, step_flops  # noqa: E402
from models.bridge import build_bridge, resolve_device  # noqa: E402
from models.checkpoint import CheckpointError  # noqa: E402
from models.cli import override  # noqa: E402
from models.cores import fused_attention  # noqa: E402
from models.cores.forward import CORES, choose_core, has_positions, last_position_logits  # noqa: E402
from models.recall.config import RunConfig  # noqa: E402
from models.recall.presets import preset  # noqa: E402
from models.recall.trainer import train, training_step  # noqa: E402
from models.recall.training_data import TrainingData  # noqa: E402
from models.recall.weights import init_weights, stack, trainable_keys  # noqa: E402
from models.training.graphed import Step  # noqa: E402
from models.training.optimizer import Optimizer  # noqa: E402
from models.training.result import DATA_SEED_OFFSET  # noqa: E402
from models.training.subnormals import flushed  # noqa: E402
from models.training.train_state import load_state  # noqa: E402

MEMORY_STEPS = 3
TL_TRAINABLE = (".q.", ".k.", ".v.", ".o.", ".fc_in.", ".fc_out.")  # bridge weight names; biases stay frozen


def bench_run(preset_name: str, seq_len: int | None = None, model: dict | None = None) -> RunConfig:
    """The preset, with its sequence length replaced when `seq_len` is given and its model's
    fields by `model` (say {"n_heads": 32, "d_mlp": 128})."""
    run = preset(preset_name)
    task = run.task if seq_len is None else override(run.task, {"seq_len": seq_len})
    return RunConfig(task, override(run.model, model or {}), run.train)


def make_ours(preset_name: str, batch: int, k: int, device: torch.device, seq_len: int | None = None,
              trained: dict | None = None, sampler: str = "generator", graphed: bool = False,
              model: dict | None = None, attention_core: str = "auto"):
    """A closure doing one step of models.recall.trainer on K stacked models (seeds 0..K-1), from
    fresh weights or, given `trained` (a saved training state of one model), K copies of it;
    the data from `sampler` (models.recall.training_data.TrainingData); with `graphed`, the step captured
    in a CUDA graph and replayed, as the trainer does (models.training.graphed.Step); `model`: fields
    of the preset's model replaced; `attention_core`: models.cores.forward.CORES."""
    run = bench_run(preset_name, seq_len, model)
    task, lr = run.task.build(), run.train.lr[0]
    runs = [(lr, seed) for seed in range(k)]
    weights = stack([init_weights(run.model, task, s) for _, s in runs])  # [K, ...]
    weights = {key: t.to(device) for key, t in weights.items()}
    params = {key: weights[key].requires_grad_() for key in trainable_keys(weights, run.model)}
    optimizer = Optimizer(params, torch.full((k,), lr, device=device), "adam")
    data = TrainingData(task, runs, batch, device, sampler)
    if trained is not None:
        with torch.no_grad():
            for key, p in params.items():
                p.copy_(trained["weights"][key].expand_as(p))
                optimizer.m[key].copy_(trained["m"][key].expand_as(p))
                optimizer.v[key].copy_(trained["v"][key].expand_as(p))
        optimizer.t.fill_(trained["t"])
        if data.generators:
            data.generators[0].set_state(trained["rng"])
    positional = has_positions(weights)  # as models.recall.trainer.train: decided once
    return Step(training_step(weights, optimizer, data, run.model.attention, positional,
                              attention_core=attention_core), graphed)


def make_tl(preset_name: str, batch: int, k: int, device: torch.device, seq_len: int | None = None,
            trained: dict | None = None, model: dict | None = None):
    """A closure doing one step of the plain TransformerBridge training loop (one model),
    from fresh weights or from `trained` (its weights, Adam moments and data stream)."""
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    run = bench_run(preset_name, seq_len, model)
    task, lr = run.task.build(), run.train.lr[0]
    start = init_weights(run.model, task, 0)
    if trained is not None:
        start.update(trained["weights"])
    bridge = build_bridge(run.model.checkpoint_section(task), start, device)
    named = {name: p for name, p in bridge.named_parameters()
             if name.endswith(".weight") and any(part in name for part in TL_TRAINABLE)}
    for p in named.values():
        p.requires_grad_(True)
    bridge.train()
    optimizer = torch.optim.Adam(named.values(), lr=lr)
    generator = torch.Generator(device=device).manual_seed(DATA_SEED_OFFSET)
    if trained is not None:  # the same moments, in the bridge's layout (its state-dict keys)
        m, v = (convert_tl_checkpoint(trained[x], bridge.cfg) for x in ("m", "v"))
        key_of = {id(t): key for key, t in bridge.state_dict(keep_vars=True).items()}
        for p in named.values():
            key = key_of[id(p)]
            optimizer.state[p] = {"step": torch.tensor(float(trained["t"])), "exp_avg": m[key].to(device),
                                  "exp_avg_sq": v[key].to(device)}
        generator.set_state(trained["rng"])

    def step():
        sample = task.sample(batch, generator)
        logits = bridge(sample.tokens)  # [B, T, O]
        loss = F.cross_entropy(logits[:, -1], sample.answers)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return step


VARIANTS = {"ours": make_ours, "tl": make_tl}
FLUSHED = {"ours": True, "ours-counter": True, "ours-graphed": True, "tl": False, "ours-trained": True,
           "ours-trained-kept": False, "tl-trained": False}


def trained_state(preset_name: str, steps: int, folder: Path, device: torch.device) -> dict:
    """Seed 0 of the preset (its first learning rate) trained by our trainer for `steps`
    steps, never stopping early: weights, Adam moments and step, data stream (CPU tensors
    of one model). The data come from the generator sampler, whatever the preset's default,
    because both trained variants go on drawing from that stream: `ours-trained` with the
    generator sampler and the TransformerLens loop with a torch.Generator. The trainer's
    resumable state in `folder` makes a later call instant."""
    base = preset(preset_name)
    run = RunConfig(base.task, base.model, override(base.train, {
        "lr": base.train.lr[:1], "seed": (0,), "steps": steps, "target_accuracy": 2.0,
        "snapshots_per_octave": 1, "device": str(device), "sampler": "generator"}))
    train(run, progress=True, state_folder=folder)
    tensors, info = load_state(folder, steps)

    def one(prefix):
        return {key[len(prefix):]: t[0] for key, t in tensors.items() if key.startswith(prefix)}
    return {"weights": one("weights."), "m": one("adam.m."), "v": one("adam.v."), "t": info["adam_t"],
            "rng": tensors["rng.0"]}


def subnormal_shares(preset_name: str, trained: dict, batch: int) -> tuple[float, float]:
    """Shares of the trained model's answer probabilities on a fresh batch that are
    subnormal (0 < p < 2^-126) and that are exactly 0."""
    run = preset(preset_name)
    task = run.task.build()
    weights = stack([{**init_weights(run.model, task, 0), **trained["weights"]}])
    sample = task.sample(batch, torch.Generator().manual_seed(0))
    with torch.no_grad():
        p = last_position_logits(weights, sample.tokens[None]).softmax(-1)  # [1, B, O]
    tiny = torch.finfo(p.dtype).tiny
    return ((p > 0) & (p < tiny)).float().mean().item(), (p == 0).float().mean().item()


def core_name(core: str, device: torch.device, sizes: StepShape | None = None) -> str:
    """The attention core `core` resolves to on `device` for a step of `sizes`: vocab or fused."""
    elements = sizes.K * sizes.H * sizes.B * sizes.V if sizes else None
    return "fused" if choose_core(core, device, elements) is fused_attention.FusedAttention else "vocab"


def median_ratio(a: list[float], b: list[float], scale: float = 1.0, digits: int = 2) -> tuple[str, float]:
    """Per-round ratios a / b (sorted, as text) and their median."""
    ratios = sorted(x * scale / y for x, y in zip(a, b))
    return ", ".join(f"{r:.{digits}f}" for r in ratios), statistics.median(ratios)


def matmul_flops_per_second(device: torch.device, n: int = 1024, repeats: int = 10, rounds: int = 3) -> float:
    """The machine's fp32 matrix-product throughput now: torch.mm of two n x n matrices, best
    of a few short rounds (about 0.1 s on this CPU)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return max(steps_per_second(lambda: torch.mm(a, b), repeats, device) for _ in range(rounds)) * 2 * n ** 3


def steps_per_second(step, n: int, device: torch.device, seconds: float = 0.0, cpu_rates: list | None = None) -> float:
    """Steps per second, timed in blocks of `n` steps until at least `seconds` have passed
    (on CUDA one synchronisation per block: the clock sees queued work only after it).
    With `cpu_rates`, also appends steps per second of this process's CPU time (on a shared
    machine with one torch thread, the time other processes take from it is left out)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda _: None
    sync(device)
    start, cpu_start, done = time.perf_counter(), time.process_time(), 0
    while done == 0 or time.perf_counter() - start < seconds:
        for _ in range(n):
            step()
        done += n
        sync(device)
    if cpu_rates is not None:
        cpu_rates.append(done / (time.process_time() - cpu_start))
    return done / (time.perf_counter() - start)


def _status_mib(field: str) -> float:
    """A /proc/self/status memory field (VmRSS, VmHWM) in MiB."""
    return int(re.search(rf"^{field}:\s+(\d+) kB", open("/proc/self/status").read(), re.M)[1]) / 1024


def peak_memory_mib(variant: str, preset_name: str, batch: int, k: int, device: str,
                    seq_len: int | None = None, model: dict | None = None) -> float:
    """Run in a fresh process: build `variant`, do MEMORY_STEPS steps, return its peak memory."""
    import transformer_lens.model_bridge.sources.native  # noqa: F401  (library import not counted)

    dev = torch.device(device)
    if dev.type == "cpu":
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the RSS high-water mark (VmHWM) to the current RSS
        rss_before = _status_mib("VmRSS")
    step = VARIANTS[variant](preset_name, batch, k, dev, seq_len, model=model)
    for _ in range(MEMORY_STEPS):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) / 2**20
    return _status_mib("VmHWM") - rss_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="config-a", help="models.recall.config preset (task + model)")
    parser.add_argument("--batch", type=int, default=1024, help="prompts per step per model")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--steps", type=int, default=3, help="steps per timed block (a round is >= 1 block)")
    parser.add_argument("--round-seconds", type=float, default=1.0, help="least seconds timed per round")
    parser.add_argument("--k", type=int, default=1, help="models stacked in our trainer")
    parser.add_argument("--n-heads", type=int, default=None, help="replace the preset model's head count")
    parser.add_argument("--d-mlp", type=int, default=None, help="replace the preset model's MLP width")
    parser.add_argument("--n-layers", type=int, default=None,
                        help="replace the preset model's depth L (1 to 4; L >= 2 runs models/cores/deep.py)")
    parser.add_argument("--attention-core", choices=CORES, default="auto",
                        help="our attention core (models.cores.forward.CORES; auto: fused on a GPU with Triton)")
    parser.add_argument("--compare-core", choices=CORES[1:], default=None,
                        help="also time ours with this attention core (variant ours-CORE, against ours)")
    parser.add_argument("--peak-flops", type=float, default=None,
                        help="the device's fp32 FLOP/s (default: a known GPU's datasheet peak, else the "
                             "measured matmul rate)")
    parser.add_argument("--peak-bandwidth", type=float, default=None,
                        help="the device's memory bytes/s (default: a known GPU's datasheet peak, else the "
                             "measured copy rate)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--record", type=Path, default=None,
                        help="record each attention core's median steps/s (graphed with --graphed) as the line "
                             "--line of this measured record (results/gpu/measured.json: analyses.sweeps.gpu_records)")
    parser.add_argument("--line", default=None, help="the bench line's name in --record")
    parser.add_argument("--counter", action="store_true",
                        help="also time ours with the counter sampler (variant ours-counter)")
    parser.add_argument("--graphed", action="store_true",
                        help="CUDA: also time ours with the counter sampler, its whole step captured in a CUDA graph "
                             "and replayed (variant ours-graphed, against ours-counter: the same step eager)")
    parser.add_argument("--memory-seq-lens", type=lambda t: [int(x) for x in t.split(",")], default=[32, 256],
                        help="sequence lengths T at which to measure our peak memory (default 32,256)")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory measurements (each one a fresh process)")
    parser.add_argument("--trained-steps", type=int, default=8192,
                        help="also time both on a model trained this many steps "
                             "(a power of two; 0: fresh weights only)")
    parser.add_argument("--trained-state", type=Path, default=None,
                        help="folder keeping that trained model's state, reused when present "
                             "(default: PRESET-STEPS-DEVICE in the temporary folder)")
    args = parser.parse_args()
    device = resolve_device(args.device)
    if (args.record is None) != (args.line is None):
        parser.error("--record and --line go together")
    if args.graphed and device.type != "cuda":
        parser.error(f"--graphed needs a CUDA device, got {device}")
    args.counter = args.counter or args.graphed
    if args.trained_steps and 2 ** round(math.log2(args.trained_steps)) != args.trained_steps:
        parser.error(f"--trained-steps must be 0 or a power of two, got {args.trained_steps}")
    model = {key: value for key, value in (("n_heads", args.n_heads), ("d_mlp", args.d_mlp),
                                           ("n_layers", args.n_layers)) if value is not None}
    if model and args.trained_steps:
        parser.error("--n-heads, --d-mlp and --n-layers time fresh weights only: add --trained-steps 0")
    deep = model.get("n_layers", 1) != 1  # no attention core, no cost model: models/cores/deep.py
    if deep and (args.attention_core == "fused" or args.compare_core or args.record):
        parser.error("--attention-core fused, --compare-core and --record time one-layer models only")
    try:
        bench_run(args.preset, model=model).model.validate()
    except ValueError as error:
        parser.error(str(error))
    core = core_name(args.attention_core, device, StepShape.of(bench_run(args.preset, model=model), args.batch, args.k))
    if args.compare_core is not None:
        FLUSHED[f"ours-{args.compare_core}"] = True
        if args.compare_core == "fused" and not fused_attention.runs_on(device):
            parser.error(f"--compare-core fused cannot run on {device} here (it needs Triton)")

    steps = {name: make(args.preset, args.batch, args.k, device, model=model) for name, make in VARIANTS.items()}
    ours = functools.partial(make_ours, args.preset, args.batch, args.k, device, model=model,
                             attention_core=args.attention_core)
    steps["ours"] = ours()
    if args.compare_core is not None:  # beside ours as timed: graphed with --graphed, else eager
        steps[f"ours-{args.compare_core}"] = ours(attention_core=args.compare_core,
                                                  **(dict(sampler="counter", graphed=True) if args.graphed else {}))
    if args.counter:
        steps["ours-counter"] = ours(sampler="counter")
    if args.graphed:
        steps["ours-graphed"] = ours(sampler="counter", graphed=True)
    if args.trained_steps:
        folder = args.trained_state or Path(tempfile.gettempdir()) / "train_throughput" / \
            f"{args.preset}-{args.trained_steps}-{device.type}-generator"
        print(f"trained model: {args.trained_steps} steps of models.recall.trainer, state in {folder}")
        try:
            trained = trained_state(args.preset, args.trained_steps, folder, device)
        except CheckpointError as error:
            parser.error(f"--trained-state {folder}: {error}")
        steps.update({"ours-trained": ours(trained=trained), "ours-trained-kept": ours(trained=trained),
                      "tl-trained": make_tl(args.preset, args.batch, args.k, device, trained=trained)})
    for name, step in steps.items():  # warm-up (and a graphed step's capture)
        with flushed(device, FLUSHED[name]):
            steps_per_second(step, 5, device)
    rates = {name: [] for name in steps}
    cpu_rates = {name: [] for name in steps}
    matmul_rates, copy_rates = [], []  # measured in every round, next to ours: the floor moves with the machine
    for _ in range(args.repeats):
        for name, step in steps.items():
            with flushed(device, FLUSHED[name]):  # as models.recall.trainer.train does for ours
                rates[name].append(steps_per_second(step, args.steps, device, args.round_seconds, cpu_rates[name]))
            if name == "ours":
                matmul_rates.append(matmul_flops_per_second(device))
                copy_rates.append(copy_bandwidth(device))

    def memory_of(name: str, seq_len: int | None = None) -> float:
        with mp.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
            return pool.apply(peak_memory_mib, (name, args.preset, args.batch, args.k, str(device), seq_len, model))
    memory = {} if args.no_memory else {name: memory_of(name) for name in VARIANTS}
    memory_by_length = {} if args.no_memory else {T: memory_of("ours", T) for T in args.memory_seq_lens}

    run = bench_run(args.preset, model=model)
    task, shape = run.task, run.model
    print(f"config {args.preset}: S={task.n_subjects} R={task.n_relations} D={task.answers_per_relation} "
          f"N={task.n_noise} T={task.seq_len} d={shape.d_model} H={shape.n_heads} d_h={shape.d_head} "
          f"m={shape.d_mlp} | batch {args.batch} | K={args.k} | {args.repeats} rounds of >= {args.steps} steps "
          f"and >= {args.round_seconds:g} s | device {device} | torch threads {torch.get_num_threads()} "
          f"| attention core {'none (L > 1: models/cores/deep.py)' if deep else core} | L={shape.n_layers}")
    memory_kind = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak RSS growth from setup"
    print(f"{'variant':<18}{'models':>7}{'steps/s min':>13}{'median':>9}{'max':>9}{'peak MiB':>10}{'CPU-time':>12}"
          f"   (peak: {memory_kind}; CPU-time: median steps/s of process CPU time)")
    for name, r in rates.items():
        peak = f"{memory[name]:>10.1f}" if name in memory else f"{'-':>10}"
        models = 1 if name.startswith("tl") else args.k
        print(f"{name:<18}{models:>7}{min(r):>13.2f}{statistics.median(r):>9.2f}{max(r):>9.2f}{peak}"
              f"{statistics.median(cpu_rates[name]):>12.2f}")
    if deep:  # bench/step_cost.py counts one layer's step
        print("flops_per_step not counted for L > 1 (bench/step_cost.py models one layer)")
        per_round, median = median_ratio(rates["ours"], rates["tl"], args.k, digits=1)
        print("speedup per round (model-steps/s of ours / steps/s of tl): " + per_round)
        print(f"speedup_vs_transformerlens {median:.1f}")
        return
    sizes = StepShape.of(run, args.batch, args.k)
    flops = step_flops(sizes, core)
    ours_rate, matmul = statistics.median(rates["ours"]), statistics.median(matmul_rates)
    floor_ms, step_ms = 1e3 * flops / matmul, 1e3 / ours_rate
    # per round: our step time over the floor at that round's matmul throughput
    floor_ratios = sorted(m / (flops * o) for o, m in zip(rates["ours"], matmul_rates))
    print(f"flops_per_step {flops:.3e} (matrix products of the last-position forward and backward)")
    print(f"matmul_throughput {matmul:.3e} FLOP/s (torch.mm 1024 x 1024, fp32, median over rounds of "
          f"the best of 3 short runs, each measured right after ours)")
    print(f"achieved {flops * ours_rate:.3e} FLOP/s = {100 * flops * ours_rate / matmul:.0f}% of it; floor "
          f"{floor_ms:.2f} ms/step, ours {step_ms:.2f} ms/step")
    print("step time over the floor per round: " + ", ".join(f"{r:.2f}" for r in floor_ratios))
    print(f"floor_ratio {statistics.median(floor_ratios):.2f}")
    copy = statistics.median(copy_rates)
    print(f"copy_bandwidth {copy:.3e} B/s (a 256 MiB tensor copy, read and write counted, median over rounds)")
    peak_flops, peak_bandwidth, source = device_peaks(device, matmul, copy, (args.peak_flops, args.peak_bandwidth))
    print(f"against the peaks {peak_flops:.3e} FLOP/s and {peak_bandwidth:.3e} B/s: {source}")
    cores = {"ours": core} | ({f"ours-{args.compare_core}": args.compare_core} if args.compare_core else {})
    for name, named_core in cores.items():
        print(f"{name}: " + "\n".join(cost_lines(sizes, core_name(named_core, device), statistics.median(rates[name]),
                                                 peak_flops, peak_bandwidth)))
    for name in (n for n in rates if n.startswith("ours")):  # useful FLOPs over the measured matmul rate
        useful = step_flops(sizes, core_name(cores.get(name, core), device)) * statistics.median(rates[name])
        print(f"model_flop_utilisation {name} {100 * useful / matmul:.1f}%  ({useful:.3e} useful FLOP/s, "
              f"{args.preset} K={args.k}, {statistics.median(rates[name]):.1f} steps/s, matmul {matmul:.3e} FLOP/s)")
    if args.compare_core is not None:
        base = "ours-graphed" if args.graphed else "ours"
        per_round, median = median_ratio(rates[f"ours-{args.compare_core}"], rates[base])
        print(f"ours_{args.compare_core}_over_{base.replace('-', '_')} {median:.2f}  (per round: {per_round})")
    print("peak memory of ours by sequence length: " + (", ".join(
        f"T={T}: {mib:.1f} MiB" for T, mib in memory_by_length.items()) or "not measured"))
    # each round's ratio compares two runs seconds apart, so the machine's drift (measured here:
    # +-25% over minutes) cancels; the median over rounds is the figure
    if args.trained_steps:
        share, zero = subnormal_shares(args.preset, trained, args.batch)
        print(f"trained model's answer probabilities: {100 * share:.2f}% subnormal, {100 * zero:.2f}% exactly 0")
        for label, a, b in (("ours_trained_over_fresh", "ours-trained", "ours"),
                            ("tl_trained_over_fresh", "tl-trained", "tl"),
                            ("ours_trained_flushed_over_kept", "ours-trained", "ours-trained-kept")):
            per_round, median = median_ratio(rates[a], rates[b])
            print(f"{label} {median:.2f}  (steps/s {a} / {b} per round: {per_round})")
            if device.type == "cpu":  # the same in steps per second of CPU time (one thread: load-free)
                per_round, median = median_ratio(cpu_rates[a], cpu_rates[b])
                print(f"{label}_cpu_time {median:.2f}  (per round: {per_round})")
        per_round, median = median_ratio(rates["ours-trained"], rates["tl-trained"], args.k, digits=1)
        print(f"speedup_vs_transformerlens_trained {median:.1f}  (per round: {per_round})")
    if args.counter:
        per_round, median = median_ratio(rates["ours-counter"], rates["ours"])
        print(f"ours_counter_over_generator {median:.2f}  (per round: {per_round})")
    if args.graphed:
        per_round, median = median_ratio(rates["ours-graphed"], rates["ours-counter"])
        print(f"ours_graphed_over_eager {median:.2f}  (per round: {per_round})")
        per_round, median = median_ratio(rates["ours-graphed"], rates["tl"], args.k, digits=1)
        print(f"speedup_graphed_vs_transformerlens {median:.1f}  (per round: {per_round})")
    per_round, median = median_ratio(rates["ours"], rates["tl"], args.k, digits=1)
    print("speedup per round (model-steps/s of ours / steps/s of tl): " + per_round)
    print(f"speedup_vs_transformerlens {median:.1f}")
    if args.record is not None:
        record_line(args.record, args.line, rates, core_name(core, device), args.compare_core, args.graphed, sizes,
                    device)


def record_line(path: Path, line: str, rates: dict, core: str, compare: str | None, graphed: bool,
                sizes: StepShape, device: torch.device) -> None:
    """Each attention core's median steps/s (the graphed step's with --graphed) as `line` of the
    measured record, with the code it measured (analyses.sweeps.gpu_records) and the step's [K, H, B, V]
    elements, by which models.cores.forward.choose_core finds the line nearest a step."""
    from analyses.sweeps.gpu_records import CODE, code_hash, record

    timed = {core: "ours-graphed" if graphed else "ours"} | ({compare: f"ours-{compare}"} if compare else {})
    record(path, line, {"code": code_hash(CODE["bench"]), "steps_per_second": {
        name: round(statistics.median(rates[variant]), 2) for name, variant in timed.items()},
        "graphed": graphed, "models": sizes.K, "buffer_elements": sizes.K * sizes.H * sizes.B * sizes.V,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"})


if __name__ == "__main__":
    main()
