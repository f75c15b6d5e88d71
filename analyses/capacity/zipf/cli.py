"""`zipf`, `oscillation` and `overoptimisation` in `python -m analyses.capacity`: each a sweep
of cells written to --out (resumable, --executor), and `zipf --plan`, its cost before it runs."""
from __future__ import annotations

import argparse
import textwrap
import time
from dataclasses import replace

import pandas as pd

from analyses.capacity.zipf import steps
from analyses.capacity.zipf.fits import MIN_POINTS
from analyses.capacity.zipf.laws import ZipfSweep, cell_bytes, cell_cost, cell_key, check_fits, zipf_row
from analyses.capacity.zipf.report import write_zipf, zipf_tables, zipf_text
from analyses.sweeps import cli
from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import open_executor
from models.bridge import resolve_device

COMMANDS = ("zipf", "oscillation", "overoptimisation")
PROBE_BYTES = 2 ** 30  # the plan times one seed of a cell estimated to hold at most this much
ZIPF = ("The error of associative memories W = Σ_z q(z) u_f*(z) e_z^T under Zipf data p(z) ∝ z^-α, exact "
        "over every token, against the sample size n and the dimension d: the talk's memory schemes (counts, "
        "seen once, a threshold) and the memories gradient descent, SGD and Adam store, each exponent fitted per "
        "seed beside the scaling laws (Hutter's n^-(α-1)/α; d^-(α-1)/(2α) for counts, d^-(α-1) for the "
        "threshold) and the q(z) each memory holds where d >= N. A slope needs three sizes along its axis.")
OSCILLATION = ("Full-batch gradient descent on two tokens with correlated unit embeddings and imbalanced "
               "frequencies, from W = 0: for each correlation and step size, the first step at perfect accuracy, "
               "the step from which it stays perfect, and how often the loss rose (Cabannes, Simsek & Bietti, "
               "ICML 2024: a large step oscillates, yet reaches perfect accuracy sooner).")
OVEROPTIMISATION = ("Gradient descent on N tokens with Zipf frequencies and unit embeddings on the circle (d = 2), "
                    "from W = 0: the error at the last step against the best over training and the smallest error "
                    "any W reaches, over seeds (Cabannes, Simsek & Bietti, ICML 2024: when the memory is "
                    "under-parameterised, more steps can raise the error while the loss still falls).")
STUDIES = {"oscillation": (steps.OscillationStudy, steps.oscillation_row, steps.oscillation_tables, "correlation"),
           "overoptimisation": (steps.OveroptimisationStudy, steps.overoptimisation_row,
                                steps.overoptimisation_tables, "tokens")}


def add_parsers(sub) -> None:
    z = sub.add_parser("zipf", description=_paragraph(ZIPF),
                       help="the error of associative memories under Zipf data against n and d: the talk's memory "
                            "schemes and what optimisers store, beside the scaling laws")
    cli.add_settings(z, ZipfSweep, "the memories")
    z.add_argument("--plan", action="store_true", help="print the cells, their multiply-adds and the time they "
                   "project to (at the rate of the cells recorded in --out, else of one measured here), and stop")
    o = sub.add_parser("oscillation", description=_paragraph(OSCILLATION),
                       help="gradient descent on two correlated, imbalanced tokens: a large step oscillates, yet "
                            "reaches perfect accuracy sooner (ICML 2024)")
    cli.add_settings(o, steps.OscillationStudy, "the study")
    v = sub.add_parser("overoptimisation", description=_paragraph(OVEROPTIMISATION),
                       help="gradient descent on N tokens in d = 2: more steps can raise the error when the memory "
                            "is under-parameterised (ICML 2024)")
    cli.add_settings(v, steps.OveroptimisationStudy, "the study")
    for q in (z, o, v):
        cli.add_out(q)
        cli.add_device(q)
        cli.add_quiet(q)
        cli.add_sweep(q)


def _paragraph(text: str) -> str:
    """A description as the help prints it (the parser keeps its line breaks): lines of 90."""
    return textwrap.fill(text, 90, break_on_hyphens=False)


def run(args: argparse.Namespace) -> int:
    executor = cli.executor(args)
    if args.command == "zipf":
        sweep = cli.settings(args, ZipfSweep)
        refuse_slopeless(sweep)
        check_fits(sweep, resolve_device(args.device))
        cells = Cells(args.out, sweep.recorded(), executor.torch_threads)
        if args.plan:
            print(plan_text(sweep, cells, args.device))
            return 0
        jobs = [one(Cell(cell_key(*c), zipf_row, (sweep, *c, args.device))) for c in sweep.cells()]
        with open_executor(executor) as running:
            rows = run_jobs(jobs, cells, running, desc="zipf cells", total=len(jobs), progress=not args.quiet)
        extra = {"device": str(resolve_device(args.device)), "cells_computed": cells.computed}
        result = zipf_tables(rows, sweep, extra)
        write_zipf(result, sweep, args.out)
        print(zipf_text(result) + f"\nwrote {args.out}/ ({cells.computed} new cells)")
        return 0
    study_cls, row_fn, tables, by = STUDIES[args.command]
    study = cli.settings(args, study_cls)
    cells = Cells(args.out, study.recorded(), executor.torch_threads)
    jobs = [one(Cell(f"{by}{value:g}", row_fn, (study, value, args.device))) for value in study.cells()]
    with open_executor(executor) as running:
        rows = run_jobs(jobs, cells, running, desc=f"{args.command} cells", total=len(jobs), progress=not args.quiet)
    table = tables(rows)
    steps.write_steps(args.command, table, rows, by, args.out,
                      {"settings": study.recorded(), "device": str(resolve_device(args.device))})
    print(steps.steps_text(args.command, table) + f"\nwrote {args.out}/ ({cells.computed} new cells)")
    return 0


def refuse_slopeless(sweep: ZipfSweep) -> None:
    """Refuse two sample sizes or two dimensions: an exponent needs MIN_POINTS along its axis
    (one value holds the axis fixed)."""
    for name, values in (("samples", () if sweep.population else sweep.sizes()), ("d", sorted(set(sweep.d)))):
        if 1 < len(values) < MIN_POINTS:
            raise ValueError(f"--{name} {','.join(map(str, values))}: the exponent against "
                             f"{'n' if name == 'samples' else 'd'} needs {MIN_POINTS} values or more (one holds it "
                             "fixed).")


def plan_text(sweep: ZipfSweep, cells: Cells, device: str) -> str:
    """The cells to compute and their multiply-adds (laws.cell_cost), and the time they project
    to: at the rate of the cells already recorded in --out, else at the rate of one seed of the
    costliest cell estimated to hold at most PROBE_BYTES (else of the cheapest), computed here:
    the plan never computes the study itself."""
    planned = pd.DataFrame([{"key": cell_key(*c), "alpha": c[0], "scheme": c[1], "d": c[2],
                             "cost": cell_cost(sweep, c[1], c[2]),
                             "recorded": cells.recorded(cell_key(*c)) is not None} for c in sweep.cells()])
    recorded = cells.rows()
    if recorded:
        rate, source = (sum(r["multiply_adds"] for r in recorded) / sum(r["seconds"] for r in recorded),
                        f"the {len(recorded)} cells recorded in {cells.out}")
    else:
        probe = replace(sweep, seeds=sweep.seeds[:1])
        small = [sum(sum(p.values()) for p in cell_bytes(probe, r.scheme, r.d, resolve_device(device)).values())
                 <= PROBE_BYTES for r in planned.itertuples()]
        costliest = planned[small].loc[planned[small]["cost"].idxmax()] if any(small) else \
            planned.loc[planned["cost"].idxmin()]
        start = time.perf_counter()
        zipf_row(probe, costliest["alpha"], costliest["scheme"], int(costliest["d"]), device)
        rate = cell_cost(probe, costliest["scheme"], int(costliest["d"])) / (time.perf_counter() - start)
        source = f"one seed of {costliest['key']}, computed here"
    todo = planned[~planned["recorded"]]
    lines = [f"plan: {len(planned)} cells ({len(planned) - len(todo)} recorded), {len(sweep.seeds)} seeds, "
             f"n = {'∞' if sweep.population else ','.join(map(str, sweep.sizes()))}; to compute:"]
    for scheme, g in todo.groupby("scheme", sort=False):
        top = g.loc[g["cost"].idxmax()]
        lines.append(f"  {scheme:<9} {len(g)} cells, {g['cost'].sum() / 1e9:.2f} G multiply-adds (the largest: "
                     f"{top['key']}, {top['cost'] / 1e9:.2f} G)")
    device = resolve_device(device)
    need, where, largest = max(((sum(parts.values()), place.type, cell_key(*c)) for c in sweep.cells()
                                for place, parts in cell_bytes(sweep, c[1], c[2], device).items()),
                               key=lambda t: t[0])
    lines.append(f"memory: at most an estimated {need / 2 ** 30:.2f} GiB on {where} ({largest})")
    total = float(todo["cost"].sum())
    lines.append(f"total {total / 1e9:.1f} G multiply-adds, about {total / rate / 60:.1f} min at "
                 f"{rate / 1e9:.2f} G/s ({source}; --executor processes divides it by the workers)")
    return "\n".join(lines)
