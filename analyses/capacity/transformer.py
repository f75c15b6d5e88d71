"""Transformers: the sweep's settings, its cells (the authors' search for S* = R* per shape
and size), the tables of facts against parameters, and the report."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.capacity.common import PAPER_FACTS_WINDOW, TARGET, Capacity
from analyses.capacity.figures import facts_figure
from analyses.capacity.stopping import MILESTONES_MAX_D
from analyses.least_squares import LINE, Fit, fit_log_log
from analyses.sweeps import cli
from analyses.sweeps.cells import Cell, Cells, run_jobs
from analyses.sweeps.executors import ExecutorSettings, open_executor
from analyses.sweeps.output import write_csv, write_summary
from analyses.sweeps.search import bisection, search, stacked_search
from models.bridge import resolve_device
from models.cli import setting
from models.recall import parameterisation as param
from models.recall.config import (
    GIVE_UP,
    MILESTONES,
    SAMPLERS,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    shape_model,
)
from models.recall.shape_trainer import train_stacks
from models.recall.trainer import best_so_far, train
from models.recall.weights import parameter_count
from models.training.graphed import CUDA_GRAPH_HELP, CUDA_GRAPH_MODES


@dataclass(frozen=True)
class TransformerSweep:
    """The shapes and sizes whose largest learnable S = R is searched, and their training."""

    shapes: tuple[tuple[float, ...], ...] = setting(((1.0, 1.0, 2.0),),
                                                    "(alpha, beta, H) of each shape, or (alpha, beta, H, largest d)")
    d: tuple[int, ...] = setting((8, 16), "embedding dimensions, searched in increasing order")
    answers: int = setting(8, "D, answers per relation")
    seq_len: int = setting(32, "T")
    lr: tuple[float, ...] = setting((1e-3, 3e-3, 1e-2), "learning rates, one batched run")
    seed: int = setting(0, "seed of initialisation and data")
    seeds: tuple[int, ...] = setting((), "seeds searched together, in place of --seed: a size is stored when more "
                                         "than half of them store it (a tie is not), and each round's sizes and "
                                         "seeds train as one stack (docs/capacity.md)")
    steps: int = setting(16384, "maximum steps per run (2^14)")
    batch_size: int = setting(1024, "fresh prompts per step")
    eval_every: int = setting(128, "steps between held-out evaluations")
    eval_size: int = setting(4096, "held-out prompts per evaluation (the paper: 1024)")
    min_size: int = setting(8, "S = R where the smallest d's search starts (the paper: 8)")
    max_size: int = setting(512, "largest S = R tried (the paper: 512)")
    parameterisation: str = setting("authors", "the model: " + param.HELP + " (docs/training.md)")
    embedding: str = setting("auto", "frozen embeddings: auto (the parameterisation's: gaussian where it takes the "
                             "authors' embedding, sphere otherwise) | sphere | gaussian",
                             choices=("auto", "sphere", "gaussian"))
    sampler: str = setting("counter", "training data: counter (every seed's batch a hash of seed and step: the "
                           "sampler a CUDA graph can replay) | generator (a sweep recorded without a sampler resumes "
                           "with it)", choices=SAMPLERS)
    cuda_graph: str = setting("auto", CUDA_GRAPH_HELP, choices=CUDA_GRAPH_MODES)
    stack: str = setting("auto", "with --seeds: on (each round's sizes and seeds train as few stacks as "
                         "models.recall.shape_trainer.train_stacks allows) | off (each run alone) | auto (on where the "
                         "training runs on CUDA: on a CPU a stack is no faster)", choices=("auto", "on", "off"))
    give_up: str = setting("never", "never | milestones: a run that cannot reach accuracy 0.99 stops early by the "
                           f"milestone rule (models.recall.config.MILESTONES), at d <= {MILESTONES_MAX_D} only, where "
                           "recorded curves validate it (docs/capacity.md)", choices=GIVE_UP)
    probes: int = setting(1, "sizes each search trains at once (1: the authors' bisection; P > 1 cuts the "
                             "bracket in P + 1 parts, for more workers than shapes; keep it when resuming)")
    fill_rounds: bool = setting(False, "with --probes P > 1: a round that would train fewer than P sizes (the growth "
                                "reaching --max-size, the halvings reaching 2) is topped up with sizes spread over "
                                "the range it leaves open, so that a stack is never one size alone")
    bits_per_parameter: float = setting(2.0, "bits per parameter of the information-bound line in the figure")
    facts_per_parameter: float = setting(0.15, "facts per parameter of the paper's reference line in the figure")

    def __post_init__(self):
        cli.at_least(self, d=1, answers=2, seq_len=3, steps=1, batch_size=1, eval_every=1, eval_size=1, min_size=2,
                     probes=1)
        cli.at_least(self, max_size=self.min_size)
        cli.require(self, "lr", all(lr > 0 for lr in self.lr), "> 0")
        ModelConfig(parameterisation=self.parameterisation).validate()
        named = [",".join(f"{v:g}" for v in shape[:3]) for shape in self.shapes]
        twice = [name for i, name in enumerate(named) if name in named[:i]]
        if twice:
            raise ValueError(f"--shape {twice[0]} given twice: list each shape (ALPHA,BETA,H) once.")
        for shape in self.shapes:
            if min(self.d) > _largest_d(shape):
                raise ValueError(f"shape {','.join(f'{v:g}' for v in shape)}: its largest d is below every --d.")
            if not self.sizes(shape):  # the reason, from the largest d
                shape_model(shape[0], shape[1], shape[2], max(d for d in self.d if d <= _largest_d(shape)))

    def sizes(self, shape: tuple) -> list[int]:
        """The d (up to the shape's largest) at which the shape has d_h >= 1 and m >= 1
        (rounded down), increasing."""
        def fits(d):
            try:
                return bool(shape_model(shape[0], shape[1], shape[2], d))
            except ValueError:
                return False
        return sorted(d for d in set(self.d) if d <= _largest_d(shape) and fits(d))

    def run(self, shape: tuple, d: int, S: int, device: str, seed: int | None = None) -> RunConfig:
        """The paper's task at S = R (N = S + R noise tokens) and the shape's model at size d;
        the learning rates as one batched run, of `seed` (default: the sweep's --seed)."""
        task = TaskConfig(n_subjects=S, n_relations=S, answers_per_relation=self.answers, n_noise=2 * S,
                          seq_len=self.seq_len)
        return RunConfig(task=task, model=self.model(shape, d),
                         train=TrainConfig(lr=tuple(self.lr), seed=(self.seed if seed is None else seed,),
                                           steps=self.steps,
                                           batch_size=self.batch_size, eval_every=self.eval_every,
                                           eval_size=self.eval_size, target_accuracy=TARGET, snapshots_per_octave=0,
                                           give_up=self.give_up if d <= MILESTONES_MAX_D else "never",
                                           device=device, sampler=self.sampler, cuda_graph=self.cuda_graph))

    def model(self, shape: tuple, d: int) -> ModelConfig:
        """The shape's model at size d, in this sweep's parameterisation and embeddings."""
        model = shape_model(shape[0], shape[1], shape[2], d, self.parameterisation)
        return replace(model, embedding=self.embedding).resolved()

    def recorded(self) -> dict:
        """What every training run shares (settings.json); shapes and sizes are in the cell keys,
        and the search bounds choose cells without changing any. The model is recorded only
        where it is not the standard one with sphere embeddings, and the sampler only where it
        is not the generator, which every sweep recorded before the choice existed trained:
        those sweeps resume; the milestone rule likewise only where it is on. Whether the step
        was a CUDA graph's replay changes no number. A search over seeds keeps each seed in its
        cells' keys (it can take more seeds later)."""
        model = ModelConfig(parameterisation=self.parameterisation, embedding=self.embedding)
        chosen = {k: v for k, v in model.recorded().items() if k in ("parameterisation", "embedding")}
        seed = {"search": "majority of seeds"} if self.seeds else {"seed": self.seed}
        return {"analysis": "capacity transformer", "answers": self.answers, "seq_len": self.seq_len,
                "lr": list(self.lr), **seed, "steps": self.steps, "batch_size": self.batch_size,
                "eval_every": self.eval_every, "eval_size": self.eval_size,
                **({"model": chosen} if chosen != {"embedding": "sphere"} else {}),
                **({"sampler": self.sampler} if self.sampler != "generator" else {}),
                **({"give_up": {"rule": self.give_up, "milestones": [list(m) for m in MILESTONES],
                                "up_to_d": MILESTONES_MAX_D}} if self.give_up != "never" else {})}


LOWEST = 2  # the smallest S = R a search tries


def _largest_d(shape: tuple) -> float:
    return shape[3] if len(shape) > 3 else math.inf


def shape_capacity(shape: tuple, sweep: TransformerSweep, device: str, found: dict, cells: Cells):
    """The largest S = R learned to >= 99% by the shape at each of its sizes, as the authors
    search it: d in increasing order, each search starting from the previous d's S* (a larger
    model stores at least as much), growing x1.5 until a size fails, then bisecting to 10%,
    never above max_size. With several seeds a size passes when most of them store it
    (`stored_by_most`), and each round's sizes and seeds are one stack cell. found[d] = S* as
    each size ends, so a sweep cut short keeps the sizes it finished (a job of analyses.sweeps.cells)."""
    start = sweep.min_size
    for d in sweep.sizes(shape):
        sizes = bisection(start, lowest=LOWEST, highest=sweep.max_size, grow=1.5, rel_tol=0.1, probes=sweep.probes,
                           fill=sweep.fill_rounds)
        if sweep.seeds:
            S = yield from stacked_search(sizes, lambda tried, d=d: round_cell(shape, d, tried, sweep, device, cells),
                                          len(sweep.seeds), stored_by_most)
        else:
            S = yield from search(sizes, lambda S, d=d: probe_cell(shape, d, S, sweep, device, cells),
                                  lambda row: row["accuracy"] >= TARGET)
        found[d] = S
        start = min(max(S, sweep.min_size), sweep.max_size)
    return found


def stored_by_most(rows: tuple[dict, ...]) -> bool:
    """The majority rule: a size is stored when more than half of its seeds reach 99% (a tie
    is not stored)."""
    return 2 * sum(row["accuracy"] >= TARGET for row in rows) > len(rows)


def probe_key(shape, d, S, seed: int | None = None) -> str:
    """A probe's cell key; a search over seeds adds the seed."""
    return f"shape{shape[0]:g},{shape[1]:g},{shape[2]:g}_d{d}_S{S}" + ("" if seed is None else f"_seed{seed}")


def probe_cell(shape, d, S, sweep: TransformerSweep, device: str, cells: Cells) -> Cell:
    """The cell training the shape at size d on S = R (its model kept where `cells` keeps checkpoints)."""
    key = probe_key(shape, d, S)
    return Cell(key, transformer_row, (shape, d, S, sweep, device, cells.checkpoint(key)))


def round_cell(shape, d, sizes: tuple[int, ...], sweep: TransformerSweep, device: str, cells: Cells) -> Cell:
    """One round of a search over seeds: every size of `sizes` with every seed, trained as one
    stack; each (size, seed) is recorded as its own cell, the seeds of a size together."""
    parts = tuple(probe_key(shape, d, S, seed) for S in sizes for seed in sweep.seeds)
    key = f"{probe_key(shape, d, '+'.join(map(str, sizes)))}_seeds{','.join(map(str, sweep.seeds))}"
    return Cell(key, round_rows, (shape, d, sizes, sweep, device, {k: cells.checkpoint(k) for k in parts},
                                  cells.state(key)), parts)


def round_rows(shape, d, sizes: tuple[int, ...], sweep: TransformerSweep, device: str, keep: dict,
               state: Path | None = None) -> dict:
    """Every (size, seed) of a round, each its own run with its own early stop; stacked
    (--stack), as few stacks as models.recall.shape_trainer.train_stacks allows (with the counter
    sampler the sizes share a stack; the generator sampler stacks the seeds of one size),
    resumable from `state` (a round cut in the middle goes on from its last saved state),
    else one after another. {cell key: its probe row}."""
    pairs = [(S, seed) for S in sizes for seed in sweep.seeds]
    runs = [sweep.run(shape, d, S, device, seed) for S, seed in pairs]
    stacked = sweep.stack == "on" or (sweep.stack == "auto" and resolve_device(device).type == "cuda")
    results = (train_stacks(runs, progress=False, state_folder=state) if stacked else
               [train(run, progress=False) for run in runs])
    rows = {}
    for (S, seed), run, result in zip(pairs, runs, results):
        key = probe_key(shape, d, S, seed)
        if keep.get(key) is not None:
            result.save(keep[key])
        rows[key] = {**probe_row(shape, d, S, run, result), "seed": seed}
    return rows


def transformer_row(shape, d, S, sweep: TransformerSweep, device: str, keep: Path | None = None) -> dict:
    """One probe: the shape at size d trained on S = R (device resolved where it runs). With
    `keep`, the trained model is saved there as a checkpoint."""
    run = sweep.run(shape, d, S, device)
    result = train(run, progress=False)
    if keep is not None:
        result.save(keep)
    return probe_row(shape, d, S, run, result)


def probe_row(shape, d, S, run: RunConfig, result) -> dict:
    """A probe's row. `accuracy`: the kept model's last evaluation (>= 99% exactly when some
    learning rate's best evaluation is, since training stops there); `runs`: per learning
    rate, the best held-out accuracy over the run and the evaluation curve, so a failing size
    shows whether it was still rising."""
    t = result.training
    steps = [row["step"] for row in result.metrics]
    def curve(k: int) -> list:  # None where the model was dropped as diverged
        return [None if (a := row["models"][k]["accuracy"]) is None else round(a, 5) for row in result.metrics]
    runs = [{"lr": lr, "best_accuracy": best_so_far(result.metrics, k),
             "final_accuracy": result.metrics[-1]["models"][k]["accuracy"],
             "curve": {"step": steps, "accuracy": curve(k)}} for k, (lr, _) in enumerate(run.train.runs)]
    return {"alpha": shape[0], "beta": shape[1], "heads": shape[2], "d": d, "S": S, "facts": S * S,
            "accuracy": t["final_accuracy"], "best_accuracy": max(r["best_accuracy"] for r in runs),
            "lr": t["lr"], "steps_run": t["steps_run"], "seconds": t["seconds"],
            "parameters": parameter_count(result.section)["total"], "runs": runs}


def search_transformers(sweep: TransformerSweep, cells: Cells, executor: ExecutorSettings, device: str,
                        progress: bool = True, compute: bool = True) -> list[dict]:
    """S* = R* of every shape and size, one row each (the runs are recorded in `cells`).
    compute=False: from the recorded runs only, the sizes whose search they complete."""
    found = {shape: {} for shape in sweep.shapes}
    with open_executor(executor) as running:
        run_jobs([shape_capacity(shape, sweep, device, found[shape], cells) for shape in sweep.shapes], cells, running,
                 desc="transformer probes", progress=progress, compute=compute)
    rows = []
    for shape in sweep.shapes:
        for d, S in found[shape].items():
            S = S if S >= LOWEST else 0  # below the smallest size searched: nothing stored
            run = sweep.run(shape, d, max(S, LOWEST), device)
            params = parameter_count(run.model.checkpoint_section(run.task.build()))["total"]
            rows.append({"shape": ",".join(f"{v:g}" for v in shape[:3]), "d": d, "S_star": S, "facts": S * S,
                         "parameters": params, "facts_per_parameter": S * S / params,
                         **(seed_votes(shape, d, S, sweep, cells) if sweep.seeds else {})})
    return rows


def seed_votes(shape, d, S, sweep: TransformerSweep, cells: Cells) -> dict:
    """How many of the seeds store S* (0 where no size was stored)."""
    recorded = [cells.recorded(probe_key(shape, d, S, seed)) for seed in sweep.seeds]
    return {"seeds": len(sweep.seeds),
            "stored_by": sum(row is not None and row["accuracy"] >= TARGET for row in recorded)}


def paper_window(table: pd.DataFrame) -> pd.DataFrame:
    """The rows the authors' notebook plots: per shape, in increasing d, from the first size
    storing more than 64 facts up to (not including) the first storing more than 11,000."""
    lo, hi = PAPER_FACTS_WINDOW
    shown = []
    for _, g in table.sort_values("d", kind="stable").groupby("shape", sort=False):
        above = np.flatnonzero(g["facts"].to_numpy() > lo)
        over = np.flatnonzero(g["facts"].to_numpy() > hi)
        if len(above):
            shown.append(g.iloc[above[0]:over[0] if len(over) else len(g)])
    return pd.concat(shown) if shown else table.iloc[:0]


def transformer_tables(rows: list[dict], sweep: TransformerSweep, probes: pd.DataFrame, computed: int) -> Capacity:
    """Facts stored against parameters: the fitted slope, overall and per shape, and facts per
    parameter against the paper's line (over the points inside the paper's window of facts)."""
    table = pd.DataFrame(rows, columns=["shape", "d", "S_star", "facts", "parameters", "facts_per_parameter",
                                        *(("seeds", "stored_by") if sweep.seeds else ())])
    ok = table[table["facts"] > 0]
    shown = paper_window(ok)

    def slope(g) -> dict:  # the log-log fit; its slope None where undetermined (two sizes or fewer)
        fit = fit_log_log(g["parameters"], g["facts"])
        return {"fitted_slope": fit.get("slope"), "fit": fit.to_json()}

    def per_parameter(g):
        ratio = float(np.exp(np.log(g["facts_per_parameter"]).mean())) if len(g) else None  # geometric mean
        return {"facts_per_parameter_measured": ratio,
                "over_paper_line": ratio / sweep.facts_per_parameter if ratio is not None else None}

    per_shape = {shape: {**slope(g), **per_parameter(shown[shown["shape"] == shape]),
                         "rows": g.drop(columns="shape").to_dict("records")}
                 for shape, g in ok.groupby("shape", sort=False)}
    summary = {**slope(ok), "shapes": per_shape,
               "paper_line": {"facts_per_parameter": sweep.facts_per_parameter,
                              "facts_window": list(PAPER_FACTS_WINDOW), **per_parameter(shown)},
               "bits_per_parameter": sweep.bits_per_parameter, "bits_per_fact": math.log2(sweep.answers),
               "settings": sweep.recorded(),
               "search": {"min_size": sweep.min_size, "max_size": sweep.max_size, "grow": 1.5, "rel_tol": 0.1,
                          "probes": sweep.probes, "fill_rounds": sweep.fill_rounds},
               "sizes": {"shapes": [list(s) for s in sweep.shapes], "d": list(sweep.d),
                         "skipped": [[*shape[:3], d] for shape in sweep.shapes for d in sweep.d
                                     if d <= _largest_d(shape) and d not in sweep.sizes(shape)]},
               "searched": f"{len(table)} of {sum(len(sweep.sizes(s)) for s in sweep.shapes)}",
               "probes_computed": computed}
    return Capacity(table, probes, summary)


def write_transformer(result: Capacity, sweep: TransformerSweep, out: Path) -> None:
    """probes.csv, capacity.csv, summary.json and facts_vs_parameters.png in `out`."""
    write_csv(out / "probes.csv", result.probes)
    write_csv(out / "capacity.csv", result.table)
    write_summary(out / "summary.json", result.summary)
    if (result.table["facts"] > 0).any():
        facts_figure(result.table, result.summary["fitted_slope"], sweep, out / "facts_vs_parameters.png")


def transformer_text(result: Capacity) -> str:
    line = result.summary["paper_line"]
    lo, hi = line["facts_window"]
    lines = [f"sizes searched: {result.summary['searched']}",
             f"facts stored against parameters: fitted slope {Fit.from_json(result.summary['fit'], LINE).show('slope')}"
             "; theory 1",
             f"facts per parameter (geometric mean over {lo} to {hi} facts): " + (
                 f"{line['over_paper_line']:.2f}x the paper's {line['facts_per_parameter']:g}"
                 f" ({line['facts_per_parameter_measured']:.3f})" if line["over_paper_line"] is not None else
                 f"n/a, no size inside the window (the paper's line: {line['facts_per_parameter']:g})")]
    lines += [f"  shape {r.shape}  d={r.d:<4} " + (
        f"S*=R*={r.S_star:<4} facts={r.facts:<6} parameters={r.parameters:<7} "
        f"facts/parameter={r.facts_per_parameter:.3f}"
        if r.S_star else f"nothing stored (not even S = R = {LOWEST}; left out of the fits)  parameters={r.parameters}")
        for r in result.table.itertuples()]
    return "\n".join(lines)
