"""The studies of `python -m analyses.induction`, as functions returning DataFrames: one layer against
two, the memory recall probes over training and their order, joint learning against learning each
memory alone, and where the global and in-context knowledge live. Every measurement is an
instrument of probe/induction.py on the TransformerLens model; training is models.induction's."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from models.bridge import build_bridge, load_weights
from models.induction.config import InductionModelConfig, InductionTaskConfig, InductionTrainConfig
from models.induction.construction import TARGETS, memory_targets
from models.induction.trainer import train
from models.induction.weights import init_weights
from models.training.result import TrainResult
from probe.induction import memory_recall

PROBES = {"wk0": TARGETS[0], "wk1": TARGETS[1], "wo1": TARGETS[2]}  # the probe of each trained memory
LEARNED = 0.9  # a memory counts as learned once its recall probe reaches this


def curve_table(result: TrainResult, **labels) -> pd.DataFrame:
    """A trained model's held-out curve (step, in-context accuracy, losses, ...) with `labels` columns."""
    frame = pd.DataFrame(result.metrics).drop(columns=["lr", "seed"], errors="ignore")
    return frame.assign(**labels)


def one_against_two_layers(task: InductionTaskConfig, model: InductionModelConfig, cfg: InductionTrainConfig,
                           progress: bool = True) -> tuple[pd.DataFrame, dict[int, TrainResult]]:
    """The generic transformer with one layer and with two, trained alike: their curves (a `layers`
    column) and the trained models by layer count."""
    results = {}
    for layers in (1, 2):
        results[layers] = train(task, replace(model, architecture="generic", n_layers=layers), cfg, progress)[0]
    return pd.concat([curve_table(r, layers=n) for n, r in results.items()], ignore_index=True), results


def probes_over_snapshots(result: TrainResult) -> pd.DataFrame:
    """Every memory recall probe (the best head's recall; ff1 the MLP's KL) at each snapshot: step,
    probe, value."""
    steps = sorted(result.snapshots)
    if not steps:
        raise ValueError("the model has no snapshots (train with snapshot_every > 0).")
    model = build_bridge(result.section, result.snapshots[steps[0]], "cpu", result.task)
    rows = []
    for step in steps:
        load_weights(model, result.snapshots[step])
        best = memory_recall(model, result.task).groupby("probe", sort=False)["value"].max()  # ff1: its one row
        rows += [{"step": step, "probe": probe, "value": value} for probe, value in best.items()]
    return pd.DataFrame(rows)


def learning_order(probes: pd.DataFrame, threshold: float = LEARNED) -> pd.DataFrame:
    """The first step at which each recall probe reaches `threshold` (NaN if never), earliest first."""
    rows = []
    for probe, group in probes[probes.probe.isin(list(PROBES))].groupby("probe"):
        reached = group[group.value >= threshold]
        rows.append({"probe": probe, "memory": PROBES[probe], "first_step": reached.step.min()})
    return pd.DataFrame(rows).sort_values("first_step", na_position="last").reset_index(drop=True)


ALONE = ("target", "init", "none")  # how the other two memories are held while one trains alone


def joint_against_alone(task: InductionTaskConfig, model: InductionModelConfig, cfg: InductionTrainConfig,
                        progress: bool = True, strength: float = 10.0, alone: str = "target", until: int = 0,
                        state: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame, TrainResult]:
    """Each memory's recall probe over training when all three train together (mode `joint`, from
    the initialisation) and when one trains alone (mode `alone`): with `alone="target"` the other
    two are frozen at the construction's values for the whole run; with `alone="init"` (the
    authors' freeze_until) they stay at their random initial values until step `until`, then all
    three train; `alone="none"`: the joint run only. The talk: joint learning is faster.

    Returns (probes: step, probe, value, mode, trained_alone — every probe of every run, the memory
    a run trained alone in `trained_alone`, "" for the joint run; curves: the held-out in-context
    accuracy and losses at each evaluation, with mode and trained_alone; the joint run's result).
    `state`: a folder where the joint run keeps its training state, so an interrupted study
    continues there."""
    if alone not in ALONE:
        raise ValueError(f"alone must be one of {', '.join(ALONE)}, got {alone!r}.")
    if alone == "init" and not 0 < until < cfg.steps:
        raise ValueError(f"--until must be a step in 1..{cfg.steps - 1} (the others join training then), got {until}.")
    cfg = replace(cfg, snapshot_every=cfg.snapshot_every or cfg.eval_every)
    built = task.build()
    section = model.section(built)
    seed = cfg.seed[0]
    start = init_weights(section, seed)
    targets = memory_targets(section, start, built, strength)
    runs = [("", train(task, model, replace(cfg, seed=(seed,)), progress, state, built)[0])]
    for probe, key in PROBES.items() if alone != "none" else ():
        others = tuple(k for k in targets if k != key)
        if alone == "target":
            result = train(task, model, replace(cfg, seed=(seed,), frozen=others), progress, task=built,
                           initial={**start, **{k: targets[k] for k in others}})[0]
        else:
            result = train(task, model, replace(cfg, seed=(seed,), frozen=others, frozen_until=until), progress,
                           task=built)[0]
        runs.append((probe, result))
    probes, curves = [], []
    for trained_alone, result in runs:
        mode = {"mode": "alone" if trained_alone else "joint", "trained_alone": trained_alone}
        probes.append(probes_over_snapshots(result).assign(**mode))
        curves.append(curve_table(result, **mode))
    return pd.concat(probes, ignore_index=True), pd.concat(curves, ignore_index=True), runs[0][1]


def own_probe(probes: pd.DataFrame) -> pd.DataFrame:
    """The joint run's rows of the three memories, and of each alone run its own memory's rows."""
    joint = (probes["mode"] == "joint") & probes.probe.isin(list(PROBES))
    return probes[joint | (probes.probe == probes.trained_alone)].reset_index(drop=True)


def steps_to_learn(curves: pd.DataFrame, threshold: float = LEARNED) -> pd.DataFrame:
    """Per probe and mode, the first step at which the probe reaches `threshold` (NaN if never):
    of the joint run and of the run that trained that memory alone (own_probe's rows)."""
    curves = own_probe(curves) if "trained_alone" in curves else curves
    reached = curves[curves.value >= threshold].groupby(["probe", "mode"]).step.min()
    return reached.unstack("mode").reindex(index=list(PROBES), columns=["joint", "alone"]).reset_index()


def accuracy_to_learn(curves: pd.DataFrame, threshold: float = LEARNED) -> dict[str, float | None]:
    """Per run (`joint`, or `alone_<memory>`), the first evaluated step with in-context accuracy >=
    `threshold` (None if never)."""
    found = {}
    for (mode, alone), group in curves.groupby(["mode", "trained_alone"], sort=False, dropna=False):
        reached = group[group.in_context_accuracy >= threshold].step
        found[mode if mode == "joint" else f"alone_{alone}"] = int(reached.min()) if len(reached) else None
    return found


def ff1_over_training(result: TrainResult) -> pd.DataFrame:
    """The final MLP's KL to the global bigrams (nats) at each snapshot, beside the bigram loss."""
    probes = probes_over_snapshots(result)
    return probes[probes.probe == "ff1"].rename(columns={"value": "ff1_kl"}).drop(columns="probe")

