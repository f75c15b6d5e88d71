"""python -m analyses.tradeoff grid|swap|shrink : attention against MLP as the fact store.

grid    Train the H x m grid (paper Figure 4 right: S=R=32, D=8, N=64, T=32, d=32, d_h=8)
        and record, per cell, held-out accuracy AND where locate_facts finds the facts
        (shares labelled attention / mlp / both / distributed / not_stored). Heat maps of
        accuracy and of the attention, MLP and distributed shares, with the 99% frontier
        (the smallest m reaching 99% at each H).
swap    One task and model trained three ways: both free, MLP removed (attention only),
        OV path frozen at its random init; where do the facts go?
shrink  On one trained model (--ckpt, or trained here): prune MLP neurons (smallest
        ||W_in[:, i]|| ||W_out[i, :]|| first) and heads (smallest ||W_V W_O|| first) step by
        step, and re-measure which facts survive and which store they were in before.

Every cell is one JSON file in --out/cells/ (a re-run with the same settings skips it);
CSV next to the figures, summary.json. Cells run in this process (--executor local) or as
Ray tasks (--executor ray: one worker per core, or a cluster with --ray-address). Task,
model and training flags as models.train, starting from the paper-tradeoff preset.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analyses import cli
from analyses.executors import ExecutorSettings, open_executor
from analyses.locate_facts import LocateSettings, locate
from analyses.output import save_figure, subplots, write_csv, write_summary
from analyses.sweep import Cell, Cells, one, run_jobs
from models.bridge import build_bridge, resolve_device
from models.checkpoint import load_checkpoint
from models.cli import add_config_flags, given
from models.config import (
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    override,
    preset,
)
from models.pruning import head_norms, neuron_norms, prune, prune_order
from models.trainer import train
from models.weights import parameter_count
from probe import columns
from probe.storage import LABELS, StorageRule

BASE = "paper-tradeoff"


@dataclass
class Result:
    """One trade-off experiment's results: its CSV tables by file name, and summary.json."""

    tables: dict[str, pd.DataFrame]
    summary: dict


def _write(result: Result, out: Path) -> None:
    for name, table in result.tables.items():
        write_csv(out / name, table)
    write_summary(out / "summary.json", result.summary)


def base_run(args) -> RunConfig:
    """The paper-tradeoff preset with the task, model and training flags given (snapshots
    off); refused (ValueError) if the model or the training cannot run."""
    base = preset(BASE)
    run = RunConfig(task=override(base.task, given(args, TaskConfig)),
                    model=override(base.model, given(args, ModelConfig)),
                    train=override(base.train, {"snapshots_per_octave": 0, **given(args, TrainConfig)}))
    run.train.validate()
    run.model.validate()
    return run


def storage_row(model, task, locating: LocateSettings) -> dict:
    """locate_facts on `model`: accuracy over contexts and the share of facts per label."""
    located = locate(model, task, **asdict(locating), progress=False)
    s = located.summary
    return {"located_accuracy": s.accuracy, **{f"share_{k}": v for k, v in s.label_shares.items()},
            "_facts": located.facts[[columns.SUBJECT, columns.RELATION, columns.ACCURACY, columns.LABEL]]}


def train_and_locate(run: RunConfig, locating: LocateSettings) -> dict:
    """Train `run` (its learning rates batched), keep the best, locate its facts."""
    result = train(run, progress=False)
    t = result.training
    model = build_bridge(result.section, result.weights, resolve_device(run.train.device))
    row = storage_row(model, result.task, locating)
    row.pop("_facts")
    counts = parameter_count(result.section)
    return {"heads": run.model.n_heads, "width": None if run.model.attn_only else run.model.d_mlp,
            "attn_only": run.model.attn_only, "freeze_ov": run.train.freeze_ov,
            "accuracy": t["final_accuracy"], "lr": t["lr"], "steps_run": t["steps_run"],
            "best_accuracy": max(m["accuracy"] for row in result.metrics for m in row["models"]),  # the paper's measure
            "attention_parameters": counts["attention"], "mlp_parameters": counts["mlp"], **row}


def _settings(command: str, run: RunConfig, locating: LocateSettings, extra: dict) -> dict:
    """settings.json of a trade-off sweep: what every cell shares."""
    recorded = {**asdict(run), "model": run.model.recorded()}
    recorded["train"].pop("device")  # where it runs does not change what a cell holds
    if run.train.sampler == "generator":  # the only sampler before the choice existed: those sweeps resume
        recorded["train"].pop("sampler")
    return {"analysis": f"tradeoff {command}", "run": recorded, "contexts": locating.contexts,
            "patch_contexts": locating.patch_contexts, "seed_locate": locating.seed,
            "rule": asdict(StorageRule()), **extra}  # cells labelled under another rule are not reused


# ----------------------------------------------------------------------------- grid
@dataclass(frozen=True)
class Grid:
    """The H x m grid: every number of heads with every MLP width."""

    heads: tuple[int, ...] = field(default=(1, 2, 4, 8, 16, 32), metadata={"help": "H values"})
    widths: tuple[int, ...] = field(default=(1, 8, 16, 32, 64, 128), metadata={"help": "m values"})

    def __post_init__(self):
        cli.at_least(self, heads=1, widths=1)

    def models(self, run: RunConfig) -> dict[tuple[int, int], ModelConfig]:
        """The model of each cell (H, m), each refused if it cannot be built."""
        models = {(h, m): override(run.model, {"n_heads": h, "d_mlp": m}) for h in self.heads for m in self.widths}
        for model in models.values():
            model.validate()
        return models


def grid_rows(run: RunConfig, grid: Grid, locating: LocateSettings, cells: Cells, executor: ExecutorSettings,
              progress: bool = True, compute: bool = True) -> list[dict]:
    """One row per cell (H, m): accuracy and the shares of the storage labels (compute=False:
    the recorded cells only)."""
    jobs = [one(Cell(f"H{h}_m{m}", train_and_locate, (RunConfig(run.task, model, run.train), locating)))
            for (h, m), model in grid.models(run).items()]
    with open_executor(executor if compute else ExecutorSettings()) as running:
        rows = run_jobs(jobs, cells, running, desc="trade-off grid", total=len(jobs), progress=progress,
                        compute=compute)
    return [row for row in rows if row is not None]


def grid_tables(rows: list[dict], grid: Grid, run: RunConfig, computed: int) -> Result:
    """grid.csv, and the 99% frontier (smallest m reaching 99% at each H) and the corners."""
    table = pd.DataFrame(rows)
    score = _accuracy_column(table)
    frontier = {int(h): (int(g.loc[g[score] >= 0.99, "width"].min()) if (g[score] >= 0.99).any() else None)
                for h, g in table.groupby("heads")}
    corners = {name: corner.iloc[0].to_dict()
               for name, h, m in (("attention_heavy", max(grid.heads), min(grid.widths)),
                                  ("mlp_heavy", min(grid.heads), max(grid.widths)))
               if len(corner := table[(table["heads"] == h) & (table["width"] == m)])}  # recorded ones
    summary = {"frontier_min_width_at_99": frontier, "frontier_accuracy": score, "corners": corners,
               "task": repr(run.task.build()), "cells": f"{len(table)} of {len(grid.heads) * len(grid.widths)}",
               "cells_computed": computed}
    return Result({"grid.csv": table}, summary)


def _accuracy_column(table: pd.DataFrame) -> str:
    """The accuracy the frontier is drawn on: the best over the run's evaluations (the paper's
    measure) where the cells record it, else the final one."""
    return "best_accuracy" if "best_accuracy" in table else "accuracy"


def write_grid(result: Result, run: RunConfig, out: Path) -> None:
    _write(result, out)
    _grid_figure(result.tables["grid.csv"], result.summary["frontier_min_width_at_99"], out / "grid.png", run)


def grid_text(result: Result, out: Path) -> str:
    table = result.tables["grid.csv"]
    columns = ["heads", "width", *dict.fromkeys(["accuracy", _accuracy_column(table)]), "share_attention",
               "share_mlp", "share_both", "share_distributed", "share_not_stored"]
    return (table[columns].to_string(index=False, float_format="%.3f")
            + f"\nwrote {out}/ ({result.summary['cells_computed']} new cells)")


PAPER_GRID = {"n_subjects": 32, "n_relations": 32, "answers_per_relation": 8, "d_model": 32, "d_head": 8}
PAPER_FLOOR = 1280  # attention parameters (d d_h H at H = 5) below which the authors' grid fails
PAPER_LINE = 2300  # the authors' frontier: MLP parameters = 2300 - attention parameters / 2


def _grid_figure(table, frontier, path, run: RunConfig | None = None):
    """Heat maps over the grid (accuracy; shares of facts in attention, in the MLP, and
    distributed: recalled only by the two paths together), H and m labelled with the attention
    (d d_h H) and MLP (d m) parameters, the measured 99% frontier, and, on the paper's Figure 4
    right grid, the authors' frontier and floor; the legend below the panels."""

    heads, widths = sorted(table["heads"].unique()), sorted(table["width"].unique())
    score = _accuracy_column(table)
    panels = [(score, f"held-out accuracy ({'best over the run' if score == 'best_accuracy' else 'final'})",
               "viridis"), ("share_attention", "share of facts in attention", "Blues"),
              ("share_mlp", "share of facts in the MLP", "Oranges"),
              ("share_distributed", "share of facts distributed", "Greens")]
    paper = run is not None and all(getattr(run.task, k, None) == v or getattr(run.model, k, None) == v
                                    for k, v in PAPER_GRID.items())
    attention = {h: int(table.loc[table["heads"] == h, "attention_parameters"].iloc[0]) // 4 for h in heads}  # d d_h H
    mlp = {m: int(table.loc[table["width"] == m, "mlp_parameters"].iloc[0]) // 2 for m in widths}  # d m
    fig, axes = subplots(1, len(panels), figsize=(5 * len(panels), 4.4))
    fig.set_layout_engine("constrained")  # room below the panels for the legend
    for ax, (col, title, cmap) in zip(axes, panels):
        grid = table.pivot(index="heads", columns="width", values=col).reindex(index=heads, columns=widths)
        image = ax.imshow(grid.to_numpy(float), origin="lower", cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for i in range(len(heads)):
            for j in range(len(widths)):
                value = grid.iloc[i, j]
                if np.isnan(value):  # a cell not recorded (yet)
                    continue
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if value > 0.6 and col != score else "black")
        xs = [widths.index(frontier[h]) if frontier.get(h) is not None else np.nan for h in heads]
        ax.plot(xs, range(len(heads)), "r.-", lw=1.5, label="measured 99% frontier (smallest m)")
        if paper:  # the authors' annotations, in grid coordinates (piecewise linear between cells)
            floor = np.interp(PAPER_FLOOR, [attention[h] for h in heads], range(len(heads)))
            ax.axhline(floor, color="k", ls=":", lw=1.2, label=f"authors' floor: {PAPER_FLOOR} attention parameters")
            rows = np.linspace(0, len(heads) - 1, 200)
            at = np.interp(rows, range(len(heads)), [attention[h] for h in heads])
            cols = np.interp(PAPER_LINE - at / 2, [mlp[m] for m in widths], range(len(widths)),
                             left=np.nan, right=np.nan)
            ax.plot(cols, rows, "k--", lw=1.2, label="authors' frontier: MLP = 2300 - attention / 2")
        ax.set_xticks(range(len(widths)), [f"{m} ({mlp[m]})" for m in widths], fontsize=6,
                      rotation=90 if len(widths) > 6 else 0)
        ax.set_yticks(range(len(heads)), [f"{h} ({attention[h]})" for h in heads], fontsize=6)
        ax.set(xlabel="MLP width m (MLP parameters d m)", ylabel="heads H (attention parameters d d_h H)", title=title)
        fig.colorbar(image, ax=ax)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    save_figure(fig, path)


# ----------------------------------------------------------------------------- swap
VARIANTS = {"both_free": ({}, {}), "attn_only": ({"attn_only": True}, {}),  # name -> (model, training) changes
            "freeze_ov": ({}, {"freeze_ov": True})}


def swap_rows(run: RunConfig, locating: LocateSettings, cells: Cells, executor: ExecutorSettings,
              progress: bool = True) -> list[dict]:
    """One row per variant: accuracy and the shares of the storage labels."""
    jobs = [one(Cell(name, train_and_locate,
                     (RunConfig(run.task, override(run.model, model), override(run.train, training)), locating)))
            for name, (model, training) in VARIANTS.items()]
    with open_executor(executor) as running:
        found = run_jobs(jobs, cells, running, desc="swap experiments", total=len(jobs), progress=progress)
    return [{"variant": name, **row} for name, row in zip(VARIANTS, found)]


def swap_tables(rows: list[dict], run: RunConfig, computed: int) -> Result:
    table = pd.DataFrame(rows)
    return Result({"swap.csv": table}, {"variants": table.set_index("variant").to_dict("index"),
                                        "task": repr(run.task.build()), "cells_computed": computed})


def write_swap(result: Result, out: Path) -> None:
    _write(result, out)
    _stacked_shares(result.tables["swap.csv"], out / "swap.png")


def swap_text(result: Result, out: Path) -> str:
    table = result.tables["swap.csv"]
    return (table[["variant", "accuracy"] + [f"share_{k}" for k in LABELS]].to_string(index=False, float_format="%.3f")
            + f"\nwrote {out}/")


def _stacked_shares(table, path):

    from analyses.plots import COLORS

    fig, ax = subplots(figsize=(5, 3.5))
    bottom = np.zeros(len(table))
    for label in LABELS:
        values = table[f"share_{label}"].to_numpy(float)
        ax.bar(table["variant"], values, bottom=bottom, color=COLORS[label], label=label)
        bottom += values
    ax.set(ylabel="share of facts", title="Where the facts go")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    save_figure(fig, path)


# ---------------------------------------------------------------------------- shrink
@dataclass(frozen=True)
class Shrink:
    """The model pruned (a checkpoint, or the flags' model trained into OUT/model) and how finely."""

    ckpt: str | None = field(default=None, metadata={
        "help": "checkpoint to prune (default: train the flags' model into OUT/model)"})
    mlp_steps: int = field(default=8, metadata={"help": "pruning steps from 0 to all MLP neurons"})

    def __post_init__(self):
        cli.at_least(self, mlp_steps=1)


def trained_model(ckpt: str | None, out: Path, run: RunConfig, progress: bool = True):
    """(model section, weights, task): `ckpt`, or the run trained once and kept in out/model."""
    path = Path(ckpt) if ckpt else out / "model"
    if not ckpt and not (path / "config.json").is_file():
        train(run, progress=progress).save(path)
    checkpoint = load_checkpoint(path, kind="factual_recall")
    if checkpoint.section.attn_only:
        raise ValueError(f"{path}: an attention-only model has no MLP neurons to prune.")
    return checkpoint.section, checkpoint.weights, checkpoint.task


def pruning_steps(n: int, steps: int) -> list[int]:
    """0 .. n units removed in at most `steps` + 1 even steps."""
    return sorted({round(i * n / steps) for i in range(steps + 1)})


def pruned_storage_row(section, weights, task, component: str, order: list, k: int, locating: LocateSettings,
                       device: str) -> dict:
    """locate_facts on the model with the first k units of `order` (MLP neurons or heads) removed
    (device resolved where it runs)."""
    removed = order[:k]
    pruned = prune(weights, neurons=removed if component == "mlp" else (),
                   heads=removed if component == "heads" else ())
    row = storage_row(build_bridge(section, pruned, resolve_device(device)), task, locating)
    facts = row.pop("_facts")
    return {"component": component, "removed": k, "removed_units": removed, "fraction": k / len(order), **row,
            "fact_accuracy": facts[columns.ACCURACY].round(4).tolist(), "fact_label": facts[columns.LABEL].tolist()}


def shrink_rows(trained: tuple, shrink: Shrink, run: RunConfig, locating: LocateSettings, cells: Cells,
                executor: ExecutorSettings, progress: bool = True) -> list[dict]:
    """One row per pruning step of the `trained` model (section, weights, task): every fact's
    accuracy and label with the first k MLP neurons (or heads) of the pruning order removed."""
    section, weights, task = trained
    orders = {"mlp": prune_order(neuron_norms(weights)), "heads": prune_order(head_norms(weights))}
    plan = [("mlp", k) for k in pruning_steps(section.d_mlp, shrink.mlp_steps)] + \
           [("heads", k) for k in pruning_steps(section.n_heads, section.n_heads)[1:]]
    jobs = [one(Cell(f"{c}_{k}", pruned_storage_row,
                     (section, weights, task, c, orders[c], k, locating, run.train.device))) for c, k in plan]
    with open_executor(executor) as running:
        return run_jobs(jobs, cells, running, desc="pruning steps", total=len(jobs), progress=progress)


def shrink_tables(rows: list[dict], task, computed: int) -> Result:
    """shrink_facts.csv (every fact at every step, with the store it was in before) and
    shrink.csv (the share of each store's facts still recalled at every step)."""
    before = next(r for r in rows if r["removed"] == 0)
    facts = task.all_facts()
    table = []
    for r in rows:
        for i, (acc, label) in enumerate(zip(r["fact_accuracy"], r["fact_label"])):
            table.append({"component": r["component"], "removed": r["removed"], "fraction": r["fraction"],
                          "subject": int(facts[0][i]), "relation": int(facts[1][i]),
                          "store_before": before["fact_label"][i], "accuracy": acc, "survives": acc >= 0.5,
                          "label": label})
    table = pd.DataFrame(table)
    curves = (table.groupby(["component", "removed", "fraction", "store_before"])["survives"].mean()
              .rename("surviving_share").reset_index())
    summary = {"store_before": {k: int(v) for k, v in pd.Series(before["fact_label"]).value_counts().items()},
               "steps": [{k: r[k] for k in ("component", "removed", "fraction", "located_accuracy",
                                             *[f"share_{lab}" for lab in LABELS])} for r in rows],
               "cells_computed": computed}
    return Result({"shrink_facts.csv": table, "shrink.csv": curves}, summary)


def write_shrink(result: Result, out: Path) -> None:
    _write(result, out)
    _shrink_figure(result.tables["shrink.csv"], out / "shrink.png")


def shrink_text(result: Result, out: Path) -> str:
    curves = result.tables["shrink.csv"]
    return (curves.pivot_table(index=["component", "removed"], columns="store_before", values="surviving_share")
            .to_string(float_format="%.2f") + f"\nwrote {out}/")


def _shrink_figure(curves, path):

    from analyses.plots import COLORS

    fig, axes = subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, (component, title) in zip(axes, (("mlp", "pruning MLP neurons (smallest norm first)"),
                                             ("heads", "pruning heads (smallest OV norm first)"))):
        part = curves[(curves["component"] == component) | ((curves["component"] == "mlp") & (curves["removed"] == 0))]
        for label, g in part.groupby("store_before"):
            g = g.sort_values("fraction")
            ax.plot(g["fraction"], g["surviving_share"], "o-", color=COLORS[label], label=f"stored in {label}")
        ax.set(xlabel="fraction removed", title=title, ylim=(-0.02, 1.02))
    axes[0].set_ylabel("share of facts still recalled")
    axes[1].legend(fontsize=7)
    save_figure(fig, path)


# ----------------------------------------------------------------------------- CLI
def parser():
    p = cli.parser("python -m analyses.tradeoff", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    grid = sub.add_parser("grid", help="H x m grid: accuracy and storage shares (Figure 4 right)")
    cli.add_settings(grid, Grid, "the grid")
    cli.add_recorded_only(grid)
    swap = sub.add_parser("swap", help="the same model with both free, MLP removed, OV frozen")
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
        add_config_flags(q, ModelConfig, f"model ({BASE} preset)", base=base.model)
        add_config_flags(q, TrainConfig, f"training ({BASE} preset; snapshots off)", exclude=("device",),
                         base=base.train)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    locating = cli.settings(args, LocateSettings, seed=args.seed_locate)
    run = base_run(args)  # --device is the training's
    executor = cli.executor(args)
    progress, out = not args.quiet, args.out
    if args.command == "grid":
        grid = cli.settings(args, Grid)
        grid.models(run)  # every cell's model is refused before anything runs
        cells = Cells(out, _settings("grid", run, locating, {"heads": list(grid.heads), "widths": list(grid.widths)}),
                      executor.torch_threads)
        rows = grid_rows(run, grid, locating, cells, executor, progress, compute=not args.recorded_only)
        result = grid_tables(rows, grid, run, cells.computed)
        write_grid(result, run, out)
        print(grid_text(result, out))
    elif args.command == "swap":
        cells = Cells(out, _settings("swap", run, locating, {"variants": list(VARIANTS)}), executor.torch_threads)
        result = swap_tables(swap_rows(run, locating, cells, executor, progress), run, cells.computed)
        write_swap(result, out)
        print(swap_text(result, out))
    else:
        shrink = cli.settings(args, Shrink)
        trained = trained_model(shrink.ckpt, out, run, progress)  # a bad --ckpt is refused before anything is written
        extra = {"ckpt": shrink.ckpt or None, "mlp_steps": shrink.mlp_steps}
        cells = Cells(out, _settings("shrink", run, locating, extra), executor.torch_threads)
        result = shrink_tables(shrink_rows(trained, shrink, run, locating, cells, executor, progress), trained[2],
                               cells.computed)
        write_shrink(result, out)
        print(shrink_text(result, out))
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
