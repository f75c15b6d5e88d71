"""python -m analyses.aot_capacity [--out DIR] : memorisation capacity of one-layer
attention-only transformers (Dana, Pydi & Chevaleyre), on the association task.

Trains, on bigrams over N tokens with a random next token each (T_0 = N^S associations):
  heads    attention-only models, H in --heads at fixed d_h = --d-head, d = --d-model
  d_head   H = --fixed-heads, d_h in --d-heads
  d_model  H = --fixed-heads, d_h = --d-head, d in --d-models
  mlp      one head of d_h = --d-head + a GELU MLP of width m: the same parameter count
           as the attention-only model with H heads (H in --heads, H > 1)
  d_equal  d = d_h in --equal-dims, H in --heads (the paper's Figure 2b; none by default)
in each --head-layout: standard (the paper's equations: every head its own maps from the
d-dimensional stream) and/or dana (the authors' code: one shared d -> d_h compression,
d_h-dimensional positions, one shared d_h -> d decompression; models/aot_weights.py).
Measures the accuracy on all T_0 sequences (the share of associations memorised) and the
authors' accuracy (mean of the last 100 training-batch accuracies, batch_accuracy),
averaged over --seeds. Fits accuracy = a + b H (R^2), and accuracy = a + b d_h^k (the
exponent k), and for d_equal the per-head slope at each d (points up to the first above
0.95, as the authors) and its growth slope ~ d^k; draws the lower bound of Corollary 2,
1/N + (1 - 1/N)(H min(d_h, d) + d)/T_0 (the theorem takes d_h <= d), on every axis.
With --distribution-heads it also trains attention-only models on the distribution task
and compares their KL with the rank-d floor. On the heads sweep's models it reads, through
the TransformerBridge hooks, whether each head attends by position or by token.

Writes to DIR: runs.csv (one row per model and seed), capacity.csv (seed means),
heads.csv, head_tokens.csv, summary.json (fit_H_r2, fit_dh_exponent, ...), capacity.png,
head_roles.png, checkpoints/ (every trained model, docs/checkpoint_format.md, task.kind
association or distribution) and cells/ (one JSON file per finished stack of models: a
rerun skips them). Stacks run in this process (--executor local) or as Ray tasks
(--executor ray: one worker per core, or a cluster with --ray-address).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyses import cli
from analyses.executors import ExecutorSettings, open_executor
from analyses.output import save_figure, subplots, write_csv, write_summary
from analyses.sweep import Cell, Cells, one, run_jobs
from models import load
from models.aot_trainer import train_aot
from models.cli import add_config_flags, given
from models.config import AoTModelConfig, AoTTrainConfig, setting
from probe.head_roles import head_roles, key_token_table, sequences_run
from probe.kl_floor import rank_d_kl_floor
from tasks.association import AssociationTask, DistributionTask, SequenceTask


def lower_bound(n_heads: int, d_head: int, d_model: int, n_tokens: int, n_sequences: int) -> float:
    """Corollary 2: an AoT can reach accuracy 1/N + (1 - 1/N)(H d_h + d)/T_0 (at most 1),
    for d_h <= d; a head wider than d writes no more than d, so d_h counts as min(d_h, d)."""
    return min(1.0, 1 / n_tokens + (1 - 1 / n_tokens) * (n_heads * min(d_head, d_model) + d_model) / n_sequences)


@dataclass(frozen=True)
class AotSweep:
    """The association task and the models of every sweep (the module docstring)."""

    n_tokens: int = setting(50, "N, vocabulary size")
    context: int = setting(2, "S, sequence length (2: bigrams)")
    table_seed: int = setting(0, "seed of the random next-token table")
    d_model: int = setting(10, "d of the heads, d_head and mlp sweeps")
    d_head: int = setting(10, "d_h of the heads, d_model and mlp sweeps")
    fixed_heads: int = setting(20, "H of the d_head and d_model sweeps")
    heads: tuple[int, ...] = setting((1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20),
                                     "H values of the heads sweep (and the MLP model's matched sizes)")
    d_heads: tuple[int, ...] = setting((1, 2, 4, 6, 8, 10), "d_h values")
    d_models: tuple[int, ...] = setting((2, 4, 6, 8, 10, 15, 20), "d values")
    equal_dims: tuple[int, ...] = setting((), "d = d_h values of the d_equal sweep, each with H in --heads")
    head_layout: tuple[str, ...] = setting(("standard",), "head layouts trained side by side: standard and/or dana "
                                                          "(the authors' code)")
    distribution_heads: tuple[int, ...] = setting((), "also train attention-only models with these H on the "
                                                      "distribution task")
    concentration: float = setting(1.0, "distribution task: pi_t = softmax(c g_t)")
    seeds: tuple[int, ...] = setting((0, 1), "seeds averaged")
    stack: int = setting(8, "models trained at once in one padded stack")
    skip_instruments: bool = setting(False, "no head-role measurements")
    skip_mlp: bool = setting(False, "no one-head-plus-MLP models (the mlp sweep)")

    def __post_init__(self):
        cli.at_least(self, stack=1)
        cli.require(self, "seeds", len(self.seeds) > 0, "at least one seed")
        self.task()  # a bad task is refused here, before anything is written
        if self.distribution_heads:
            self.distribution_task()
        for models in self.sweep_models().values():
            for m in models:
                m.validate()

    @property
    def layouts(self) -> tuple[str, ...]:
        """Each head layout once, in the order given."""
        return tuple(dict.fromkeys(self.head_layout))

    def sweeps(self, layout: str = "standard") -> dict[str, list[AoTModelConfig]]:
        """The models of each sweep in one head layout (a model may belong to several)."""
        d, dh, H = self.d_model, self.d_head, self.fixed_heads
        base = AoTModelConfig(d, 1, dh, head_layout=layout)
        base.validate()
        return {
            "heads": [AoTModelConfig(d, h, dh, head_layout=layout) for h in self.heads],
            "d_head": [AoTModelConfig(d, H, k, head_layout=layout) for k in self.d_heads],
            "d_model": [AoTModelConfig(k, H, dh, head_layout=layout) for k in self.d_models],
            "mlp": [AoTModelConfig(d, 1, dh, d_mlp=base.matched_mlp_width(h), head_layout=layout)
                    for h in self.heads if h > 1 and not self.skip_mlp],
            "d_equal": [AoTModelConfig(k, h, k, head_layout=layout) for k in self.equal_dims for h in self.heads],
        }

    def sweep_models(self) -> dict[str, list[AoTModelConfig]]:
        """Each sweep's models in every layout."""
        models: dict[str, list[AoTModelConfig]] = {}
        for layout in self.layouts:
            for sweep, some in self.sweeps(layout).items():
                models.setdefault(sweep, []).extend(some)
        return models

    def task(self) -> AssociationTask:
        return AssociationTask(self.n_tokens, self.context, self.table_seed)

    def distribution_task(self) -> DistributionTask:
        return DistributionTask(self.n_tokens, self.context, self.table_seed, self.concentration)


def per_head_slopes(rows: pd.DataFrame, saturation: float = 0.95) -> pd.DataFrame:
    """For each d of the d_equal sweep: the slope of accuracy against H (least squares) over
    the H values up to and including the first with accuracy above `saturation` (the
    authors' rule, Figure 2b)."""
    out = []
    for d, group in rows.groupby("d_model"):
        group = group.sort_values("n_heads")
        above = np.flatnonzero(group.accuracy.to_numpy() > saturation)
        kept = group.iloc[: above[0] + 1] if len(above) else group
        if len(kept) >= 2:
            slope = fit_linear(kept.n_heads.to_numpy(float), kept.accuracy.to_numpy(float))["slope"]
            out.append({"d": int(d), "slope": slope, "points": len(kept)})
    return pd.DataFrame(out, columns=["d", "slope", "points"])


def fit_linear(x: np.ndarray, y: np.ndarray) -> dict:
    """Least squares y = a + b x: intercept, slope, R^2."""
    b, a = np.polyfit(x, y, 1)
    residual = y - (a + b * x)
    r2 = 1 - residual.var() / y.var() if y.var() > 0 else float("nan")
    return {"intercept": float(a), "slope": float(b), "r2": float(r2)}


def fit_power(x: np.ndarray, y: np.ndarray) -> dict:
    """Least squares y = a + b x^k, k on a grid of 0.1 .. 4 (step 0.01), (a, b) exact for
    each k: exponent, intercept, coefficient, R^2."""
    best = None
    for k in np.arange(0.1, 4.0001, 0.01):
        A = np.stack([np.ones_like(x), x ** k], 1)
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        sse = float(((A @ coef - y) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, k, coef)
    sse, k, (a, b) = best
    return {"exponent": round(float(k), 2), "intercept": float(a), "coefficient": float(b),
            "r2": float(1 - sse / ((y - y.mean()) ** 2).sum()) if y.var() > 0 else float("nan")}


# --------------------------------------------------------------------------- training
def _run_key(task: SequenceTask, model: AoTModelConfig, seed: int, cfg: AoTTrainConfig) -> str:
    model_settings = asdict(model)
    if model.head_layout == "standard":  # the keys of runs made before layouts existed
        del model_settings["head_layout"]
    settings = {"task": {k: v for k, v in task.to_config().items() if k != "next_tokens"},
                "model": model_settings, "seed": seed, "train": {k: v for k, v in asdict(cfg).items() if k != "device"}}
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def train_all(task: SequenceTask, models: list[AoTModelConfig], seeds: list[int], cfg: AoTTrainConfig,
              out: Path, stack_size: int, cells: Cells, executor, progress: bool) -> dict[tuple, dict]:
    """Train every (model, seed) in stacks of up to `stack_size` models of similar shape, one
    cell per stack (recorded stacks are skipped). Returns {(model, seed): record}.

    Similar shapes share a stack (a stack costs its largest size along every axis): one bucket
    per (seed, head layout, attention-only or not, d), sorted by H d_h and m, cut into stacks. The stacks
    depend only on the sweep's settings, so a resumed sweep trains the same stacks as an
    uninterrupted one, and adding a seed adds stacks without touching the others."""
    runs = sorted({(m, s) for m in models for s in seeds},
                  key=lambda r: (r[0].d_mlp > 0, r[0].d_model, r[0].n_heads * r[0].d_head, r[0].d_mlp, r[0].name, r[1]))
    buckets: dict[tuple, list] = {}
    for r in runs:
        buckets.setdefault((r[1], r[0].head_layout, r[0].d_mlp > 0, r[0].d_model), []).append(r)
    stacks = [b[i:i + stack_size] for b in buckets.values() for i in range(0, len(b), stack_size)]
    jobs = []
    for stack in stacks:
        keys = [_run_key(task, m, s, cfg) for m, s in stack]
        name = hashlib.sha1("".join(keys).encode()).hexdigest()[:12]
        first, seed = stack[0]
        jobs.append(one(Cell(f"{task.kind}_seed{seed}_{first.head_layout}_d{first.d_model}_{name}", train_stack,
                             (task, stack, cfg, out.resolve()))))
    done = {}
    for result in run_jobs(jobs, cells, executor, desc=f"{task.kind} stacks", total=len(jobs), progress=progress):
        done.update((record["key"], record) for record in result["runs"])
    return {(m, s): done[_run_key(task, m, s, cfg)] for m, s in runs}


def train_stack(task: SequenceTask, stack: list[tuple[AoTModelConfig, int]], cfg: AoTTrainConfig, out: Path) -> dict:
    """One cell: the (model, seed) runs of `stack` trained together, each saved as a checkpoint
    under out/checkpoints/; their records (accuracy, loss, checkpoint path relative to out)."""
    records = []
    for (model, seed), trained in zip(stack, train_aot(task, stack, cfg, progress=False)):
        key = _run_key(task, model, seed, cfg)
        ckpt = out / "checkpoints" / task.kind / f"{model.name}_seed{seed}_{key[:6]}"
        trained.save(ckpt)
        records.append({"key": key, "model": asdict(model), "seed": seed, "accuracy": trained.accuracy,
                        "loss": trained.loss, "batch_accuracy": trained.training["batch_accuracy"],
                        "seconds": trained.metrics[-1]["seconds"], "checkpoint": str(ckpt.relative_to(out))})
    return {"runs": records}


def runs_frame(task: AssociationTask, sweep_models: dict, results: dict, seeds: list[int]) -> pd.DataFrame:
    rows = []
    for sweep, models in sweep_models.items():
        for model in models:
            for seed in seeds:
                r = results[(model, seed)]
                rows.append({"head_layout": model.head_layout, "sweep": sweep,
                             "model_type": "attention-only" if model.attn_only else "one head + MLP",
                             "d_model": model.d_model, "n_heads": model.n_heads, "d_head": model.d_head,
                             "d_mlp": model.d_mlp, "seed": seed, "parameters": model.parameters(task),
                             "accuracy": r["accuracy"], "batch_accuracy": r.get("batch_accuracy", float("nan")),
                             "loss": r["loss"],
                             "associations_memorised": r["accuracy"] * task.n_sequences,
                             "lower_bound": lower_bound(model.n_heads, model.d_head, model.d_model,
                                                        task.n_tokens, task.n_sequences),
                             "checkpoint": r["checkpoint"]})
    return pd.DataFrame(rows)


def capacity_frame(runs: pd.DataFrame) -> pd.DataFrame:
    keys = ["head_layout", "sweep", "model_type", "d_model", "n_heads", "d_head", "d_mlp", "parameters", "lower_bound"]
    frame = runs.groupby(keys, sort=False).agg(accuracy=("accuracy", "mean"), accuracy_std=("accuracy", "std"),
                                               batch_accuracy=("batch_accuracy", "mean"),
                                               loss=("loss", "mean"), seeds=("seed", "count")).reset_index()
    frame["above_lower_bound"] = frame["accuracy"] > frame["lower_bound"]
    return frame


# --------------------------------------------------------------------------- instruments
def instrument(out: Path, runs: pd.DataFrame, task: AssociationTask, device: str, progress: bool):
    """head_roles on every attention-only model of the heads sweep (first seed, every head
    layout), and the key-token table of the largest one of the first layout."""
    from tqdm.auto import tqdm

    chosen = runs[(runs.sweep == "heads") & (runs.seed == runs.seed.min())]
    largest = chosen[chosen.head_layout == chosen.head_layout.iloc[0]].n_heads.idxmax()
    frames, table = [], None
    for index, row in tqdm(list(chosen.iterrows()), desc="head roles", disable=not progress):
        model, _ = load(out / row.checkpoint, device)
        run = sequences_run(model, task)
        frame = head_roles(model, task, run=run)
        frames.append(frame.assign(head_layout=row.head_layout, n_heads=row.n_heads, d_head=row.d_head,
                                   d_model=row.d_model, seed=row.seed))
        if index == largest:
            table = key_token_table(model, task, run=run)
    return pd.concat(frames, ignore_index=True), table


# --------------------------------------------------------------------------- figures
LAYOUT_STYLE = {"standard": ("C0", "o"), "dana": ("C1", "^")}


def figure(capacity: pd.DataFrame, fits: dict, task: AssociationTask, settings: AotSweep, path: Path) -> None:
    """One panel per sweep (the paper's Figures 1a, 1b, 2a, 3 and, with --equal-dims, 2b),
    every head layout in its own colour, the lower bound of Corollary 2 dashed red."""
    fig, axes = subplots(2, 3, figsize=(16, 8.5))
    chance = 1 / task.n_tokens
    panels = [("heads", "n_heads", f"H (d_h = {settings.d_head}, d = {settings.d_model})", axes[0, 0]),
              ("d_head", "d_head", f"d_h (H = {settings.fixed_heads}, d = {settings.d_model})", axes[0, 1]),
              ("d_model", "d_model", f"d (H = {settings.fixed_heads}, d_h = {settings.d_head})", axes[0, 2])]
    for sweep, x, label, ax in panels:
        if capacity.loc[capacity.sweep == sweep, x].nunique() < 2:  # a single point is no sweep
            ax.set_visible(False)
            continue
        for layout, f in fits.items():
            rows = capacity[(capacity.sweep == sweep) & (capacity.head_layout == layout)].sort_values(x)
            color, marker = LAYOUT_STYLE[layout]
            ax.errorbar(rows[x], rows.accuracy, yerr=rows.accuracy_std.fillna(0), fmt=marker, color=color,
                        label=f"{layout} layout (mean over seeds)")
            grid = np.linspace(rows[x].min(), rows[x].max(), 100)
            if sweep == "heads" and "fit_H" in f:
                ax.plot(grid, f["fit_H"]["intercept"] + f["fit_H"]["slope"] * grid, color=color, lw=1,
                        label=f"linear fit, {f['fit_H']['slope']:.4f}/head, R$^2$ = {f['fit_H']['r2']:.3f}")
            if sweep == "d_head" and "fit_dh" in f:
                g = f["fit_dh"]
                ax.plot(grid, g["intercept"] + g["coefficient"] * grid ** g["exponent"], color=color, lw=1,
                        label=f"fit a + b d_h^k, k = {g['exponent']:.2f}")
        rows = capacity[capacity.sweep == sweep].drop_duplicates(x).sort_values(x)
        ax.plot(rows[x], rows.lower_bound, "s--", color="C3", ms=4, label="lower bound (Corollary 2)")
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance 1/N")
        ax.set(xlabel=label, ylabel="accuracy (share of T_0 associations)")
        ax.legend(fontsize=7)
    ax = axes[1, 0]
    for layout in fits:
        color, marker = LAYOUT_STYLE[layout]
        for kind, style in (("attention-only", "-"), ("one head + MLP", ":")):
            rows = capacity[(capacity.head_layout == layout) & (capacity.model_type == kind)
                            & capacity.sweep.isin(["heads", "mlp"])]
            rows = rows.drop_duplicates("parameters").sort_values("parameters")
            if not rows.empty:
                ax.errorbar(rows.parameters, rows.accuracy, yerr=rows.accuracy_std.fillna(0), fmt=marker + style,
                            color=color, mfc="none" if kind != "attention-only" else color, label=f"{layout}: {kind}")
    ax.axhline(chance, color="grey", lw=0.8, ls=":")
    ax.set(xlabel=f"trainable parameters (d = {settings.d_model}, d_h = {settings.d_head})", ylabel="accuracy")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    for layout, f in fits.items():
        if "d_equal_slopes" in f:
            color, marker = LAYOUT_STYLE[layout]
            slopes = pd.DataFrame(f["d_equal_slopes"])
            label = f"{layout} layout" + (f", slope ~ d^{f['fit_d_equal_exponent']:.2f}"
                                          if "fit_d_equal_exponent" in f else "")
            ax.plot(slopes.d, slopes.slope, marker + "-", color=color, label=label)
    if ax.lines:
        ax.set(xlabel="d = d_h", ylabel="accuracy per head (slope before saturation)", yscale="log", xscale="log")
        ax.legend(fontsize=7)
    else:
        ax.set_visible(False)
    axes[1, 2].set_visible(False)
    fig.suptitle(f"Memorisation by one-layer attention-only transformers: {task}", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path)


def roles_figure(heads: pd.DataFrame, table: pd.DataFrame | None, path: Path) -> None:
    fig, axes = subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    ax = axes[0]
    points = ax.scatter(heads.mass_pos0, heads.token_dependence, c=heads.accuracy_drop, cmap="viridis", s=14)
    fig.colorbar(points, ax=ax, label="accuracy drop when mean-ablated")
    ax.set(xlabel="mean attention on position 0", ylabel="token dependence (0 = position head)",
           title="Every head of the heads sweep")
    if table is not None:
        image = axes[1].imshow(table.to_numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
        axes[1].set(xlabel="token at position 0", ylabel="head",
                    title=f"Largest model ({table.shape[0]} heads): attention on position 0 by its token")
        fig.colorbar(image, ax=axes[1], label="attention mass")
    fig.tight_layout()
    save_figure(fig, path)


# --------------------------------------------------------------------------- the analysis
@dataclass
class Trained:
    """Every sweep trained: {(model, seed): record} on the association task, and on the
    distribution task (None without --distribution-heads)."""

    association: dict
    distribution: dict | None


@dataclass
class AotCapacity:
    """The tables and summary.json of an attention-only capacity sweep."""

    runs: pd.DataFrame  # runs.csv: one row per model and seed
    capacity: pd.DataFrame  # capacity.csv: seed means
    distribution: pd.DataFrame | None  # distribution.csv
    heads: pd.DataFrame | None  # heads.csv: the role of every head of the heads sweep
    head_tokens: pd.DataFrame | None  # head_tokens.csv: the largest model's attention by key token
    summary: dict


def train_sweeps(sweep: AotSweep, cfg: AoTTrainConfig, out: Path, cells: Cells, executor: ExecutorSettings,
                 progress: bool = True) -> Trained:
    """Train every model of every sweep, each seed (the stacks recorded in out/cells/, the
    models saved in out/checkpoints/)."""
    models = sorted({m for some in sweep.sweep_models().values() for m in some}, key=lambda m: m.name)
    distribution_models = [AoTModelConfig(sweep.d_model, h, sweep.d_head, head_layout=layout)
                           for layout in sweep.layouts for h in sweep.distribution_heads]
    seeds = list(sweep.seeds)
    with open_executor(executor) as running:
        association = train_all(sweep.task(), models, seeds, cfg, out, sweep.stack, cells, running, progress)
        distribution = train_all(sweep.distribution_task(), distribution_models, seeds, cfg, out, sweep.stack, cells,
                                 running, progress) if distribution_models else None
    return Trained(association, distribution)


def tables(trained: Trained, sweep: AotSweep) -> AotCapacity:
    """runs.csv and capacity.csv, the fits of each head layout, the distribution task's KL."""
    task = sweep.task()
    runs = runs_frame(task, sweep.sweep_models(), trained.association, list(sweep.seeds))
    capacity = capacity_frame(runs)
    fits = {layout: layout_fits(capacity[capacity.head_layout == layout], task, sweep) for layout in sweep.layouts}
    if runs.seed.nunique() > 1:  # each seed fitted alone: the spread behind the means' fits
        for layout in sweep.layouts:
            fits[layout]["by_seed"] = {str(seed): headline(layout_fits(capacity_frame(rows), task, sweep))
                                       for seed, rows in runs[runs.head_layout == layout].groupby("seed")}
    summary = {"task": repr(task), "n_sequences": task.n_sequences, "layouts": fits}
    distribution = None
    if trained.distribution is not None:
        distribution, summary["distribution"] = distribution_tables(sweep.distribution_task(), trained.distribution,
                                                                    sweep.d_model)
    return AotCapacity(runs, capacity, distribution, None, None, summary)


def add_head_roles(result: AotCapacity, out: Path, task: AssociationTask, device: str, progress: bool = True) -> None:
    """The heads sweep's head roles (instrument) in `result`: heads, head_tokens, summary."""
    heads, table = instrument(out, result.runs, task, device, progress)
    result.heads, result.head_tokens = heads, table
    result.summary["head_roles"] = {
        "heads": len(heads), "position_heads": int((heads.role == "position").sum()),
        "token_heads": int((heads.role == "token").sum()),
        "mean_token_dependence": float(heads.token_dependence.mean()),
        "mean_var_key_token": float(heads.var_key_token.mean()),
        "mean_var_query_token": float(heads.var_query_token.mean()),
        "mean_var_interaction": float(heads.var_interaction.mean()), "mean_mass_pos0": float(heads.mass_pos0.mean())}


def write(result: AotCapacity, sweep: AotSweep, out: Path) -> None:
    """The tables, summary.json, capacity.png and (with head roles) head_roles.png in `out`."""
    if result.distribution is not None:
        write_csv(out / "distribution.csv", result.distribution)
    write_csv(out / "runs.csv", result.runs)
    write_csv(out / "capacity.csv", result.capacity)
    figure(result.capacity, result.summary["layouts"], sweep.task(), sweep, out / "capacity.png")
    if result.heads is not None:
        write_csv(out / "heads.csv", result.heads)
        if result.head_tokens is not None:
            write_csv(out / "head_tokens.csv", result.head_tokens.reset_index())
        roles_figure(result.heads, result.head_tokens, out / "head_roles.png")
    write_summary(out / "summary.json", result.summary)


# --------------------------------------------------------------------------- CLI
def parser():
    p = cli.parser("python -m analyses.aot_capacity", __doc__)
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
    # every setting is in the cell keys (a sweep can grow) but the torch threads
    cells = Cells(out, {"analysis": "aot_capacity"}, executor.torch_threads)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.quiet

    result = tables(train_sweeps(sweep, cfg, out, cells, executor, progress), sweep)
    if not sweep.skip_instruments and (result.runs.sweep == "heads").any():
        add_head_roles(result, out, sweep.task(), args.device, progress)
    recorded = {"out": str(out), **asdict(sweep), "head_layout": sweep.layouts,
                **{k: v for k, v in asdict(cfg).items() if k != "device"}, "device": args.device, "quiet": args.quiet,
                **asdict(executor)}
    result.summary["settings"] = {k: list(v) if isinstance(v, tuple) else v for k, v in recorded.items()}
    result.summary["train"] = {**asdict(cfg), "steps": cfg.steps}
    result.summary["cells_computed"] = cells.computed
    result.summary["seconds"] = round(time.perf_counter() - start, 1)
    write(result, sweep, out)
    print(report(result.summary, result.capacity, out))
    return 0


def layout_fits(capacity: pd.DataFrame, task: AssociationTask, sweep: AotSweep) -> dict:
    """The fits and comparisons of one head layout's rows of capacity.csv."""
    fits = {}
    heads_rows = capacity[capacity.sweep == "heads"]
    if len(heads_rows) >= 2:
        fits["fit_H"] = fit_linear(heads_rows.n_heads.to_numpy(float), heads_rows.accuracy.to_numpy(float))
        fits["fit_H_r2"] = fits["fit_H"]["r2"]
        slope = per_head_slopes(heads_rows).slope
        if len(slope):  # associations per head (before saturation), per head dimension
            fits["per_head_slope"] = float(slope.iloc[0])
            fits["associations_per_head_dim"] = (float(slope.iloc[0]) * task.n_sequences / (1 - 1 / task.n_tokens)
                                                 / sweep.d_head)
    dh_rows = capacity[capacity.sweep == "d_head"]
    if len(dh_rows) >= 3:
        fits["fit_dh"] = fit_power(dh_rows.d_head.to_numpy(float), dh_rows.accuracy.to_numpy(float))
        fits["fit_dh_exponent"] = fits["fit_dh"]["exponent"]
        fits["fit_dh_quadratic"] = dict(zip(("c2", "c1", "c0"), map(float, np.polyfit(
            dh_rows.d_head.to_numpy(float), dh_rows.accuracy.to_numpy(float), 2))))
    d_rows = capacity[capacity.sweep == "d_model"]
    for side, rows in (("below", d_rows[d_rows.d_model <= sweep.d_head]),
                       ("above", d_rows[d_rows.d_model >= sweep.d_head])):
        if len(rows) >= 2:  # the paper's two linear pieces of Figure 2a, meeting at d = d_h
            fits[f"fit_d_{side}_dh"] = fit_linear(rows.d_model.to_numpy(float), rows.accuracy.to_numpy(float))
    slopes = per_head_slopes(capacity[capacity.sweep == "d_equal"])
    if len(slopes):
        fits["d_equal_slopes"] = slopes.to_dict("records")
        if len(slopes) >= 2 and (slopes.slope > 0).all():  # slope ~ d^k, least squares in log-log
            fits["fit_d_equal_exponent"] = float(np.polyfit(np.log(slopes.d), np.log(slopes.slope), 1)[0])
    fits["above_lower_bound_everywhere"] = bool(capacity.above_lower_bound.all())
    fits["min_margin_over_lower_bound"] = float((capacity.accuracy - capacity.lower_bound).min())
    fits["mlp_vs_attention_only"] = _matched(capacity)
    return fits


def headline(fits: dict) -> dict:
    """The scalar results of layout_fits: per-head slope (accuracy per head), the d_h exponent,
    the slopes of Figure 2a below and above d = d_h (accuracy per dimension), the d = d_h
    slope's exponent, the smallest margin over the lower bound (accuracy)."""
    values = {"slope_H": fits.get("fit_H", {}).get("slope"), "per_head_slope": fits.get("per_head_slope"),
              "fit_dh_exponent": fits.get("fit_dh_exponent"),
              "slope_d_below_dh": fits.get("fit_d_below_dh", {}).get("slope"),
              "slope_d_above_dh": fits.get("fit_d_above_dh", {}).get("slope"),
              "fit_d_equal_exponent": fits.get("fit_d_equal_exponent"),
              "min_margin_over_lower_bound": fits.get("min_margin_over_lower_bound")}
    return {name: value for name, value in values.items() if value is not None}


def _matched(capacity: pd.DataFrame) -> list[dict]:
    """Attention-only vs one-head-plus-MLP accuracy at equal parameter counts."""
    aot = capacity[(capacity.sweep == "heads")].set_index("parameters").accuracy
    mlp = capacity[(capacity.sweep == "mlp")].set_index("parameters").accuracy
    return [{"parameters": int(p), "attention_only": float(aot[p]), "mlp": float(mlp[p])}
            for p in mlp.index if p in aot.index]


def distribution_tables(task: DistributionTask, results: dict, d_model: int) -> tuple[pd.DataFrame, dict]:
    """KL of attention-only models on the distribution task vs the rank-d floor: one row per
    (model, seed), and the summary."""
    floor = rank_d_kl_floor(task.log_targets, d_model)
    rows = [{"head_layout": m.head_layout, "n_heads": m.n_heads, "d_head": m.d_head, "d_model": m.d_model, "seed": s,
             "kl": r["loss"], "kl_floor": floor, "kl_gap": r["loss"] - floor, "top_token_accuracy": r["accuracy"],
             "checkpoint": r["checkpoint"]} for (m, s), r in results.items()]
    frame = pd.DataFrame(rows).sort_values(["head_layout", "n_heads", "seed"])
    uniform_kl = float((task.log_targets.exp() * (task.log_targets + np.log(task.n_tokens))).sum(-1).mean())
    by_model = frame.groupby(["head_layout", "n_heads"]).kl.mean()
    return frame, {"task": repr(task), "kl_floor_rank_d": floor, "kl_of_uniform": uniform_kl,
                   "kl_by_model": {f"{layout} H={h}": float(v) for (layout, h), v in by_model.items()}}


def _seeds_alone(fits: dict, name: str, fmt: str) -> str:
    """"; seeds alone: v0, v1": a headline value of each seed fitted alone ("" with one seed)."""
    values = [format(f[name], fmt) for f in fits.get("by_seed", {}).values() if name in f]
    return f"; seeds alone: {', '.join(values)}" if values else ""


def report(summary: dict, capacity: pd.DataFrame, out: Path) -> str:
    lines = [f"task      {summary['task']}"]
    for layout, fits in summary["layouts"].items():
        lines.append(f"-- {layout} head layout")
        rows_of = capacity[capacity.head_layout == layout]
        for sweep, x in (("heads", "n_heads"), ("d_head", "d_head"), ("d_model", "d_model"), ("mlp", "d_mlp")):
            rows = rows_of[rows_of.sweep == sweep].sort_values(x)
            if not rows.empty:
                lines.append(f"{sweep:<9} "
                             + "  ".join(f"{x}={getattr(r, x)}:{r.accuracy:.3f}" for r in rows.itertuples()))
        if "fit_H" in fits:
            lines.append(f"fit       accuracy linear in H: R^2 = {fits['fit_H_r2']:.3f}; "
                         f"slope {fits['fit_H']['slope']:.4f} per head" + _seeds_alone(fits, "slope_H", ".4f"))
        if "fit_dh" in fits:
            lines.append(f"fit       accuracy = a + b d_h^k: k = {fits['fit_dh_exponent']:.2f} "
                         f"(R^2 {fits['fit_dh']['r2']:.3f})" + _seeds_alone(fits, "fit_dh_exponent", ".2f"))
        for side in ("below", "above"):
            if f"fit_d_{side}_dh" in fits:
                lines.append(f"fit       accuracy per unit of d {side} d_h: {fits[f'fit_d_{side}_dh']['slope']:.4f}"
                             + _seeds_alone(fits, f"slope_d_{side}_dh", ".4f"))
        if "d_equal_slopes" in fits:
            lines.append("d = d_h   per-head slope "
                         + "  ".join(f"d={r['d']}:{r['slope']:.4f}" for r in fits["d_equal_slopes"])
                         + (f"; ~ d^{fits['fit_d_equal_exponent']:.2f}" if "fit_d_equal_exponent" in fits else "")
                         + _seeds_alone(fits, "fit_d_equal_exponent", ".2f"))
        lines.append(f"bound     above the lower bound everywhere: {fits['above_lower_bound_everywhere']} "
                     f"(smallest margin {fits['min_margin_over_lower_bound']:+.3f})")
    if "distribution" in summary:
        d = summary["distribution"]
        lines.append(f"KL        floor of rank d: {d['kl_floor_rank_d']:.4f} nats; trained: "
                     + ", ".join(f"{k}: {v:.4f}" for k, v in d["kl_by_model"].items()))
    if "head_roles" in summary:
        r = summary["head_roles"]
        lines.append(f"heads     {r['position_heads']} position heads, {r['token_heads']} token heads of {r['heads']}; "
                     f"variance of the attention explained by the key token {r['mean_var_key_token']:.2f}, "
                     f"the query token {r['mean_var_query_token']:.2f}, "
                     f"their interaction {r['mean_var_interaction']:.2f}")
    lines.append(f"wrote     {out}/ in {summary['seconds']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    cli.run_cli(main)
