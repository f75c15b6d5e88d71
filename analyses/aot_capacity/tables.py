"""The tables of a sweep: runs.csv, capacity.csv, the fits of each head layout,
distribution.csv, and the head roles of the heads sweep (heads.csv, head_tokens.csv)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.aot_capacity.fits import headline, layout_fits
from analyses.aot_capacity.sweep import AotSweep, Trained, lower_bound
from models import load
from probe.head_roles import head_roles, key_token_table, sequences_run
from probe.kl_floor import rank_d_kl_floor
from tasks.association import AssociationTask, DistributionTask


@dataclass
class AotCapacity:
    """The tables and summary.json of an attention-only capacity sweep."""

    runs: pd.DataFrame  # runs.csv: one row per model and seed
    capacity: pd.DataFrame  # capacity.csv: seed means
    distribution: pd.DataFrame | None  # distribution.csv
    heads: pd.DataFrame | None  # heads.csv: the role of every head of the heads sweep
    head_tokens: pd.DataFrame | None  # head_tokens.csv: the largest model's attention by key token
    summary: dict


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


def instrument(out: Path, runs: pd.DataFrame, task: AssociationTask, device: str, progress: bool):
    """head_roles on every attention-only model of the heads sweep (first seed, every head
    layout), and the key-token table of the largest one of the first layout."""
    from models.training.progress import progress_bar

    chosen = runs[(runs.sweep == "heads") & (runs.seed == runs.seed.min())]
    largest = chosen[chosen.head_layout == chosen.head_layout.iloc[0]].n_heads.idxmax()
    frames, table = [], None
    for index, row in progress_bar(list(chosen.iterrows()), desc="head roles", disable=not progress):
        model, _ = load(out / row.checkpoint, device)
        run = sequences_run(model, task)
        frame = head_roles(model, task, run=run)
        frames.append(frame.assign(head_layout=row.head_layout, n_heads=row.n_heads, d_head=row.d_head,
                                   d_model=row.d_model, seed=row.seed))
        if index == largest:
            table = key_token_table(model, task, run=run)
    return pd.concat(frames, ignore_index=True), table
