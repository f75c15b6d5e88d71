"""The GPU checks (docs/gpu.md), on a machine with CUDA:

  main_job     the tiny preset trained on CUDA and on the CPU (models.train), and
               analyses.locate_facts of the CUDA checkpoint on CUDA and on the CPU: final
               accuracies, and how many facts get a different storage label
  host_syncs   100 training steps (after warm-up) under torch.cuda.set_sync_debug_mode("error"),
               eager and replayed as a CUDA graph: the hot loop must never wait for the GPU
  determinism  two same-seed CUDA runs of 1000 steps, plain and with
               torch.use_deterministic_algorithms: bit-identical or not, the largest weight
               difference, and the seconds each run took

Writes gpu_checks.json to --out and prints it.

    python bench/gpu_checks.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode needs it before CUDA starts
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.train_throughput, run as a script

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from models.cli import override  # noqa: E402
from models.out_folder import claim, only  # noqa: E402
from models.recall.config import RunConfig  # noqa: E402
from models.recall.presets import preset  # noqa: E402
from models.recall.trainer import train  # noqa: E402


def _run(*args: str) -> float:
    """Seconds one CLI call took; its output goes to ours."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", *args, "--quiet"], cwd=ROOT, check=True)
    return round(time.perf_counter() - start, 1)


def main_job(out: Path) -> dict:
    """Train `tiny` on each device; locate the CUDA checkpoint's facts on each device."""
    report = {}
    for device in ("cuda", "cpu"):
        ckpt = out / f"tiny-{device}"
        seconds = _run("models.train", "--preset", "tiny", "--device", device, "--out", str(ckpt), "--force")
        training = json.loads((ckpt / "config.json").read_text())["training"]
        report[f"train_{device}"] = {"seconds": seconds, "final_accuracy": training["final_accuracy"],
                                     "steps_run": training["steps_run"]}
    located = {}
    for device in ("cuda", "cpu"):
        folder = out / f"locate-{device}"
        seconds = _run("analyses.locate_facts", str(out / "tiny-cuda"), "--device", device, "--out", str(folder))
        located[device] = pd.read_csv(folder / "facts.csv")
        report[f"locate_facts_{device}"] = {"seconds": seconds,
                                            "labels": located[device]["label"].value_counts().to_dict()}
    differ = located["cuda"]["label"] != located["cpu"]["label"]  # same checkpoint, same fact order
    report["facts"] = len(differ)
    report["labels_differing"] = int(differ.sum())
    report["differing_facts"] = located["cuda"].loc[differ, ["subject", "relation", "label"]].assign(
        label_cpu=located["cpu"].loc[differ, "label"]).to_dict("records")
    return report


def _fixed_steps(preset_name: str, device: str, steps: int) -> RunConfig:
    run = preset(preset_name)
    return RunConfig(run.task, run.model, override(run.train, {
        "device": device, "steps": steps, "target_accuracy": 2.0, "snapshots_per_octave": 0}))


def host_syncs() -> dict:
    """Run the trainer's step 100 times with CUDA's sync debugging set to raise: eager (the
    generator sampler) and replayed as a CUDA graph (the counter sampler, as --cuda-graph
    auto trains)."""
    from bench.train_throughput import make_ours

    report = {}
    for name, options in (("eager", {}), ("graphed", {"sampler": "counter", "graphed": True})):
        step = make_ours("tiny", 1024, 1, torch.device("cuda"), **options)
        for _ in range(10):  # warm-up (and the capture): allocations and lazy initialisation may sync once
            step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(100):
                step()
            report[name] = {"steps": 100, "host_syncs": "none"}
        except RuntimeError as e:
            report[name] = {"steps": 100, "host_syncs": str(e).splitlines()[0]}
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return report


def determinism(steps: int = 1000, presets: tuple[str, ...] = ("tiny", "paper-tradeoff")) -> dict:
    """Two same-seed runs per preset and mode: bit-identical, largest weight difference,
    seconds per run."""
    report = {}
    for name in presets:
        for mode in ("default", "deterministic"):
            torch.use_deterministic_algorithms(mode == "deterministic")
            weights, seconds = [], []
            try:
                for _ in range(2):
                    start = time.perf_counter()
                    weights.append(train(_fixed_steps(name, "cuda", steps), progress=False).weights)
                    seconds.append(round(time.perf_counter() - start, 2))
            finally:
                torch.use_deterministic_algorithms(False)
            diff = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
            report[f"{name}/{mode}"] = {
                "bit_identical": all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]),
                "max_abs_weight_difference": diff, "seconds": seconds}
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the checkpoints and gpu_checks.json")
    p.add_argument("--only", default="main_job,host_syncs,determinism", help="comma list of checks to run")
    args = p.parse_args()
    checks = {"main_job": lambda: main_job(args.out), "host_syncs": host_syncs, "determinism": determinism}
    unknown = set(args.only.split(",")) - set(checks)
    if unknown:
        p.error(f"--only: unknown check(s) {', '.join(sorted(unknown))}; choose from {', '.join(checks)}.")
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_checks.py: this machine has no CUDA device.")
    try:  # the one --out rule: a folder of its own (its checkpoints are replaced with --force)
        claim(args.out, only("gpu_checks.json", *(f"{kind}-{device}" for kind in ("tiny", "locate")
                                                    for device in ("cuda", "cpu"))))
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name in args.only.split(","):
        report[name] = checks[name]()
        print(json.dumps({name: report[name]}, indent=1), flush=True)
    (args.out / "gpu_checks.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
