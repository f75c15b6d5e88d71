"""python -m analyses.hallucination CKPT/ : the hallucination phase over training.

For every weight snapshot in CKPT/snapshots/ it measures, on held-out prompts and through
the model's hooks: the loss, the accuracy, the relation-only and subject-only losses, the
hallucination rate and the KL divergence from the relation-only predictor p(a | r) (paper
section 5). It finds the phase where the model answers from the relation alone (loss at
H(a | r) = log D for uniform facts, relation-only loss near zero, subject-only loss high)
and, on a log-spaced subset of snapshots, the share of facts the attention path and the
MLP path recall on their own: when does each store fill up? Writes metrics.csv,
summary.json (with the content hash of the snapshots measured, snapshots_sha256),
hallucination.png and storage.png to DIR (default CKPT/analysis/hallucination; with settings
other than the defaults, a folder inside it named after them, e.g. eval-size-512). A DIR that
holds other results is refused, as is a folder inside another checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analyses import plots, recorded
from analyses.sweeps import cli
from analyses.sweeps.output import write_csv, write_summary
from models.bridge import build_bridge, load_weights, resolve_device
from models.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_config,
    read_weights,
    snapshot_path,
    snapshot_steps,
    snapshots_sha256,
)
from models.section import one_layer
from models.training.progress import progress_bar
from probe import columns
from probe.ablation import ablation_hooks
from probe.accuracy import per_fact_accuracy
from probe.hallucination import conditional_entropy, recall_metrics
from probe.hooks import has_mlp, hooked_last_logits, model_device
from probe.phases import PhaseRule, hallucination_phase
from probe.prompts import FactPrompts
from probe.storage import StorageRule
from tasks.factual_recall import FactualRecallTask


@dataclass(frozen=True)
class HallucinationSettings:
    """What is measured at each snapshot, on how many prompts."""

    eval_size: int = field(default=2048, metadata={"help": "held-out prompts per snapshot"})
    seed: int = field(default=0, metadata={"help": "seed of the held-out prompts"})
    storage_points: int = field(default=12, metadata={
        "help": "snapshots (log-spaced) at which to measure attention/MLP storage; 0 = none"})
    contexts: int = field(default=4, metadata={"help": "prompts per fact for the storage measurement"})

    def __post_init__(self):
        cli.at_least(self, eval_size=1, storage_points=0, contexts=1)


@dataclass
class Dynamics:
    """The hallucination analysis of one checkpoint's snapshots."""

    metrics: pd.DataFrame  # one row per snapshot: losses, accuracy, hallucination, storage shares
    summary: dict  # the levels, the phase, the last snapshot (summary.json)


def storage_shares(model, task: FactualRecallTask, contexts: int = 4, seed: int = 0,
                   known: float = StorageRule.known) -> dict[str, float]:
    """Shares of facts (0..1) that the attention path alone (MLP output mean-ablated) and the
    MLP path alone (attention's own write mean-ablated) recall in >= `known` of their
    contexts; the MLP share is NaN for an attention-only model. Same paths as locate_facts."""
    prompts = FactPrompts.build(model, task, contexts, seed)  # per call: the weights change between snapshots
    hooks = ablation_hooks(model, task, prompts=prompts)
    attention = per_fact_accuracy(model, task, fwd_hooks=tuple(hooks.get(columns.ablation("mean", "mlp"), ())),
                                  prompts=prompts)
    shares = {"attention_recall_share": float((attention[columns.ACCURACY] >= known).mean()),
              "mlp_recall_share": math.nan}
    if has_mlp(model):
        mlp = per_fact_accuracy(model, task, fwd_hooks=tuple(hooks[columns.path("mlp")]), prompts=prompts)
        shares["mlp_recall_share"] = float((mlp[columns.ACCURACY] >= known).mean())
    return shares


def log_spaced(steps: list[int], n: int) -> list[int]:
    """About n of `steps`, evenly spaced in index (snapshots are already log-spaced), the
    first and the last included."""
    if n <= 0:
        return []
    index = np.unique(np.round(np.linspace(0, len(steps) - 1, min(n, len(steps)))).astype(int))
    return [steps[i] for i in index]


def snapshots_to_follow(ckpt: str | Path) -> list[int]:
    """The snapshot steps of a factual-recall checkpoint; a checkpoint the tools refuse (no
    config.json, another task) is refused as they refuse it, and one without snapshots
    (a construction, or a run trained without them) says why it has none."""
    config, _ = read_config(ckpt, kind="factual_recall")
    steps = snapshot_steps(ckpt)
    if steps:
        return steps
    construction = config["training"].get("construction")
    if construction:
        raise CheckpointError(f"{ckpt}: a construction ({construction}), built rather than trained: it has no "
                              "training to follow.")
    raise CheckpointError(f"{ckpt}: no snapshots/ to follow over training; train with "
                          "--snapshots-per-octave N (N >= 1) to write them.")


def measure(ckpt: str | Path, device: str = "auto", eval_size: int = 2048, seed: int = 0, storage_points: int = 12,
            contexts: int = 4, progress: bool = True) -> tuple[pd.DataFrame, FactualRecallTask]:
    """One row of metrics per snapshot of `ckpt` (the storage shares on a log-spaced subset)."""
    steps = snapshots_to_follow(ckpt)
    first = load_checkpoint(ckpt, steps[0], kind="factual_recall")
    one_layer(first.section.n_layers, ckpt, "hallucination")
    # every snapshot read and checked before any is measured: a damaged one is refused at once
    snapshots = {step: read_weights(snapshot_path(ckpt, step), first.section) for step in steps}
    task = first.task
    model = build_bridge(first.section, first.weights, resolve_device(device))
    held_out = task.eval_set(eval_size, seed, model_device(model))
    with_storage = set(log_spaced(steps, storage_points))
    rows = []
    for step in progress_bar(steps, desc="snapshots", unit="snapshot", disable=not progress):
        load_weights(model, snapshots[step])
        row = {"step": step, **recall_metrics(hooked_last_logits(model, held_out.tokens), held_out, task)}
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
    storage = (metrics.dropna(subset=["attention_recall_share"]) if "attention_recall_share" in metrics
               else metrics.iloc[:0])
    return {
        "task": repr(task),
        "log_D": math.log(task.answers_per_relation),
        "log_answers": math.log(task.d_vocab_out),
        "conditional_entropy": level,
        "phase": phase.to_dict() if phase else None,
        "rule": asdict(rule),
        "n_snapshots": len(metrics),
        "final": {k: int(v) if k == "step" else float(v) for k, v in metrics.iloc[-1].items()},
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


def report(dynamics: Dynamics, ckpt: str, out: Path) -> str:
    """The short human summary printed by the CLI."""
    summary = dynamics.summary
    final, phase = summary["final"], summary["phase"]
    lines = [f"{ckpt}: {summary['n_snapshots']} snapshots, log D = {summary['log_D']:.3f}, "
             f"H(a|r) = {summary['conditional_entropy']:.3f} nats",
             f"final     step {final['step']}: loss {final['loss']:.4f}, accuracy {final['accuracy']:.3f}, "
             f"relation-only {final['relation_only_loss']:.4f}, subject-only {final['subject_only_loss']:.4f}"]
    if phase is None:
        rule = summary["rule"]
        lines.append(f"no hallucination phase: no {rule['min_snapshots']}+ snapshots over {rule['min_octaves']:g}+ "
                     f"octaves with the loss within {100 * rule['level_tolerance']:g}% of H(a|r), relation-only "
                     f"loss <= {rule['relation_only_max']:g} and subject-only loss >= {rule['subject_only_min']:g}")
    else:
        left = f"left at step {phase['exit_step']}" if phase["exit_step"] is not None else "training ended in it"
        lines.append(f"hallucination phase: steps {phase['start_step']}-{phase['end_step']} "
                     f"({phase['length_octaves']:.2f} octaves, {left}); plateau loss {phase['plateau_loss']:.3f}, "
                     f"relation-only {phase['relation_only_loss']:.4f}, subject-only {phase['subject_only_loss']:.3f}")
    lines.append(f"half the facts or more recalled by the attention path alone: {_fill_text(summary, 'attention')}; "
                 f"by the MLP path alone: {_fill_text(summary, 'mlp')}")
    lines.append(f"wrote {out}/ (metrics.csv, summary.json, hallucination.png, storage.png)")
    return "\n".join(lines)


def _fill_text(summary: dict, path: str) -> str:
    """When `path` ('attention' or 'mlp') came to recall half the facts, in words."""
    step = summary["storage_fills"][path]
    if step is not None:
        return f"from step {step}"
    last = summary["final"].get(f"{path}_recall_share")  # NaN (None once read back): no MLP
    if f"{path}_recall_share" not in summary["final"]:
        return "not measured (--storage-points 0)"
    if last is None or math.isnan(last):
        return "none (the model has no MLP)"
    return f"not at the last snapshot (share {last:.2f})"


def follow(ckpt: str | Path, settings: HallucinationSettings = HallucinationSettings(), rule: PhaseRule = PhaseRule(),
           device: str = "auto", progress: bool = True) -> Dynamics:
    """Measure every snapshot of `ckpt` and find the phase (nothing written)."""
    metrics, task = measure(ckpt, device, **asdict(settings), progress=progress)
    return Dynamics(metrics, {"checkpoint": str(ckpt), "snapshots_sha256": snapshots_sha256(ckpt),
                              "settings": asdict(settings), **summarise(metrics, task, rule)})


def write(dynamics: Dynamics, out: Path) -> None:
    """metrics.csv, summary.json, hallucination.png and storage.png in `out`."""
    write_csv(out / "metrics.csv", dynamics.metrics)
    write_summary(out / "summary.json", dynamics.summary)
    plots.hallucination_curves(dynamics.metrics, dynamics.summary, out / "hallucination.png")
    plots.storage_over_time(dynamics.metrics, dynamics.summary, out / "storage.png")


def parser():
    p = cli.checkpoint_parser("hallucination", __doc__, "the held-out prompts", step=False, with_snapshots=True)
    cli.add_settings(p, HallucinationSettings, "what is measured", exclude=("seed",))
    cli.add_settings(p, PhaseRule, "phase rule")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings, rule = cli.settings(args, HallucinationSettings), cli.settings(args, PhaseRule)
    out = cli.out_dir(args, "CKPT/analysis/hallucination")
    if args.out is None:  # beside the default settings' results, never over them
        out = out / recorded.settings_folder(settings, rule)
    snapshots_to_follow(args.ckpt)  # a checkpoint without snapshots is refused first
    wanted = {"snapshots_sha256": snapshots_sha256(args.ckpt), "settings": asdict(settings), "rule": asdict(rule)}
    recorded.refuse_other_results("hallucination", out, wanted, args.ckpt, "the hallucination analysis")
    dynamics = follow(args.ckpt, settings, rule, args.device, progress=not args.quiet)
    write(dynamics, out)
    print(report(dynamics, args.ckpt, out))
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
