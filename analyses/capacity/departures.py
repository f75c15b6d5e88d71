"""The one-at-a-time study: which of the authors' departures from the standard model
(models/recall/parameterisation.py) changes how many facts a shape stores. Each variant (standard,
standard + one departure, authors, authors - one departure) is trained at one shape, size and
S = R exactly as a Figure 4 left probe, and the state it starts from is measured through the
TransformerLens model's hooks."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch

from analyses.capacity.common import TARGET
from analyses.capacity.transformer import TransformerSweep, transformer_row
from analyses.sweeps import cli
from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import ExecutorSettings, open_executor
from analyses.sweeps.output import save_figure, subplots, write_csv, write_summary
from models.bridge import build_bridge, resolve_device
from models.cli import setting
from models.recall import parameterisation as param
from models.recall.config import ModelConfig
from models.recall.weights import init_weights


@dataclass(frozen=True)
class DepartureStudy:
    """The shape, size and S = R at which the variants are compared."""

    shape: tuple[float, ...] = setting((2.0, 2.0, 8.0), "ALPHA,BETA,H of the shape studied", repeats=True)
    d: int = setting(32, "its embedding dimension d")
    sizes: tuple[int, ...] = setting((30,), "S = R trained: sizes where the standard and the authors' models "
                                            "disagree (at (2, 2, 8), d = 32, S* is 34 for the authors', 25 for the "
                                            "standard)")
    variants: tuple[str, ...] = setting(tuple(param.variants()),
                                        "the parameterisations trained, in --parameterisation's forms")
    prompts: int = setting(1024, "prompts the initial state is measured on")

    def __post_init__(self):
        cli.require(self, "shape", len(self.shape) == 3, "ALPHA,BETA,H")
        cli.at_least(self, d=1, sizes=2, prompts=1)
        cli.require(self, "variants", len(set(self.variants)) == len(self.variants), "without repeats")
        for variant in self.variants:
            ModelConfig(parameterisation=variant).validate()

    def training(self, sweep: TransformerSweep, variant: str) -> TransformerSweep:
        """The Figure 4 left training of `sweep`, for this shape and size, in `variant`."""
        return replace(sweep, shapes=(self.shape,), d=(self.d,), parameterisation=variant, embedding="auto")


def initial_state(model, tokens: torch.Tensor) -> dict:
    """The state a model starts from, read at the last position of `tokens` through hooks:
    the fraction of MLP units off on every prompt (`dead_units`) and on on every prompt
    (`always_on_units`), the standard deviation of the attention scores q.k/sqrt(d_h) over the
    keys (mean over heads and prompts, `score_std`), and the mean norm of the MLP's input, the
    residual after attention (`mlp_input_norm`)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    pre = cache["blocks.0.mlp.hook_pre"][:, -1]  # [batch, m]
    q = cache["blocks.0.attn.hook_q"][:, -1]  # [batch, head, d_h]
    k = cache["blocks.0.attn.hook_k"]  # [batch, key, head, d_h]
    # from q and k: the bridge's hook_attn_scores fires after the softmax (docs/checkpoint_format.md)
    scores = torch.einsum("bhe,bkhe->bhk", q, k) / q.shape[-1] ** 0.5  # [batch, head, key]
    mid = cache["blocks.0.hook_resid_mid"][:, -1]  # [batch, d]
    on = pre > 0
    return {"dead_units": on.any(0).logical_not().float().mean().item(),
            "always_on_units": on.all(0).float().mean().item(),
            "score_std": scores.std(-1).mean().item(), "mlp_input_norm": mid.norm(dim=-1).mean().item()}


def departure_row(study: DepartureStudy, sweep: TransformerSweep, variant: str, S: int, device: str,
                  keep: Path | None = None) -> dict:
    """One variant trained at S = R (a Figure 4 left probe: per learning rate the best held-out
    accuracy and the evaluation curve), with the initial state of the seed's model; with
    `keep`, the trained model is saved there."""
    training = study.training(sweep, variant)
    run = training.run(study.shape, study.d, S, "cpu")
    task = run.task.build()
    model = build_bridge(run.model.checkpoint_section(task), init_weights(run.model, task, sweep.seed))
    tokens = task.sample(study.prompts, torch.Generator().manual_seed(sweep.seed)).tokens  # [prompts, T]
    return {"variant": variant, **transformer_row(study.shape, study.d, S, training, device, keep),
            **initial_state(model, tokens)}


def run_study(study: DepartureStudy, sweep: TransformerSweep, cells: Cells, executor: ExecutorSettings,
              device: str, progress: bool = True) -> list[dict]:
    """Every variant at every size, one cell each (resumable)."""
    keys = {(variant, S): f"{variant}_S{S}" for S in study.sizes for variant in study.variants}
    jobs = [one(Cell(key, departure_row, (study, sweep, variant, S, device, cells.checkpoint(key))))
            for (variant, S), key in keys.items()]
    with open_executor(executor) as running:
        return run_jobs(jobs, cells, running, desc="variants", total=len(jobs), progress=progress)


def recorded(study: DepartureStudy, sweep: TransformerSweep) -> dict:
    """What every cell shares (settings.json): the shape, the size and the training."""
    training = {k: v for k, v in sweep.recorded().items() if k not in ("analysis", "model")}
    return {"analysis": "capacity departures", "shape": list(study.shape), "d": study.d,
            "prompts": study.prompts, **training}


def departure_table(rows: list[dict]) -> pd.DataFrame:
    """One row per variant and size: its departures, whether it stores the S^2 facts (best
    held-out accuracy >= 99%), the steps it needed, the best accuracy per learning rate and
    its initial state."""
    table = pd.DataFrame([{
        "variant": r["variant"], "base": param.base(r["variant"]),
        "departures": "+".join(n for n in param.DEPARTURES if n in param.departures(r["variant"])) or "none",
        "S": r["S"], "facts": r["facts"], "stored": r["best_accuracy"] >= TARGET,
        "best_accuracy": r["best_accuracy"],
        "steps_to_target": r["steps_run"] if r["best_accuracy"] >= TARGET else None,
        **{f"best_accuracy_lr{run['lr']:g}": run["best_accuracy"] for run in r["runs"]},
        "dead_units": r["dead_units"], "always_on_units": r["always_on_units"], "score_std": r["score_std"],
        "mlp_input_norm": r["mlp_input_norm"], "parameters": r["parameters"]} for r in rows])
    return table


def verdicts(table: pd.DataFrame) -> dict:
    """Per size, the departures that decide it: those that alone make the standard model store
    the facts (or stop it), and those whose removal stops the authors' model (or lets it)."""
    out = {}
    for S, g in table.groupby("S"):
        stored = dict(zip(g["variant"], g["stored"]))
        out[int(S)] = {"standard_stores": stored.get("standard"), "authors_stores": stored.get("authors"),
                       "added_to_standard_flips": _flips(stored, "standard", "+"),
                       "removed_from_authors_flips": _flips(stored, "authors", "-")}
    return out


def _flips(stored: dict, base_name: str, sign: str) -> list[str] | None:
    """The departures whose one-step variant of `base_name` stores where the base does not, or
    the reverse (None when the base was not trained)."""
    if base_name not in stored:
        return None
    return [n for n in param.DEPARTURES
            if f"{base_name}{sign}{n}" in stored and stored[f"{base_name}{sign}{n}"] != stored[base_name]]


def departures_figure(table: pd.DataFrame, path: Path | None = None):
    """Per size, each variant's best held-out accuracy (the 99% line marked); beside it the
    fractions of MLP units dead and always on at initialisation (at the first size)."""
    sizes = sorted(table["S"].unique())
    fig, axes = subplots(1, len(sizes) + 1, figsize=(4.5 * (len(sizes) + 1), 0.32 * table["variant"].nunique() + 1.5),
                         sharey=True)
    order = list(dict.fromkeys(table["variant"]))[::-1]
    for ax, S in zip(axes, sizes):
        g = table[table["S"] == S].set_index("variant").reindex(order)
        colours = ["C1" if b == "authors" else "C0" for b in g["base"]]
        ax.barh(order, g["best_accuracy"], color=colours)
        ax.axvline(TARGET, color="k", ls="--", lw=1)
        ax.set(xlim=(max(0.0, g["best_accuracy"].min() - 0.05), 1.0), xlabel="best held-out accuracy",
               title=f"S = R = {S} ({S * S} facts)")
    g = table[table["S"] == sizes[0]].set_index("variant").reindex(order)
    axes[-1].barh(order, g["dead_units"], color="dimgray", label="dead on every prompt")
    axes[-1].barh(order, g["always_on_units"], left=g["dead_units"], color="silver", label="on for every prompt")
    axes[-1].set(xlim=(0, 1), xlabel="share of MLP units at initialisation",
                 title=f"initial state (S = R = {sizes[0]})")
    axes[-1].legend(fontsize=7, loc="lower right")
    return save_figure(fig, path)


def write_study(table: pd.DataFrame, summary: dict, out: Path) -> None:
    """departures.csv, summary.json and departures.png in `out`."""
    write_csv(out / "departures.csv", table)
    write_summary(out / "summary.json", summary)
    if len(table):
        departures_figure(table, out / "departures.png")


def study_text(table: pd.DataFrame, summary: dict) -> str:
    lines = []
    for S, verdict in summary["verdicts"].items():
        lines.append(f"S = R = {S} ({S * S} facts): standard {'stores' if verdict['standard_stores'] else 'fails'}, "
                     f"authors {'stores' if verdict['authors_stores'] else 'fails'}")
        for r in table[table["S"] == S].itertuples():
            steps = f"{r.steps_to_target:.0f} steps" if r.stored else "not stored"
            lines.append(f"  {r.variant:<26} best {r.best_accuracy:.3f}  {steps:<12} dead units {r.dead_units:.2f}  "
                         f"always on {r.always_on_units:.2f}  score std {r.score_std:.3f}")
        for family, key in (("added to standard", "added_to_standard_flips"),
                            ("taken from authors", "removed_from_authors_flips")):
            lines.append(f"  alone, {family}, change it: {', '.join(verdict[key] or []) or 'none'}")
    return "\n".join(lines)


def compare_departures(study: DepartureStudy, sweep: TransformerSweep, out: Path, executor: ExecutorSettings,
                       device: str, progress: bool = True, keep_checkpoints: bool = False) -> tuple[pd.DataFrame, dict]:
    """Compute (or read back) every cell, then the table, the verdicts and the files in `out`
    (with `keep_checkpoints`, each cell's model in out/checkpoints/)."""
    cells = Cells(out, recorded(study, sweep), executor.torch_threads, keep_checkpoints=keep_checkpoints)
    table = departure_table(run_study(study, sweep, cells, executor, device, progress))
    summary = {"settings": recorded(study, sweep), "variants": list(study.variants), "sizes": list(study.sizes),
               "departures": param.DEPARTURES, "verdicts": verdicts(table),
               "device": str(resolve_device(device)), "cells_computed": cells.computed}
    write_study(table, summary, out)
    return table, summary
