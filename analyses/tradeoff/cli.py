"""The command line of `python -m analyses.tradeoff grid|swap|shrink|compare`."""
from __future__ import annotations

from pathlib import Path

from analyses import tradeoff
from analyses.locate_facts import LocateSettings
from analyses.sweeps import cli
from analyses.sweeps.cells import Cells, claim_sweep
from analyses.tradeoff.common import BASE, base_run, sweep_settings
from analyses.tradeoff.compare import compare_grids, compare_text, read_grid, write_compare
from analyses.tradeoff.grid import Grid, grid_rows, grid_tables, grid_text, write_grid
from analyses.tradeoff.shrink import Shrink, shrink_rows, shrink_tables, shrink_text, trained_model, write_shrink
from analyses.tradeoff.swap import VARIANTS, swap_rows, swap_tables, swap_text, write_swap
from models.checkpoint import weights_sha256
from models.cli import add_config_flags, given
from models.out_folder import claim
from models.recall.config import ModelConfig, TaskConfig, TrainConfig
from models.recall.presets import preset


def parser():
    p = cli.parser("python -m analyses.tradeoff", tradeoff.__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    grid = sub.add_parser("grid", help="H x m grid: accuracy and storage shares (Figure 4 right)")
    cli.add_settings(grid, Grid, "the grid")
    cli.add_recorded_only(grid)
    swap = sub.add_parser("swap", help="the same model with both free, MLP removed, OV frozen")
    for q in (grid, swap):
        cli.add_keep_checkpoints(q)
    shrink = sub.add_parser("shrink", help="prune MLP neurons and heads of a trained model step by step")
    cli.add_settings(shrink, Shrink, "the pruning")
    for q in (grid, swap, shrink):
        cli.add_out(q)
        cli.add_device(q)
        cli.add_quiet(q)
        cli.add_sweep(q)
        cli.add_settings(q, LocateSettings, "locate_facts in every cell", exclude=("seed",))
        q.add_argument("--seed-locate", type=cli.seed, default=0, help="seed of locate_facts' prompts (default 0)")
        base = preset(BASE)
        add_config_flags(q, TaskConfig, f"task ({BASE} preset)", base=base.task)
        add_config_flags(q, ModelConfig, f"model ({BASE} preset)", base=base.model, exclude=("n_layers",))
        add_config_flags(q, TrainConfig, f"training ({BASE} preset; snapshots off)", exclude=("device",),
                         base=base.train)
    compare = sub.add_parser("compare", help="two recorded grids side by side: frontiers, floors, storage shares")
    compare.add_argument("grids", nargs=2, type=Path, metavar="GRID", help="output directories of two grids")
    compare.add_argument("--labels", type=cli.comma_list(str), default=None,
                         help="A,B: the two grids' names in tables and figure (default: their directory names)")
    compare.add_argument("--out", type=cli.directory, required=True,
                         help="output directory (compare.csv, frontier.csv, summary.json, compare.png)")
    return p


COMPARE_FILES = ("compare.csv", "frontier.csv", "summary.json", "compare.png")


def compare_folder(out: Path) -> None:
    """What compare's --out may hold (models.out_folder.claim): its own files, its summary.json naming two grids."""
    other = sorted(p.name for p in out.iterdir() if p.name not in COMPARE_FILES and not p.name.startswith("."))
    summary = out / "summary.json"
    if summary.is_file() and '"cells_compared"' not in summary.read_text(errors="replace"):
        other.append("summary.json")
    if other:
        raise ValueError(f"--out {out} holds files that are not a comparison's ({', '.join(other)}), which compare "
                         "does not write over; choose another --out.")


def compare_main(args) -> int:
    claim(args.out, compare_folder)
    labels = args.labels or [p.name if p.name != args.grids[1 - i].name else str(p) for i, p in enumerate(args.grids)]
    if len(labels) != 2 or labels[0] == labels[1]:
        raise ValueError(f"--labels needs two different names, got {','.join(labels)!r}.")
    a, b = (read_grid(path, label) for path, label in zip(args.grids, labels))
    result = compare_grids(a, b)
    write_compare(result, a, args.out)
    print(compare_text(result, args.out))
    return 0


# Flags a subcommand takes from the shared task/model/training set but does not use, and why.
UNUSED = {"grid": {"n_heads": "the grid sets H from --heads", "d_mlp": "the grid sets m from --widths"},
          "swap": {"attn_only": "the swap trains the model with and without its MLP",
                   "freeze_ov": "the swap trains the model with and without its OV path frozen"}}


def refuse_unused(args) -> None:
    """Refuse (ValueError, one line) a flag the subcommand would ignore."""
    unused = dict(UNUSED.get(args.command, {}))
    if args.command == "grid" and args.attn_only:
        unused["widths"] = "an attention-only grid has no MLP (its cells are m = 0)"
    if args.command == "shrink" and args.ckpt:
        unused.update({name: "--ckpt fixes the model pruned" for config in (TaskConfig, ModelConfig, TrainConfig)
                       for name in given(args, config) if name != "device"})  # --device runs the cells
    for name, why in unused.items():
        if getattr(args, name, None) not in (None, False):
            raise ValueError(f"{cli.flag(name)} is not used by `{args.command}`: {why}.")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.command == "compare":
        return compare_main(args)
    claim_sweep(args.out)  # before shrink trains its model into it
    refuse_unused(args)
    locating = cli.settings(args, LocateSettings, seed=args.seed_locate)
    run = base_run(args)  # --device is the training's
    executor = cli.executor(args)
    progress, out = not args.quiet, args.out
    if args.command == "grid":
        grid = cli.settings(args, Grid).grown(Cells.recorded_settings(out), set(cli.given(args, Grid)))
        grid.models(run)  # every cell's model is refused before anything runs
        per_cell = ("n_heads", "d_mlp")  # set by --heads and --widths, recorded as those
        earlier = sweep_settings("grid", run, locating, grid.recorded(run))  # grids that recorded the preset's H, m
        settings = sweep_settings("grid", run, locating, grid.recorded(run), per_cell)
        if grid.seeds:
            if args.seed is not None:
                raise ValueError("--seeds trains every cell with the seeds it names; drop --seed.")
            settings["run"]["train"].pop("seed")  # in each cell's key
        cells = Cells(out, settings, executor.torch_threads, earlier=(earlier,),
                      keep_checkpoints=args.keep_checkpoints, growing=("heads", "widths"))  # the grid may grow
        rows = grid_rows(run, grid, locating, cells, executor, progress, compute=not args.recorded_only)
        result = grid_tables(rows, grid, run, cells.computed)
        write_grid(result, run, out)
        print(grid_text(result, out))
    elif args.command == "swap":
        cells = Cells(out, sweep_settings("swap", run, locating, {"variants": list(VARIANTS)}), executor.torch_threads,
                      keep_checkpoints=args.keep_checkpoints)
        result = swap_tables(swap_rows(run, locating, cells, executor, progress), run, cells.computed)
        write_swap(result, out)
        print(swap_text(result, out))
    else:
        shrink = cli.settings(args, Shrink)
        trained = trained_model(shrink.ckpt, out, run, progress)  # a bad --ckpt is refused before anything is written
        extra = {"ckpt": shrink.ckpt or None, "mlp_steps": shrink.mlp_steps,  # and the weights' content hash:
                 **({"ckpt_weights_sha256": weights_sha256(shrink.ckpt)} if shrink.ckpt else {})}  # no stale cells
        cells = Cells(out, sweep_settings("shrink", run, locating, extra), executor.torch_threads)
        result = shrink_tables(shrink_rows(trained, shrink, run, locating, cells, executor, progress), trained[2],
                               cells.computed)
        write_shrink(result, out)
        print(shrink_text(result, out))
    return 0
