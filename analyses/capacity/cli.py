"""The command line: `memory`, `transformer` and `departures`, each a sweep written to --out,
`plan`, a transformer sweep's model-steps before it runs, and the Zipf studies (zipf/cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from analyses import capacity
from analyses.capacity.departures import DepartureStudy, compare_departures, study_text
from analyses.capacity.memory import MemorySweep, memory_tables, memory_text, search_memories, write_memory
from analyses.capacity.plan import Oracle, default_oracle, plan_text, recorded_rate
from analyses.capacity.stopping import validate
from analyses.capacity.transformer import (
    TransformerSweep,
    search_transformers,
    transformer_tables,
    transformer_text,
    write_transformer,
)
from analyses.capacity.zipf import cli as zipf_cli
from analyses.sweeps import cli
from analyses.sweeps.cells import Cells
from analyses.sweeps.output import write_csv
from models.bridge import resolve_device
from models.out_folder import claim, only
from models.recall.config import TrainConfig


def _shape(text: str) -> tuple:
    values = cli.comma_list(float, distinct=False)(text)  # 1,1,8: a shape's values may repeat
    if len(values) not in (3, 4):
        raise argparse.ArgumentTypeError(f"a shape is ALPHA,BETA,H or ALPHA,BETA,H,LARGEST_D, got {text!r}")
    return values


# the search's and the figure's settings, and the model: the departures study sets these itself
UNTRAINED = ("shapes", "d", "min_size", "max_size", "probes", "fill_rounds", "give_up", "seeds", "stack",
             "parameterisation", "embedding", "bits_per_parameter", "facts_per_parameter")


def parser():
    p = cli.parser("python -m analyses.capacity", capacity.__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("memory", help="associative-memory capacity N* against size (Figure 1)")
    cli.add_settings(m, MemorySweep, "the memories")
    t = sub.add_parser("transformer", help="facts stored against parameters across shapes (Figure 4 left)")
    t.add_argument("--shape", dest="shapes", type=_shape, action="append",
                   help="ALPHA,BETA,H, or ALPHA,BETA,H,LARGEST_D to search that shape only up to d = "
                        "LARGEST_D; repeat for several shapes (default 1,1,2)")
    cli.add_seed(t, "initialisation and data")
    cli.add_settings(t, TransformerSweep, "the transformers", exclude=("shapes", "seed"))
    cli.add_recorded_only(t)
    t.add_argument("--combine", type=Path, metavar="RESULTS", default=None,
                   help="then every Figure 4 left protocol piece's sizes so far under RESULTS (results/, or "
                        "results/dry_run/) in one table and figure, as `python -m analyses.capacity.protocol "
                        "combine` writes them (scripts/gpu_run.sh: a piece's tables and the combined ones at once)")
    n = sub.add_parser("plan", help="the model-steps and time a transformer sweep would spend, today's rules against "
                                     "the new ones, from recorded results standing in for the training")
    n.add_argument("--shape", dest="shapes", type=_shape, action="append", help="as for transformer")
    cli.add_seed(n, "initialisation and data")
    cli.add_settings(n, TransformerSweep, "the transformers (as for transformer)", exclude=("shapes", "seed"))
    n.add_argument("--oracle", type=Path, action="append",
                   help="a recorded transformer sweep standing in for the training (repeat for several; default "
                        "the recorded Figure 4 left sweeps of the model: results/capacity/paper_fig4_left*)")
    n.add_argument("--out", type=cli.directory, help="output directory (plan.csv: every planned probe; default none)")
    n.add_argument("--done", action="store_true",
                   help="instead: how much of the GPU's science (Figure 4 left at the full protocol, Figure 4 right's "
                        "grid) the committed results have finished, and what the next scripts/gpu_run.sh call will "
                        "do, in model-steps and minutes at the rates a GPU measured")
    n.add_argument("--results", type=Path, default=None,
                   help="with --done: the results folder (default results/; a dry run's: results/dry_run)")
    v = sub.add_parser("departures", help="which of the authors' departures from the standard model changes the "
                                          "facts stored (each variant trained at one shape, size and S = R)")
    cli.add_seed(v, "initialisation and data")
    cli.add_settings(v, DepartureStudy, "the study")
    cli.add_settings(v, TransformerSweep, "the training (as a Figure 4 left probe)", exclude=(*UNTRAINED, "seed"))
    zipf_cli.add_parsers(sub)
    for q in (t, v):
        cli.add_keep_checkpoints(q)
    for q in (m, t, v):
        cli.add_out(q)
        cli.add_device(q)
        cli.add_quiet(q)
        cli.add_sweep(q)
    return p


def resumed_sampler(args) -> dict:
    """{"sampler": the sampler of the sweep recorded in --out} where --sampler is not given and
    --out holds one (Cells.recorded_sampler), else {} (also for `plan` without --out)."""
    sampler = None if args.sampler or args.out is None else Cells.recorded_sampler(args.out)
    return {"sampler": sampler} if sampler else {}


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.command == "plan":
        return plan(args)
    if args.command in zipf_cli.COMMANDS:
        return zipf_cli.run(args)
    executor = cli.executor(args)
    progress = not args.quiet
    if args.command == "memory":
        sweep = cli.settings(args, MemorySweep)
        cells = Cells(args.out, sweep.recorded(), executor.torch_threads)
        rows = search_memories(sweep, cells, executor, args.device, progress)
        cfg = sweep.memories()[0]
        result = memory_tables(rows, cfg, pd.DataFrame(cells.rows()),
                               {"settings": sweep.recorded(), "seeds": list(sweep.seeds),
                                "device": str(resolve_device(args.device)), "probes_computed": cells.computed})
        write_memory(result, cfg, args.out)
        print(memory_text(result, cfg) + f"\nwrote {args.out}/ ({cells.computed} new probes)")
    elif args.command == "departures":
        study = cli.settings(args, DepartureStudy)
        sweep = study.training(cli.settings(args, TransformerSweep, shapes=(study.shape,), d=(study.d,),
                                            **resumed_sampler(args)), "standard")
        table, summary = compare_departures(study, sweep, args.out, executor, args.device, progress,
                                            args.keep_checkpoints)
        print(study_text(table, summary) + f"\nwrote {args.out}/ ({summary['cells_computed']} new training runs)")
    else:
        sweep = _transformer_sweep(args)
        warning = TrainConfig(steps=sweep.steps, give_up=sweep.give_up).milestones_warning()  # off above d = 64
        if warning:
            print(warning, file=sys.stderr)
        cells = Cells(args.out, sweep.recorded(), executor.torch_threads,
                      keep_checkpoints=args.keep_checkpoints)
        rows = search_transformers(sweep, cells, executor, args.device, progress, compute=not args.recorded_only)
        result = transformer_tables(rows, sweep, pd.DataFrame(cells.rows()), cells.computed)
        write_transformer(result, sweep, args.out)
        print(transformer_text(result) + f"\nwrote {args.out}/ ({cells.computed} new training runs)")
        if args.combine is not None:
            from analyses.capacity.protocol import write_combined

            write_combined(args.combine)
    return 0


def _transformer_sweep(args) -> TransformerSweep:
    if args.seeds and args.seed != 0:
        raise ValueError("--seeds searches the seeds it names; drop --seed.")
    return cli.settings(args, TransformerSweep, **({"shapes": tuple(args.shapes)} if args.shapes else {}),
                        **resumed_sampler(args))


def _recorded_analysis(folder: Path) -> str | None:
    """The kind of sweep recorded in FOLDER/settings.json (its `analysis`), None where unreadable."""
    try:
        recorded = json.loads((folder / "settings.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return recorded.get("analysis") if isinstance(recorded, dict) else None


def plan(args) -> int:
    """The milestone rule's validation, then the sweep's plan under today's rules and the new ones
    (--done: the GPU's science so far and the next call, analyses.capacity.progress)."""
    if args.out is not None:
        claim(args.out, only("plan.csv"))  # the one --out rule: a folder of its own, refused before the plan runs
    if args.done:
        from analyses.capacity.progress import progress_text
        from analyses.capacity.protocol import results_root

        results = args.results or results_root(dry=False)
        print(progress_text(results, lambda piece: _transformer_sweep(parser().parse_args(piece.argv(results, "cpu")))))
        return 0
    sweep = _transformer_sweep(args)
    for folder in args.oracle or ():
        if not (folder / "settings.json").is_file():
            raise ValueError(f"--oracle {folder}: no recorded sweep there (settings.json missing).")
        kind = _recorded_analysis(folder)
        if kind != "capacity transformer":
            held = f"a {kind!r} sweep" if kind else "no sweep it names"
            raise ValueError(f"--oracle {folder}: holds {held} (its settings.json), not a transformer capacity sweep; "
                             "--oracle takes the --out of "
                             "`python -m analyses.capacity transformer`.")
    oracle = Oracle(tuple(args.oracle)) if args.oracle else default_oracle(sweep)
    print(validate().text())
    text, table = plan_text(sweep, oracle, recorded_rate(oracle) if args.oracle else None)
    print(text)
    if args.out:
        write_csv(args.out / "plan.csv", table)
    return 0
