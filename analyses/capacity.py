"""python -m analyses.capacity memory|transformer : how many associations / facts fit?

memory       For each size, binary-search the largest number N* of associations an
             associative memory (models/memories.py) stores at >= 99% accuracy (best over
             training), per seed. Linear memories: N* against d (theory ~ d^2 up to a log);
             low-rank linear (--m = rank) and MLP memories (--m = width): N* against m*d.
transformer  For each shape (alpha = H*d_h/d, beta = m/d, H) and each d, binary-search the
             largest S = R (D fixed) a one-layer transformer learns to >= 99% held-out
             accuracy, the learning rates trained as one batched run; facts stored S*R
             against the parameter count 4*H*d_h*d + 2*m*d (paper Figure 4 left).

Both fit the log-log slope (summary.json `fitted_slope`) and write, to --out: cells/ (one
JSON per probe: a re-run with the same settings skips what is recorded), probes.csv,
capacity.csv (one row per size and seed), summary.json and a figure with the theory lines.
Memories are also read against the line the paper draws (`authors_line`: N ln N = d^2/1.3
for the linear memory, N ln N = m d / 0.35 for the MLP, N = m d / 1.2 for the MLP with M = 32
fixed outputs, --outputs 32): the slope of log(N* ln N*) and N* over the line at every size.
The searches run concurrently, each probe a cell: in this process (--executor local) or as
Ray tasks (--executor ray: one worker per core, or a cluster with --ray-address).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from analyses import cli
from analyses.executors import ExecutorSettings, open_executor
from analyses.output import save_figure, subplots, write_csv, write_summary
from analyses.sweep import Cell, Cells, bisection, run_jobs, search
from models.bridge import resolve_device
from models.config import PARAMETERISATIONS, ModelConfig, RunConfig, TaskConfig, TrainConfig, setting, shape_model
from models.memories import KINDS, MemoryConfig, fit
from models.trainer import train
from models.weights import parameter_count

TARGET = 0.99


@dataclass
class Capacity:
    """A capacity sweep's results: one row per size (and seed), every probe, summary.json."""

    table: pd.DataFrame  # capacity.csv
    probes: pd.DataFrame  # probes.csv: every recorded probe
    summary: dict


def fitted_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


# ------------------------------------------------------------------------ memories
def memory_capacity(cfg: MemoryConfig, seed: int, device: str):
    """The search for N* of one memory size and seed (a job of analyses.sweep): the largest
    N stored at >= 99% (relative tolerance 5%)."""
    start = max(2, cfg.theory // (4 * max(1, round(math.log(cfg.theory)))))
    return search(bisection(start, lowest=2, rel_tol=0.05),
                  lambda n: Cell(f"{cfg.kind}_d{cfg.d}_m{cfg.m}_seed{seed}_N{n}", memory_row, (cfg, n, seed, device)),
                  lambda row: row["accuracy"] >= cfg.target_accuracy)


def memory_row(cfg: MemoryConfig, n: int, seed: int, device: str) -> dict:
    """One probe: `cfg` fitted to n associations with `seed` (device resolved where it runs)."""
    result = fit(cfg, n, [seed], resolve_device(device))
    return {"kind": cfg.kind, "d": cfg.d, "m": cfg.m, "seed": seed, "n": n,
            "accuracy": result["accuracy"][0], "steps_run": result["steps_run"]}


@dataclass(frozen=True)
class MemorySweep:
    """The associative memories whose capacity N* is searched: sizes, seeds, and their fit."""

    kind: str = setting("linear", "linear (full, or low rank with --m) | mlp", choices=KINDS)
    d: tuple[int, ...] = setting((8, 16, 32), "embedding dimensions")
    m: tuple[int, ...] | None = setting(None, "linear: ranks (default full); mlp: widths")
    m_per_d: tuple[float, ...] | None = setting(None, "sizes m = a*d for each listed a, in place of --m "
                                                      "(the paper's MLP widths: 1,2,4,8)")
    seeds: int = setting(3, "seeds 0..N-1 per size (the paper 5)")
    steps: int = setting(2000, "maximum Adam steps per fit (the paper 2^15)")
    lr: float = setting(0.1, "Adam learning rate")
    embedding: str = setting("sphere", "sphere (unit norm) | gaussian (N(0, 1/d) entries)",
                             choices=("sphere", "gaussian"))
    outputs_per_input: float = setting(1.0, "M/N: 1 = injective f")
    outputs: int | None = setting(None, "M fixed whatever N (the paper's Figure 6: 32); replaces --outputs-per-input")

    def __post_init__(self):
        cli.at_least(self, d=1, m=1, seeds=1, steps=1, outputs=2)
        cli.require(self, "lr", self.lr > 0, "> 0")
        cli.require(self, "outputs_per_input", 0 < self.outputs_per_input <= 1, "in (0, 1]")
        if self.m is not None and self.m_per_d is not None:
            raise ValueError("give --m or --m-per-d, not both.")
        if self.kind == "mlp" and self.m is None and self.m_per_d is None:
            raise ValueError("--kind mlp needs --m (the widths) or --m-per-d.")
        for cfg in self.memories():
            cfg.validate()

    def memories(self) -> list[MemoryConfig]:
        """One memory per size: every d with every m (or m = a*d for every a of m_per_d)."""
        sizes = [(d, m) for d in self.d for m in (self.m or (None,))] if self.m_per_d is None else \
            [(d, round(a * d)) for d in self.d for a in self.m_per_d]
        return [MemoryConfig(kind=self.kind, d=d, m=m, embedding=self.embedding, steps=self.steps, lr=self.lr,
                             outputs_per_input=self.outputs_per_input, n_outputs=self.outputs) for d, m in sizes]

    def recorded(self) -> dict:
        """What every probe shares (settings.json); sizes and seeds are in the cell keys, so a
        sweep can grow. Fields added after the first sweeps are recorded only when set: those
        sweeps stay readable."""
        first = asdict(self.memories()[0])
        return {"analysis": "capacity memory", **{k: v for k, v in first.items() if k not in ("d", "m") and not (
            k in ("n_outputs", "eval_every") and v == getattr(MemoryConfig, k))}}


def search_memories(sweep: MemorySweep, cells: Cells, executor: ExecutorSettings, device: str,
                    progress: bool = True) -> list[dict]:
    """N* of every memory size and seed, one row each (the probes are recorded in `cells`)."""
    searches = [(cfg, seed) for cfg in sweep.memories() for seed in range(sweep.seeds)]
    with open_executor(executor) as running:
        found = run_jobs([memory_capacity(cfg, seed, device) for cfg, seed in searches], cells, running,
                         desc="memory probes", progress=progress)
    return [{"kind": cfg.kind, "d": cfg.d, "m": cfg.m, "seed": seed, "n_star": n_star, "parameters": cfg.parameters,
             "theory": cfg.theory, "n_star_over_theory": n_star / cfg.theory}
            for (cfg, seed), n_star in zip(searches, found)]


@dataclass(frozen=True)
class AuthorsLine:
    """The reference line the paper draws through a capacity figure: N ln N = c x (or N = c x
    without the log factor), x = d^2 for a full linear memory and m*d otherwise."""
    law: str
    c: float
    log_factor: bool
    setting: str  # the memories the paper drew it for

    def value(self, n):
        """N ln N (or N) for N* = n."""
        n = np.asarray(n, float)
        return n * np.log(n) if self.log_factor else n

    def n_on_line(self, x):
        """N on the line at scale x: N ln N = c x solved by Newton's method."""
        target = self.c * np.asarray(x, float)
        if not self.log_factor:
            return target
        n = np.maximum(target / np.log(np.maximum(target, 3.0)), 1.0)
        for _ in range(30):  # n ln n is convex and increasing for n >= 1: monotone convergence
            n = n - (n * np.log(n) - target) / (np.log(n) + 1)
        return n


def authors_line(cfg: MemoryConfig) -> AuthorsLine | None:
    """The paper's reference line for this memory (Figure 1 and Figure 6), or None."""
    if cfg.kind == "linear" and cfg.m is None:
        return AuthorsLine("N ln N = d²/1.3", 1 / 1.3, True, "full linear memory, f(i) = i (Figure 1 left)")
    if cfg.kind == "mlp" and cfg.n_outputs is not None:
        return AuthorsLine("N = m·d/1.2", 1 / 1.2, False, "MLP memory, M = 32 outputs (Figure 6)")
    if cfg.kind == "mlp" and cfg.outputs_per_input == 1:
        return AuthorsLine("N ln N = m·d/0.35", 1 / 0.35, True, "MLP memory, f(i) = i (Figure 1 right)")
    return None


def _memory_means(table: pd.DataFrame) -> pd.DataFrame:
    """Per size: the scale x, N* mean and std over seeds."""
    means = table.groupby(["d", "m"], dropna=False).agg(x=("x", "first"), n_star=("n_star", "mean"),
                                                        n_star_std=("n_star", "std"), theory=("theory", "first"))
    return means.reset_index()


def _is_full(cfg: MemoryConfig) -> bool:
    return cfg.kind == "linear" and cfg.m is None


def memory_tables(rows: list[dict] | pd.DataFrame, cfg: MemoryConfig, probes: pd.DataFrame, extra: dict) -> Capacity:
    """From one row per (size, seed) with its N*: the capacity table and the summary. The plain
    slope of log N* against log d (full linear) or log m*d, and the authors' law: the slope of
    log(N* ln N*) against the same (2 and 1 when the law holds) and N* against the paper's
    line at every size. `extra` is added to the summary."""
    full = _is_full(cfg)
    table = pd.DataFrame(rows)
    table = table.assign(x=table["d"] if full else table["m"] * table["d"])  # the scale: d (full linear), else m*d
    x_name, theory_slope = ("d", 2.0) if full else ("m*d", 1.0)
    means = _memory_means(table)
    several = means["x"].nunique() > 1
    slope = fitted_slope(means["x"], means["n_star"]) if several else float("nan")
    line = authors_line(cfg)
    sizes = []
    for r in means.itertuples():
        size = {"d": int(r.d), "m": None if pd.isna(r.m) else int(r.m), "x": int(r.x),
                "n_star_mean": float(r.n_star),
                "n_star_std": float(r.n_star_std) if r.n_star_std == r.n_star_std else None,
                "n_star_over_theory": float(r.n_star / r.theory)}
        if line is not None:
            n_line = float(line.n_on_line(r.theory))
            size.update(n_line=n_line, n_star_over_line=float(r.n_star / n_line))
        sizes.append(size)
    summary = {"kind": cfg.kind, "x": x_name, "fitted_slope": slope, "theory_slope": theory_slope, "authors_line": None,
               "sizes": sizes, **extra}
    if line is not None:
        law_slope = fitted_slope(means["x"], line.value(means["n_star"])) if several else float("nan")
        summary["authors_line"] = {"law": line.law, "setting": line.setting,
                                   "fitted_slope": law_slope, "theory_slope": theory_slope,
                                   "fitted_slope_of": ("log(N* ln N*)" if line.log_factor else "log N*")
                                   + f" against log {x_name}"}
    return Capacity(table, probes, summary)


def _memory_title(cfg: MemoryConfig) -> str:
    kind = cfg.kind + " memory" + ("" if _is_full(cfg) else (" (rank m)" if cfg.kind == "linear" else " (width m)"))
    return kind + (f", M = {cfg.n_outputs} outputs" if cfg.n_outputs is not None else "")


def write_memory(result: Capacity, cfg: MemoryConfig, out: Path) -> None:
    """probes.csv, capacity.csv, summary.json and capacity_{kind}.png in `out`."""
    write_csv(out / "probes.csv", result.probes)
    write_csv(out / "capacity.csv", result.table)
    write_summary(out / "summary.json", result.summary)
    full = _is_full(cfg)
    _capacity_figure(_memory_means(result.table), result.table, full, result.summary["fitted_slope"],
                     authors_line(cfg), _memory_title(cfg), out / f"capacity_{cfg.kind}.png")


def memory_text(result: Capacity, cfg: MemoryConfig) -> str:
    """The fitted slopes and N* at every size, as the CLI prints them."""
    s, full, line = result.summary, _is_full(cfg), authors_line(cfg)
    lines = [f"{_memory_title(cfg)}: fitted slope of log N* against log {s['x']}: {s['fitted_slope']:.2f} "
             f"(theory {s['theory_slope']:.0f}, up to a log factor)"]
    if line is not None:
        a = s["authors_line"]
        lines.append(f"  the paper's line {line.law}: slope of {a['fitted_slope_of']}: {a['fitted_slope']:.2f} "
                     f"(the law: {s['theory_slope']:.0f})")
    for size in s["sizes"]:
        text = (f"  d={size['d']:<4} m={size['m']}  N*={size['n_star_mean']:.1f}  "
                f"N*/{'d^2' if full else 'md'}={size['n_star_over_theory']:.3f}")
        if line is not None:
            text += f"  line N={size['n_line']:.1f}  N*/line={size['n_star_over_line']:.2f}"
        lines.append(text)
    return "\n".join(lines)


def memory_report(rows: list[dict] | pd.DataFrame, cfg: MemoryConfig, out: Path, probes: pd.DataFrame,
                  extra: dict) -> dict:
    """memory_tables -> write_memory -> print memory_text, for N* found elsewhere (one row per
    size and seed, e.g. scripts/linear_memory_authors_recipe.py); the summary."""
    result = memory_tables(rows, cfg, probes, extra)
    write_memory(result, cfg, out)
    print(memory_text(result, cfg))
    return result.summary


def _capacity_figure(means, table, full, slope, line, title, path):
    """Left, as the paper plots it: N* against d^2 (full linear) or m*d, with the fit, the
    theory lines and the paper's line. Right: N* over the paper's line (over d^2 or m*d
    when there is none) at every size."""
    import matplotlib.ticker

    scale_name = "d²" if full else "m·d"  # the `theory` column: the paper's x axis
    fig, (ax, right) = subplots(1, 2, figsize=(10, 4))
    groups, label = [(None, means)], "mean over seeds".format
    if not full and means["m"].nunique() > 1:  # one series per m/d on a grid of d x (m/d), else per m
        ratio = means["m"] / means["d"]
        by_ratio = ratio.groupby(means["d"]).apply(frozenset).nunique() == 1
        groups = means.groupby(ratio if by_ratio else means["m"])
        label = "m = {:g}·d".format if by_ratio else "m = {:g}".format
    ax.scatter(table["theory"], table["n_star"], s=10, alpha=0.4, color="gray", label="one seed")
    for k, (key, g) in enumerate(groups):
        ax.errorbar(g["theory"], g["n_star"], yerr=g["n_star_std"].fillna(0), fmt="o", color=f"C{k}", label=label(key))
        reference = line.n_on_line(g["theory"]) if line is not None else g["theory"]
        right.plot(g["x"], g["n_star"] / reference, "o-", color=f"C{k}", label=label(key))
    x = np.geomspace(means["theory"].min(), means["theory"].max(), 50)
    anchor_x, anchor_y = np.exp(np.log(means["theory"]).mean()), np.exp(np.log(means["n_star"]).mean())
    per_scale = 2.0 if full else 1.0  # x = d (full linear) is the square root of the plotted scale d^2
    if not math.isnan(slope):
        ax.plot(x, anchor_y * (x / anchor_x) ** (slope / per_scale), "C0-", lw=1,
                label=f"fit: N* ∝ {'d' if full else 'm·d'}^{slope:.2f}")
    ax.plot(x, anchor_y * x / anchor_x, "k--", lw=1, label=f"theory ∝ {scale_name}")
    if full:
        ax.plot(x, anchor_y * (x / anchor_x) * np.log(anchor_x) / np.log(x), "k:", lw=1, label="theory ∝ d² / log d²")
    if line is not None:
        ax.plot(x, line.n_on_line(x), "r-.", lw=1.5, label=f"paper: {line.law}")
    ax.set(xscale="log", yscale="log", xlabel=scale_name, ylabel="associations stored N*", title=title)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    right.axhline(1.0, color="r" if line is not None else "k", ls="-." if line is not None else "--", lw=1)
    right.set(xscale="log", xlabel="d" if full else "m·d",
              ylabel=f"N* / N on the paper's line ({line.law})" if line is not None else f"N* / {scale_name}",
              title="against the paper's line" if line is not None else f"N* / {scale_name}")
    right.set_xticks(sorted(means["x"].unique()))
    right.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    right.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if len(groups) > 1:
        right.legend(fontsize=7)
    save_figure(fig, path)


# --------------------------------------------------------------------- transformers
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
    steps: int = setting(16384, "maximum steps per run (2^14)")
    batch_size: int = setting(1024, "fresh prompts per step")
    eval_every: int = setting(128, "steps between held-out evaluations")
    eval_size: int = setting(4096, "held-out prompts per evaluation (the paper: 1024)")
    min_size: int = setting(8, "S = R where the smallest d's search starts (the paper: 8)")
    max_size: int = setting(512, "largest S = R tried (the paper: 512)")
    parameterisation: str = setting("authors", "the model: authors (the official code's TF_one_layer) | standard "
                                    "(TransformerLens conventions; see docs/training.md)", choices=PARAMETERISATIONS)
    embedding: str = setting("auto", "frozen embeddings: auto (the parameterisation's: gaussian for authors, sphere "
                             "for standard) | sphere | gaussian", choices=("auto", "sphere", "gaussian"))
    probes: int = setting(1, "sizes each search trains at once (1: the authors' bisection; P > 1 cuts the "
                             "bracket in P + 1 parts, for more workers than shapes; keep it when resuming)")
    bits_per_parameter: float = setting(2.0, "bits per parameter of the information-bound line in the figure")
    facts_per_parameter: float = setting(0.15, "facts per parameter of the paper's reference line in the figure")

    def __post_init__(self):
        cli.at_least(self, d=1, answers=2, seq_len=3, steps=1, batch_size=1, eval_every=1, eval_size=1, min_size=2,
                     probes=1)
        cli.at_least(self, max_size=self.min_size)
        cli.require(self, "lr", all(lr > 0 for lr in self.lr), "> 0")
        for shape in self.shapes:
            if min(self.d) > _largest_d(shape):
                raise ValueError(f"shape {','.join(f'{v:g}' for v in shape)}: its largest d is below every --d.")
            if not self.sizes(shape):  # the reason, from the largest d
                shape_model(shape[0], shape[1], int(shape[2]), max(d for d in self.d if d <= _largest_d(shape)))

    def sizes(self, shape: tuple) -> list[int]:
        """The d (up to the shape's largest) at which the shape has d_h >= 1 and m >= 1
        (rounded down), increasing."""
        def fits(d):
            try:
                return bool(shape_model(shape[0], shape[1], int(shape[2]), d))
            except ValueError:
                return False
        return sorted(d for d in set(self.d) if d <= _largest_d(shape) and fits(d))

    def run(self, shape: tuple, d: int, S: int, device: str) -> RunConfig:
        """The paper's task at S = R (N = S + R noise tokens) and the shape's model at size d;
        the learning rates as one batched run."""
        task = TaskConfig(n_subjects=S, n_relations=S, answers_per_relation=self.answers, n_noise=2 * S,
                          seq_len=self.seq_len)
        return RunConfig(task=task, model=self.model(shape, d),
                         train=TrainConfig(lr=tuple(self.lr), seed=(self.seed,), steps=self.steps,
                                           batch_size=self.batch_size, eval_every=self.eval_every,
                                           eval_size=self.eval_size, target_accuracy=TARGET, snapshots_per_octave=0,
                                           device=device))

    def model(self, shape: tuple, d: int) -> ModelConfig:
        """The shape's model at size d, in this sweep's parameterisation and embeddings."""
        model = shape_model(shape[0], shape[1], int(shape[2]), d, self.parameterisation)
        return replace(model, embedding=self.embedding).resolved()

    def recorded(self) -> dict:
        """What every training run shares (settings.json); shapes and sizes are in the cell keys,
        and the search bounds choose cells without changing any. The model is recorded only
        where it is not the standard one with sphere embeddings, which every sweep recorded
        before the choice existed trained: those sweeps resume."""
        model = ModelConfig(parameterisation=self.parameterisation, embedding=self.embedding)
        chosen = {k: v for k, v in model.recorded().items() if k in ("parameterisation", "embedding")}
        return {"analysis": "capacity transformer", "answers": self.answers, "seq_len": self.seq_len,
                "lr": list(self.lr), "seed": self.seed, "steps": self.steps, "batch_size": self.batch_size,
                "eval_every": self.eval_every, "eval_size": self.eval_size,
                **({"model": chosen} if chosen != {"embedding": "sphere"} else {})}


def _largest_d(shape: tuple) -> float:
    return shape[3] if len(shape) > 3 else math.inf


def shape_capacity(shape: tuple, sweep: TransformerSweep, device: str, found: dict):
    """The largest S = R learned to >= 99% by the shape at each of its sizes, as the authors
    search it: d in increasing order, each search starting from the previous d's S* (a larger
    model stores at least as much), growing x1.5 until a size fails, then bisecting to 10%,
    never above max_size. found[d] = S* as each size ends, so a sweep cut short keeps the
    sizes it finished (a job of analyses.sweep)."""
    start = sweep.min_size
    for d in sweep.sizes(shape):
        S = yield from search(bisection(start, lowest=2, highest=sweep.max_size, grow=1.5, rel_tol=0.1,
                                        probes=sweep.probes),
                              lambda S, d=d: Cell(f"shape{shape[0]:g},{shape[1]:g},{shape[2]:g}_d{d}_S{S}",
                                                  transformer_row, (shape, d, S, sweep, device)),
                              lambda row: row["accuracy"] >= TARGET)
        found[d] = S
        start = min(max(S, sweep.min_size), sweep.max_size)
    return found


def transformer_row(shape, d, S, sweep: TransformerSweep, device: str) -> dict:
    """One probe: the shape at size d trained on S = R (device resolved where it runs).
    `accuracy`: the kept model's last evaluation (>= 99% exactly when some learning rate's
    best evaluation is, since training stops there); `runs`: per learning rate, the best
    held-out accuracy over the run and the evaluation curve, so a failing size shows whether
    it was still rising."""
    run = sweep.run(shape, d, S, device)
    result = train(run, progress=False)
    t = result.training
    steps = [row["step"] for row in result.metrics]
    runs = [{"lr": lr, "best_accuracy": max(row["models"][k]["accuracy"] for row in result.metrics),
             "final_accuracy": result.metrics[-1]["models"][k]["accuracy"],
             "curve": {"step": steps, "accuracy": [round(row["models"][k]["accuracy"], 5) for row in result.metrics]}}
            for k, (lr, _) in enumerate(run.train.runs)]
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
        run_jobs([shape_capacity(shape, sweep, device, found[shape]) for shape in sweep.shapes], cells, running,
                 desc="transformer probes", progress=progress, compute=compute)
    rows = []
    for shape in sweep.shapes:
        for d, S in found[shape].items():
            run = sweep.run(shape, d, S, device)
            params = parameter_count(run.model.checkpoint_section(run.task.build()))["total"]
            rows.append({"shape": ",".join(f"{v:g}" for v in shape[:3]), "d": d, "S_star": S, "facts": S * S,
                         "parameters": params, "facts_per_parameter": S * S / params})
    return rows


PAPER_FACTS_WINDOW = (64, 11000)  # the facts range the paper's Figure 4 left shows


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
    table = pd.DataFrame(rows, columns=["shape", "d", "S_star", "facts", "parameters", "facts_per_parameter"])
    ok = table[table["facts"] > 0]
    shown = paper_window(ok)

    def slope(g):
        return fitted_slope(g["parameters"], g["facts"]) if g["parameters"].nunique() > 1 else None

    def per_parameter(g):
        ratio = float(np.exp(np.log(g["facts_per_parameter"]).mean())) if len(g) else None  # geometric mean
        return {"facts_per_parameter_measured": ratio,
                "over_paper_line": ratio / sweep.facts_per_parameter if ratio is not None else None}

    per_shape = {shape: {"fitted_slope": slope(g), **per_parameter(shown[shown["shape"] == shape]),
                         "rows": g.drop(columns="shape").to_dict("records")}
                 for shape, g in ok.groupby("shape", sort=False)}
    summary = {"fitted_slope": slope(ok), "shapes": per_shape,
               "paper_line": {"facts_per_parameter": sweep.facts_per_parameter,
                              "facts_window": list(PAPER_FACTS_WINDOW), **per_parameter(shown)},
               "bits_per_parameter": sweep.bits_per_parameter, "bits_per_fact": math.log2(sweep.answers),
               "settings": sweep.recorded(),
               "search": {"min_size": sweep.min_size, "max_size": sweep.max_size, "grow": 1.5, "rel_tol": 0.1,
                          "probes": sweep.probes},
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
        _facts_figure(result.table, result.summary["fitted_slope"], sweep, out / "facts_vs_parameters.png")


def transformer_text(result: Capacity) -> str:
    def num(x, fmt):
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    line = result.summary["paper_line"]
    lo, hi = line["facts_window"]
    lines = [f"sizes searched: {result.summary['searched']}",
             f"facts stored against parameters: fitted slope {num(result.summary['fitted_slope'], '.2f')} (theory 1)",
             f"facts per parameter (geometric mean over {lo} to {hi} facts): "
             f"{num(line['over_paper_line'], '.2f')}x the paper's {line['facts_per_parameter']:g}"
             f" ({num(line['facts_per_parameter_measured'], '.3f')})"]
    lines += [f"  shape {r.shape}  d={r.d:<4} S*=R*={r.S_star:<4} facts={r.facts:<6} parameters={r.parameters:<7} "
              f"facts/parameter={r.facts_per_parameter:.3f}" for r in result.table.itertuples()]
    return "\n".join(lines)


def _facts_figure(table, slope, sweep: TransformerSweep, path):
    import matplotlib.ticker

    fig, ax = subplots(figsize=(5.5, 4.5))
    for k, (shape, g) in enumerate(table.groupby("shape", sort=False)):
        ax.plot(g["parameters"], g["facts"], "o-", color=f"C{k}", label=f"(α, β, H) = ({shape})")
    x = np.geomspace(table["parameters"].min(), table["parameters"].max(), 50)
    ok = table[table["facts"] > 0]
    anchor_x, anchor_y = np.exp(np.log(ok["parameters"]).mean()), np.exp(np.log(ok["facts"]).mean())
    if slope is not None and not math.isnan(slope):
        ax.plot(x, anchor_y * (x / anchor_x) ** slope, "k-", lw=1, label=f"fit: slope {slope:.2f}")
    ax.plot(x, sweep.facts_per_parameter * x, "r--", lw=1.2,
            label=f"paper: {sweep.facts_per_parameter:g} facts per parameter")
    bits = sweep.bits_per_parameter
    ax.plot(x, bits * x / math.log2(sweep.answers), "r-.", lw=0.8, alpha=0.6,
            label=f"information bound at {bits:g} bits/parameter")
    ax.axhspan(*PAPER_FACTS_WINDOW, color="0.9", zorder=0, label="facts range the paper shows")
    ax.set(xscale="log", yscale="log", xlabel="parameters (4·H·d_h·d + 2·m·d)", ylabel="facts stored (S·R)",
           title="Facts stored against parameters")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    save_figure(fig, path)


# ----------------------------------------------------------------------------- CLI
def _shape(text: str) -> tuple:
    values = cli.comma_list(float)(text)
    if len(values) not in (3, 4):
        raise argparse.ArgumentTypeError(f"a shape is ALPHA,BETA,H or ALPHA,BETA,H,LARGEST_D, got {text!r}")
    return values


def parser():
    p = cli.parser("python -m analyses.capacity", __doc__)
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
    for q in (m, t):
        cli.add_out(q)
        cli.add_device(q)
        cli.add_quiet(q)
        cli.add_sweep(q)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    executor = cli.executor(args)
    progress = not args.quiet
    if args.command == "memory":
        sweep = cli.settings(args, MemorySweep)
        cells = Cells(args.out, sweep.recorded(), executor.torch_threads)
        rows = search_memories(sweep, cells, executor, args.device, progress)
        cfg = sweep.memories()[0]
        result = memory_tables(rows, cfg, pd.DataFrame(cells.rows()),
                               {"settings": sweep.recorded(), "seeds": sweep.seeds,
                                "device": str(resolve_device(args.device)), "probes_computed": cells.computed})
        write_memory(result, cfg, args.out)
        print(memory_text(result, cfg) + f"\nwrote {args.out}/ ({cells.computed} new probes)")
    else:
        sweep = cli.settings(args, TransformerSweep, **({"shapes": tuple(args.shapes)} if args.shapes else {}))
        cells = Cells(args.out, sweep.recorded(), executor.torch_threads)
        rows = search_transformers(sweep, cells, executor, args.device, progress, compute=not args.recorded_only)
        result = transformer_tables(rows, sweep, pd.DataFrame(cells.rows()), cells.computed)
        write_transformer(result, sweep, args.out)
        print(transformer_text(result) + f"\nwrote {args.out}/ ({cells.computed} new training runs)")
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
