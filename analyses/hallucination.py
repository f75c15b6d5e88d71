"""python -m analyses.hallucination CKPT/ : the hallucination phase over training.

For every weight snapshot in CKPT/snapshots/ it measures, on held-out prompts and through
the model's hooks: the loss, the accuracy, the relation-only and subject-only losses, the
hallucination rate and the KL divergence from the relation-only predictor p(a | r) (paper
section 5). It finds the phase where the model answers from the relation alone (loss at
H(a | r) = log D for uniform facts, relation-only loss near zero, subject-only loss high)
and, on a log-spaced subset of snapshots, the share of facts the attention path and the
MLP path recall on their own: when does each store fill up? Writes metrics.csv,
summary.json, hallucination.png and storage.png to DIR (default CKPT/analysis/hallucination).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from analyses import plots
from analyses.output import write_csv, write_summary
from models.bridge import build_bridge, load_weights, resolve_device
from models.checkpoint import CheckpointError, load_checkpoint, snapshot_steps
from models.cli import run_cli
from probe.ablation import ablation_hooks
from probe.accuracy import model_device, per_fact_accuracy
from probe.hallucination import conditional_entropy, recall_metrics
from probe.hooks import clean_run, has_mlp, last_position_logits
from probe.phases import PhaseRule, hallucination_phase
from probe.storage import StorageRule
from tasks.factual_recall import FactualRecallTask


def storage_shares(model, task: FactualRecallTask, contexts: int = 4, seed: int = 0,
                   known: float = StorageRule.known) -> dict[str, float]:
    """Shares of facts (0..1) that the attention path alone (MLP output mean-ablated) and the
    MLP path alone (attention's own write mean-ablated) recall in >= `known` of their
    contexts; the MLP share is NaN for an attention-only model. Same paths as locate_facts."""
    clean_run.cache_clear()  # the weights change between snapshots; the cache is keyed by model
    hooks = ablation_hooks(model, task, contexts, seed)
    attention = per_fact_accuracy(model, task, contexts, seed, tuple(hooks.get("mean_ablate_mlp", ())))
    shares = {"attention_recall_share": float((attention["accuracy"] >= known).mean()), "mlp_recall_share": math.nan}
    if has_mlp(model):
        mlp = per_fact_accuracy(model, task, contexts, seed, tuple(hooks["mlp_path"]))
        shares["mlp_recall_share"] = float((mlp["accuracy"] >= known).mean())
    clean_run.cache_clear()
    return shares


def log_spaced(steps: list[int], n: int) -> list[int]:
    """About n of `steps`, evenly spaced in index (snapshots are already log-spaced), the
    first and the last included."""
    if n <= 0:
        return []
    index = np.unique(np.round(np.linspace(0, len(steps) - 1, min(n, len(steps)))).astype(int))
    return [steps[i] for i in index]


def measure(ckpt: str | Path, device: str = "auto", eval_size: int = 2048, seed: int = 0,
            storage_points: int = 12, contexts: int = 4, progress: bool = True) -> tuple[pd.DataFrame, FactualRecallTask]:
    """One row of metrics per snapshot of `ckpt` (the storage shares on a log-spaced subset)."""
    steps = snapshot_steps(ckpt)
    if not steps:
        raise CheckpointError(f"{ckpt}: no snapshots/ to follow over training; train with "
                              "--snapshots-per-octave N (N >= 1) to write them.")
    first = load_checkpoint(ckpt, steps[0], kind="factual_recall")
    task = first.task
    model = build_bridge(first.model, first.weights, resolve_device(device))
    held_out = task.eval_set(eval_size, seed, model_device(model))
    with_storage = set(log_spaced(steps, storage_points))
    rows = []
    for step in tqdm(steps, desc="snapshots", unit="snapshot", disable=not progress):
        load_weights(model, load_checkpoint(ckpt, step).weights)
        row = {"step": step, **recall_metrics(last_position_logits(model, held_out.tokens), held_out, task)}
        if step in with_storage:
            row.update(storage_shares(model, task, contexts, seed))
        rows.append(row)
    return pd.DataFrame(rows), task


def summarise(metrics: pd.DataFrame, task: FactualRecallTask, rule: PhaseRule) -> dict:
    """summary.json: the levels, the phase (None when there is none) and the last snapshot."""
    level = conditional_entropy(task)
    phase = hallucination_phase(metrics["step"].tolist(), metrics["loss"].tolist(),
                                metrics["relation_only_loss"].tolist(), metrics["subject_only_loss"].tolist(),
                                level, rule)
    storage = metrics.dropna(subset=["attention_recall_share"]) if "attention_recall_share" in metrics else metrics.iloc[:0]
    return {
        "task": repr(task),
        "log_D": math.log(task.answers_per_relation),
        "log_answers": math.log(task.d_vocab_out),
        "conditional_entropy": level,
        "phase": phase.to_dict() if phase else None,
        "rule": asdict(rule),
        "n_snapshots": len(metrics),
        "final": {k: float(v) for k, v in metrics.iloc[-1].items()},
        "storage_fills": {name: _first_step_at(storage, f"{name}_recall_share", 0.5) for name in ("attention", "mlp")},
    }


def _first_step_at(frame: pd.DataFrame, column: str, share: float) -> int | None:
    """The step from which `column` stays >= `share` to the end (None if it does not end
    there, or was not measured)."""
    if column not in frame or frame[column].isna().all():
        return None
    below = (frame[column] < share).to_numpy()
    if below[-1]:
        return None
    last_below = np.flatnonzero(below)
    return int(frame["step"].iloc[last_below[-1] + 1 if len(last_below) else 0])


def report(summary: dict, ckpt: str, out: Path) -> str:
    final, phase = summary["final"], summary["phase"]
    lines = [f"{ckpt}: {summary['n_snapshots']} snapshots, log D = {summary['log_D']:.3f}, "
             f"H(a|r) = {summary['conditional_entropy']:.3f} nats",
             f"final     step {int(final['step'])}: loss {final['loss']:.4f}, accuracy {final['accuracy']:.3f}, "
             f"relation-only {final['relation_only_loss']:.4f}, subject-only {final['subject_only_loss']:.4f}"]
    if phase is None:
        rule = summary["rule"]
        lines.append(f"no hallucination phase: no {rule['min_snapshots']}+ snapshots over {rule['min_octaves']:g}+ "
                     f"octave(s) with the loss within {100 * rule['level_tolerance']:g}% of H(a|r), relation-only "
                     f"loss <= {rule['relation_only_max']:g} and subject-only loss >= {rule['subject_only_min']:g}")
    else:
        left = f"left at step {phase['exit_step']}" if phase["exit_step"] is not None else "training ended in it"
        lines.append(f"hallucination phase: steps {phase['start_step']}-{phase['end_step']} "
                     f"({phase['length_octaves']:.2f} octaves, {left}); plateau loss {phase['plateau_loss']:.3f}, "
                     f"relation-only {phase['relation_only_loss']:.4f}, subject-only {phase['subject_only_loss']:.3f}")
    fills = summary["storage_fills"]
    lines.append("half the facts or more recalled by the attention path alone from step "
                 f"{fills['attention'] if fills['attention'] is not None else 'never'}, by the MLP path from step "
                 f"{fills['mlp'] if fills['mlp'] is not None else 'never (or no MLP)'}")
    lines.append(f"wrote {out}/ (metrics.csv, summary.json, hallucination.png, storage.png)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analyses.hallucination", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt", help="checkpoint directory with snapshots/ (docs/checkpoint_format.md)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default CKPT/analysis/hallucination)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | cuda:N")
    p.add_argument("--eval-size", type=int, default=2048, help="held-out prompts per snapshot (default 2048)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out prompts (default 0)")
    p.add_argument("--storage-points", type=int, default=12,
                   help="snapshots (log-spaced) at which to measure attention/MLP storage; 0 = none (default 12)")
    p.add_argument("--contexts", type=int, default=4, help="prompts per fact for the storage measurement (default 4)")
    rule = p.add_argument_group("phase rule")
    for f in fields(PhaseRule):
        rule.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                          help=f"(default {f.default})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def analyse(ckpt: str | Path, out: Path, device: str = "auto", eval_size: int = 2048, seed: int = 0,
            storage_points: int = 12, contexts: int = 4, rule: PhaseRule = PhaseRule(), progress: bool = True) -> dict:
    """Measure every snapshot, find the phase, write metrics.csv, summary.json and the two
    figures to `out`; returns the summary."""
    metrics, task = measure(ckpt, device, eval_size, seed, storage_points, contexts, progress)
    summary = {"checkpoint": str(ckpt), **summarise(metrics, task, rule)}
    write_csv(out / "metrics.csv", metrics)
    write_summary(out / "summary.json", summary)
    plots.hallucination_curves(metrics, summary, out / "hallucination.png")
    plots.storage_over_time(metrics, summary, out / "storage.png")
    return summary


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.eval_size < 1 or args.contexts < 1 or args.storage_points < 0:
        raise ValueError("--eval-size and --contexts must be >= 1, --storage-points >= 0.")
    rule = PhaseRule(**{f.name: getattr(args, f.name) for f in fields(PhaseRule)})
    out = args.out or Path(args.ckpt) / "analysis" / "hallucination"
    summary = analyse(args.ckpt, out, args.device, args.eval_size, args.seed, args.storage_points,
                      args.contexts, rule, progress=not args.quiet)
    print(report(summary, args.ckpt, out))
    return 0


if __name__ == "__main__":
    run_cli(main)
