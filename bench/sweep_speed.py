"""Sweep throughput: the same small trade-off grid through --executor local and --executor ray.

Runs `python -m analyses.tradeoff grid` (in this process, each time into a fresh temporary
--out) on --heads x --widths of the paper-tradeoff task with a step cap (--steps), first with
the local executor (one cell after another), then on a local Ray instance of --workers
workers; every cell of both computes with --torch-threads torch threads (default 1), so the
two tables are compared at equal thread counts. Ray is started and its workers warmed
(torch imported) before the clock starts; its start-up time is printed apart. Each wall time
covers the whole command (cells, CSV, figure). Then the per-cell overhead of each executor:
--empty cells that do nothing, one after another (each submitted when the previous one has
returned, as a binary search does), recorded like any cell.

Prints cells per hour of each executor, `ray_over_local <ratio>` and
`ray_overhead_per_cell_s <seconds>` (Ray's latency per empty cell minus the local one), and
checks that both executors wrote the same table. Other flags go to the grid command
(e.g. --contexts 2 --patch-contexts 1 for a cheaper locate_facts).

    .venv/bin/python bench/sweep_speed.py [--heads 2,4,8,16] [--widths 16,64] [--steps 200] [--workers 2] [GRID FLAGS]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from analyses import tradeoff  # noqa: E402
from analyses.sweeps.cells import Cell, Cells, one, run_jobs  # noqa: E402
from analyses.sweeps.executors import LocalExecutor, RayExecutor, start_ray  # noqa: E402


def empty_cell(i: int) -> dict:
    """A cell that does nothing: what is left is the executor's own cost."""
    return {"i": i}


def warm_worker(seconds: float) -> dict:
    """Import what a trade-off cell imports, and hold the worker so that each worker gets one."""
    import analyses.tradeoff  # noqa: F401

    time.sleep(seconds)
    return {}


def chain(n: int):
    """A job asking for n empty cells one after another."""
    for i in range(n):
        yield Cell(f"empty{i}", empty_cell, (i,))


def grid_seconds(argv: list[str]) -> tuple[float, pd.DataFrame]:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            assert tradeoff.main([*argv, "--out", out]) == 0
        seconds = time.perf_counter() - start
        return seconds, pd.read_csv(Path(out) / "grid.csv")


def empty_cell_seconds(executor, n: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        cells = Cells(out, {"bench": "empty cells"})
        start = time.perf_counter()
        run_jobs([chain(n)], cells, executor, progress=False)
        return (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", default="2,4,8,16", help="H values of the grid (default 2,4,8,16)")
    p.add_argument("--widths", default="16,64", help="m values of the grid (default 16,64)")
    p.add_argument("--steps", type=int, default=200, help="training steps per cell (default 200)")
    p.add_argument("--workers", type=int, default=2, help="Ray workers (default 2)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads of every cell (default 1)")
    p.add_argument("--empty", type=int, default=50, help="empty cells timed per executor (default 50)")
    args, grid_flags = p.parse_known_args()
    warnings.simplefilter("ignore", pd.errors.PerformanceWarning)  # pandas' advice to locate_facts, once per cell
    argv = ["grid", "--heads", args.heads, "--widths", args.widths, "--steps", str(args.steps),
            "--target-accuracy", "2", "--device", "cpu", "--torch-threads", str(args.torch_threads), "--quiet",
            *grid_flags]  # every cell runs all its steps
    n_cells = len(args.heads.split(",")) * len(args.widths.split(","))
    print(f"grid: {n_cells} cells of the paper-tradeoff task (H in {args.heads}, m in {args.widths}), "
          f"{args.steps} steps each{' ' + ' '.join(grid_flags) if grid_flags else ''}; {os.cpu_count()} cores")

    local, local_table = grid_seconds(argv)
    print(f"local: {local:.1f} s = {n_cells / local * 3600:.0f} cells/h "
          f"(this process, {args.torch_threads} torch thread(s) per cell)")

    start = time.perf_counter()
    start_ray(num_cpus=args.workers)
    import ray

    with tempfile.TemporaryDirectory() as out:
        run_jobs([one(Cell(f"warm{i}", warm_worker, (2.0,))) for i in range(args.workers)], Cells(out, {}),
                 RayExecutor(), progress=False)
    startup = time.perf_counter() - start
    ray_seconds, ray_table = grid_seconds([*argv, "--executor", "ray"])
    print(f"ray: {ray_seconds:.1f} s = {n_cells / ray_seconds * 3600:.0f} cells/h "
          f"({args.workers} workers x {args.torch_threads} torch thread(s); start-up and warm-up {startup:.1f} s, "
          "not counted)")
    print(f"same table: {ray_table.equals(local_table)}")
    print(f"ray_over_local {local / ray_seconds:.2f}")

    ray_empty = empty_cell_seconds(RayExecutor(), args.empty)
    ray.shutdown()
    local_empty = empty_cell_seconds(LocalExecutor(), args.empty)
    print(f"empty cell, one after another: ray {ray_empty * 1e3:.1f} ms, local {local_empty * 1e3:.1f} ms")
    print(f"ray_overhead_per_cell_s {ray_empty - local_empty:.3f}")


if __name__ == "__main__":
    main()
