"""Wall-clock time of `python -m analyses.locate_facts CKPT/` with default settings on a
paper-tradeoff checkpoint (S = R = 32, D = 8: 1024 facts), the whole process included
(imports, loading, every instrument, CSV, JSON and figures). Target: under 60 s on a
2-core CPU.

    python bench/locate_facts_speed.py [--ckpt CKPT] [--repeats 3] [--facts 3:1] [--preset P] [--train-steps N]

Without --ckpt it first trains --preset (default paper-tradeoff; --train-steps caps its steps,
as `models.train --steps` does: the smallest run, for a test) into a temporary directory. With
--facts it also times `--facts S:R,...` (the chosen facts only), interleaved with the run
over every fact, and prints the ratio of the analysis' own times (summary.json).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", type=Path, default=None, help="a paper-tradeoff checkpoint (default: train one)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of the CLI (default 3)")
    p.add_argument("--device", default="auto", help="device passed to the CLI (default auto)")
    p.add_argument("--facts", default=None, metavar="S:R,...", help="also time locate_facts --facts S:R,...")
    p.add_argument("--preset", default="paper-tradeoff",
                   help="the preset trained without --ckpt (default paper-tradeoff)")
    p.add_argument("--train-steps", type=int, default=None, metavar="N",
                   help="without --ckpt: train N steps (default: the preset's)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.ckpt
        if ckpt is None:
            ckpt = Path(tmp) / args.preset
            steps = [] if args.train_steps is None else ["--steps", str(args.train_steps)]
            subprocess.run([sys.executable, "-m", "models.train", "--preset", args.preset, "--out", str(ckpt),
                            "--quiet", *steps], check=True)
        seconds, analysis_seconds, chosen_seconds = [], [], []
        runs = itertools.count()

        def locate_facts(*extra: str) -> tuple[float, dict]:
            out = Path(tmp) / f"out{next(runs)}"  # each run its own fresh folder
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "analyses.locate_facts", str(ckpt), "--out", str(out),
                            "--device", args.device, "--quiet", *extra], check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - start, json.loads((out / "summary.json").read_text())
        for _ in range(args.repeats):
            wall, summary = locate_facts()
            seconds.append(wall)
            analysis_seconds.append(summary["seconds"])
            if args.facts:
                chosen_seconds.append(locate_facts("--facts", args.facts)[1]["seconds"])
    print(f"facts {summary['n_facts']}  contexts {summary['settings']['contexts']}  "
          f"device {summary['settings']['device']}")
    print(f"locate_facts wall seconds: min {min(seconds):.1f}  median {statistics.median(seconds):.1f}  "
          f"max {max(seconds):.1f}")
    print(f"the analysis alone (summary.json): min {min(analysis_seconds):.1f}  "
          f"median {statistics.median(analysis_seconds):.1f}  max {max(analysis_seconds):.1f}")
    if chosen_seconds:
        every, chosen = statistics.median(analysis_seconds), statistics.median(chosen_seconds)
        print(f"--facts {args.facts}, the analysis alone: min {min(chosen_seconds):.2f}  median {chosen:.2f}  "
              f"max {max(chosen_seconds):.2f}  ({chosen / every:.3f} of every fact's)")
    print(f"locate_facts_seconds {statistics.median(seconds):.1f}")


if __name__ == "__main__":
    main()
