"""Does flushing subnormal floats change what training reaches? Seeds x trade-off grid cells.

For each cell (H, m) of the paper's trade-off grid (S = R = 32, D = 8, N = 64, T = 32, d = 32,
d_h = 8, Adam lr 1e-2, batch 1024, up to 2^14 steps, stop at 99% held-out accuracy,
evaluation every 128 steps on 4096 prompts) and each seed, one model is trained on the CPU
with one thread, once with subnormals flushed to zero (the trainer's default,
models.training.subnormals) and once with them kept. Flushing changes the last bits of some numbers,
and training amplifies any such change, so the two runs of a seed part ways at some step;
the question is whether success rates and steps to 99% move by more than they move from
seed to seed.

Writes one JSON row per run to OUT/runs/ (a finished run is skipped when the script runs
again; several processes, say one per variant, can share OUT), then from every row there:
OUT/runs.csv (one line per run), OUT/summary.csv (per cell and variant: success rate,
steps to 99% median / min / max, steps per second) and OUT/curves.png (accuracy curves).

    .venv/bin/python bench/subnormal_seeds.py [--cells 8x64,4x32,16x16] [--seeds 0,1,2,3] \\
        [--variants flushed,kept] [--steps 16384] [--out results/trainer_subnormals]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from analyses.sweeps.output import write_csv
from models.checkpoint import write_json
from models.cli import override
from models.out_folder import claim, only
from models.recall.config import RunConfig
from models.recall.presets import preset
from models.recall.trainer import train

VARIANTS = ("flushed", "kept")


def cell_run(heads: int, width: int, seed: int, steps: int) -> RunConfig:
    """The paper trade-off grid's cell (H, m) for one seed, on the CPU."""
    base = preset("paper-tradeoff")
    return RunConfig(base.task, override(base.model, {"n_heads": heads, "d_mlp": width}),
                     override(base.train, {"seed": (seed,), "steps": steps, "snapshots_per_octave": 0,
                                           "device": "cpu"}))


def run_row(heads: int, width: int, seed: int, variant: str, steps: int) -> dict:
    """Train one cell and seed with subnormals `variant`; its outcome and accuracy curve."""
    run = cell_run(heads, width, seed, steps)
    result = train(run, progress=False, flush_subnormals=variant == "flushed")
    t = result.training
    curve = [(row["step"], row["accuracy"]) for row in result.metrics]
    reached = [step for step, acc in curve if acc >= run.train.target_accuracy]
    return {"heads": heads, "width": width, "seed": seed, "subnormals": t["subnormals"],
            "reached_99": bool(reached), "steps_to_99": reached[0] if reached else None,
            "best_accuracy": max(acc for _, acc in curve), "steps_run": t["steps_run"],
            "seconds": t["seconds"], "steps_per_second": round(t["steps_run"] / t["seconds"], 1),
            "curve": curve}


def first_difference(a: list, b: list) -> tuple[int | None, float | None]:
    """The first evaluation step where two curves differ, and the accuracy just before it."""
    before = None
    for (step, x), (_, y) in zip(a, b):
        if x != y:
            return step, before
        before = x
    return None, None


def summarize(rows: list[dict], out: Path) -> None:
    """runs.csv, summary.csv and curves.png from all rows."""
    import pandas as pd

    table = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in rows])
    table = table.sort_values(["heads", "width", "seed", "subnormals"])
    pairs = {(r["heads"], r["width"], r["seed"], r["subnormals"]): r["curve"] for r in rows}
    split = [first_difference(pairs[(h, m, s, "flushed")], pairs[(h, m, s, "kept")])
             if (h, m, s, "flushed") in pairs and (h, m, s, "kept") in pairs else (None, None)
             for h, m, s in zip(table["heads"], table["width"], table["seed"])]
    table["variants_differ_from_step"] = [s for s, _ in split]
    table["accuracy_before_difference"] = [a for _, a in split]
    write_csv(out / "runs.csv", table)
    summary = []
    for (h, m, variant), g in table.groupby(["heads", "width", "subnormals"]):
        steps = g["steps_to_99"].dropna()
        summary.append({"heads": h, "width": m, "subnormals": variant, "seeds": len(g),
                        "success_rate": g["reached_99"].mean(),
                        "steps_to_99_median": statistics.median(steps) if len(steps) else None,
                        "steps_to_99_min": steps.min() if len(steps) else None,
                        "steps_to_99_max": steps.max() if len(steps) else None,
                        "best_accuracy_median": g["best_accuracy"].median(),
                        "steps_per_second_median": g["steps_per_second"].median()})
    write_csv(out / "summary.csv", pd.DataFrame(summary))
    plot_curves(rows, out / "curves.png")


def plot_curves(rows: list[dict], path: Path) -> None:
    """Held-out accuracy against step, one panel per cell, one colour per seed; solid:
    flushed, dashed: kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["heads"], r["width"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(4.5 * len(cells), 3.6), squeeze=False)
    for ax, (h, m) in zip(axes[0], cells):
        for r in rows:
            if (r["heads"], r["width"]) != (h, m):
                continue
            steps, acc = zip(*r["curve"])
            ax.plot(steps, acc, color=f"C{r['seed']}", ls="-" if r["subnormals"] == "flushed" else "--",
                    lw=1, label=f"seed {r['seed']}" if r["subnormals"] == "flushed" else None)
        ax.axhline(0.99, color="gray", lw=0.5)
        ax.set(title=f"H = {h}, m = {m}", xlabel="step", ylim=(0.8, 1.0))
    axes[0][0].set_ylabel("held-out accuracy (solid: flushed, dashed: kept)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_cells(text: str) -> list[tuple[int, int]]:
    try:
        return [tuple(int(x) for x in cell.split("x")) for cell in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"cells must read HxM,HxM (e.g. 8x64,4x32), got {text!r}") from None


def parse_variants(text: str) -> list[str]:
    variants = text.split(",")
    if any(v not in VARIANTS for v in variants):
        raise argparse.ArgumentTypeError(f"variants must be among {', '.join(VARIANTS)}, got {text!r}")
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=parse_cells, default=[(8, 64), (4, 32), (16, 16)],
                        help="grid cells HxM (heads x MLP width), comma-separated (default 8x64,4x32,16x16)")
    parser.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1, 2, 3],
                        help="seeds, comma-separated (default 0,1,2,3)")
    parser.add_argument("--variants", type=parse_variants, default=list(VARIANTS),
                        help="flushed and/or kept (default both)")
    parser.add_argument("--steps", type=int, default=2 ** 14, help="most steps per run (default 16384)")
    parser.add_argument("--out", type=Path, default=Path("results/trainer_subnormals"), help="output folder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:  # the one --out rule: a folder of its own, shared by this script's processes
        claim(args.out, only("runs", "runs.csv", "summary.csv", "curves.png"))
    except ValueError as e:
        parser.exit(2, f"error: {e}\n")
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    from models.training.progress import progress_bar

    todo = [(h, m, s, v) for h, m in args.cells for s in args.seeds for v in args.variants]
    for h, m, s, v in progress_bar(todo, desc="runs", unit="run"):
        path = args.out / "runs" / f"H{h}_m{m}_seed{s}_{v}.json"
        if not path.exists():
            write_json(path, run_row(h, m, s, v, args.steps))
    summarize([json.loads(p.read_text()) for p in sorted((args.out / "runs").glob("*.json"))], args.out)


if __name__ == "__main__":
    main()
