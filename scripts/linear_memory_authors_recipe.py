"""python scripts/linear_memory_authors_recipe.py --d 8,16,32,64 --out results/capacity/linear_authors_recipe

A one-off check of the linear memory's capacity N* with the official code's recipe for the
paper's Figure 1 (left): identity map f(i) = i (M = N outputs), unit-sphere embeddings, Adam
at lr 1000 for 2^12 steps, accuracy measured every 32 steps (the best measurement must reach
99%), seeds {0, 1, 11, 111, 42}, bisection to 1%. `analyses.capacity memory --kind linear`
differs in the optimiser settings (lr 0.1, 2000 steps, accuracy at every step), the seeds
(0..N-1) and the bisection (5%). Same cells, report and figure as that command, so the two
summaries read alike (docs/capacity.md, results/capacity/README.md).
"""
from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from analyses.capacity import authors_line, memory_report
from analyses.sweeps.cells import Cells
from analyses.sweeps.search import largest_passing
from models.bridge import resolve_device
from models.cli import comma_list, run_cli
from models.recall.memories import MemoryConfig, fit
from models.training.progress import progress_bar

SEEDS = (0, 1, 11, 111, 42)
REL_TOL = 0.01


def recipe(d: int) -> MemoryConfig:
    return MemoryConfig(kind="linear", d=d, lr=1000.0, steps=2 ** 12, eval_every=32)


def capacity(cfg: MemoryConfig, seed: int, cells: Cells, device, bar) -> int:
    """The largest N stored at >= 99% by seed's memory of size d, to 1%; the search starts on
    the paper's line N ln N = d^2 / 1.3."""
    def passes(n: int) -> bool:
        key = f"linear_d{cfg.d}_seed{seed}_N{n}"
        row = cells.recorded(key) or cells.record(key, {"d": cfg.d, "seed": seed, "n": n,
                                                        **_fit_row(cfg, n, seed, device)})
        bar.update(1)
        bar.set_postfix(d=cfg.d, seed=seed, N=n, acc=f"{row['accuracy']:.3f}")
        return row["accuracy"] >= cfg.target_accuracy
    start = max(2, round(float(authors_line(cfg).n_on_line(cfg.theory))))
    return largest_passing(passes, start, lowest=2, rel_tol=REL_TOL)


def _fit_row(cfg: MemoryConfig, n: int, seed: int, device) -> dict:
    result = fit(cfg, n, [seed], device)
    return {"accuracy": result["accuracy"][0], "steps_run": result["steps_run"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/linear_memory_authors_recipe.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", type=comma_list(int), default=(8, 16, 32, 64),
                   help="embedding dimensions (default 8,16,32,64)")
    p.add_argument("--seeds", type=comma_list(int), default=SEEDS, help="seeds (default the official 0,1,11,111,42)")
    p.add_argument("--out", type=Path, required=True, help="output directory (resumable)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if min(args.d) < 2:
        raise ValueError("--d must be >= 2.")
    device = resolve_device(args.device)
    configs = [recipe(d) for d in args.d]
    settings = {"analysis": "capacity memory, the official recipe", "rel_tol": REL_TOL,
                **{k: v for k, v in asdict(configs[0]).items() if k not in ("d", "m")}}
    cells = Cells(args.out, settings)
    rows = []
    with progress_bar(desc="memory probes", unit="probe", disable=args.quiet) as bar:
        for cfg in configs:
            for seed in args.seeds:
                n_star = capacity(cfg, seed, cells, device, bar)
                rows.append({"kind": "linear", "d": cfg.d, "m": None, "seed": seed, "n_star": n_star,
                             "parameters": cfg.parameters, "theory": cfg.theory,
                             "n_star_over_theory": n_star / cfg.theory})
    memory_report(pd.DataFrame(rows), configs[0], args.out, pd.DataFrame(cells.rows()),
                  {"settings": settings, "seeds": list(args.seeds), "device": str(device),
                   "probes_computed": cells.computed})
    print(f"wrote {args.out}/ ({cells.computed} new probes)")
    return 0


if __name__ == "__main__":
    run_cli(main)
