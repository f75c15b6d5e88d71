"""The command line of `python -m analyses.aot_capacity`: parser and main."""
from __future__ import annotations

import time
from dataclasses import asdict

from analyses import aot_capacity
from analyses.aot_capacity.report import report, write
from analyses.aot_capacity.sweep import AotSweep, train_sweeps
from analyses.aot_capacity.tables import add_head_roles, tables
from analyses.sweeps import cli
from analyses.sweeps.cells import Cells
from models.aot.config import AoTTrainConfig
from models.cli import add_config_flags, given


def parser():
    p = cli.parser("python -m analyses.aot_capacity", aot_capacity.__doc__)
    cli.add_out(p, "results/aot_capacity")
    cli.add_device(p)
    cli.add_quiet(p)
    cli.add_sweep(p)
    cli.add_settings(p, AotSweep, "the task and the sweeps")
    add_config_flags(p, AoTTrainConfig, "training", exclude=("device",), default_label="default")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    start = time.perf_counter()
    sweep = cli.settings(args, AotSweep)
    cfg = AoTTrainConfig(**given(args, AoTTrainConfig))
    cfg.validate()
    executor = cli.executor(args)
    out = cli.out_dir(args, "results/aot_capacity")
    cells = Cells(out, sweep.recorded(cfg), executor.torch_threads)  # another sweep's --out is refused
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.quiet

    result = tables(train_sweeps(sweep, cfg, out, cells, executor, progress), sweep)
    if not sweep.skip_instruments and (result.runs.sweep == "heads").any():
        add_head_roles(result, out, sweep.task(), args.device, progress)
    recorded = {"out": str(out), **asdict(sweep), "head_layout": sweep.layouts,
                **{k: v for k, v in asdict(cfg).items() if k not in ("device", "cuda_graph")},
                "device": args.device, "quiet": args.quiet,
                **asdict(executor)}
    result.summary["settings"] = {k: list(v) if isinstance(v, tuple) else v for k, v in recorded.items()}
    result.summary["train"] = {**asdict(cfg), "steps": cfg.steps}
    result.summary["cells_computed"] = cells.computed
    result.summary["seconds"] = round(time.perf_counter() - start, 1)
    write(result, sweep, out)
    print(report(result.summary, result.capacity, out))
    return 0
