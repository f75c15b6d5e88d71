"""Two-hop runs side by side (results/depth/two_hop/README.md, "Seeds and longer runs"): from
folders written by `python -m analyses.two_hop CKPT --out DIR`, a Markdown table (run, seed,
steps, accuracy at the last evaluation on one-hop facts, trained and held-out compositions, the
held-out best and its step, the no-composing baseline) and, with --figure, the held-out accuracy
over training of every run. A run is its folder's name; its training seed is the name's
`-seedN` suffix (none: seed 0).

usage: python scripts/two_hop_seeds.py DIR [DIR ...] [--figure PNG]
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from analyses.sweeps.output import save_figure, subplots
from models.cli import Parser, run_cli

HEADER = ["run", "seed", "steps", "one-hop facts", "trained compositions", "held-out, last",
          "held-out, best (step)", "no composing"]
SEED = re.compile(r"-seed(\d+)$")


def run(folder: Path) -> dict:
    """One run's numbers: its name, seed, curve (step, held_out) and last evaluation."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
        training = pd.read_csv(folder / "training.csv")
    except (OSError, json.JSONDecodeError, pd.errors.ParserError) as e:
        raise ValueError(f"{folder}: not a folder of python -m analyses.two_hop ({e})") from None
    if training.empty or training["held_out"].isna().all() or "r2_commonest" not in summary.get("baselines", {}):
        raise ValueError(f"{folder}: a run without held-out compositions")
    seed = SEED.search(folder.name)
    return {"run": folder.name, "seed": int(seed.group(1)) if seed else 0, "training": training,
            "baseline": summary["baselines"]["r2_commonest"], "held_out_compositions": summary["held_out_compositions"]}


def row(r: dict) -> list[str]:
    t = r["training"]
    last, best = t.iloc[-1], t.loc[t["held_out"].idxmax()]  # best: the earliest evaluation at the maximum
    return [r["run"], str(r["seed"]), f"{int(last['step'])}", f"{last['one_hop']:.3f}", f"{last['two_hop']:.3f}",
            f"{last['held_out']:.3f}", f"{best['held_out']:.3f} ({int(best['step'])})", f"{r['baseline']:.3f}"]


def table(runs: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row(r)) + " |" for r in runs])


def figure(runs: list[dict], path: Path):
    """One panel per number of held-out compositions (one per R): each run's held-out curve and
    the panel's no-composing baseline."""
    groups = sorted({r["held_out_compositions"] for r in runs})
    fig, axes = subplots(1, len(groups), figsize=(5 * len(groups), 3.6), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], groups):
        here = [r for r in runs if r["held_out_compositions"] == n]
        for r in here:
            ax.plot(r["training"]["step"], r["training"]["held_out"], lw=1, label=f"{r['run']} (seed {r['seed']})")
        ax.axhline(here[0]["baseline"], ls=":", color="grey", label="no composing")
        ax.set(xlabel="training step", title=f"{n} held-out compositions", ylim=(0, 1))
        ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("held-out compositions, accuracy")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__)
    p.add_argument("folders", nargs="+", type=Path, help="folders of python -m analyses.two_hop")
    p.add_argument("--figure", type=Path, help="write the held-out curves of every run here (PNG)")
    args = p.parse_args(argv)
    runs = [run(folder) for folder in args.folders]
    print(table(runs))
    if args.figure is not None:
        figure(runs, args.figure)
    return 0


if __name__ == "__main__":
    run_cli(main)
