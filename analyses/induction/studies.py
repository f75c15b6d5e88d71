"""The studies of `python -m analyses.induction`, as functions returning DataFrames: one layer against
two, the memory recall probes over training and their order, joint learning against learning each
memory alone, and where the global and in-context knowledge live. Every measurement is an
instrument of probe/induction.py on the TransformerLens model; training is models.induction's."""
from __future__ import annotations

from dataclasses import replace

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


def joint_against_alone(task: InductionTaskConfig, model: InductionModelConfig, cfg: InductionTrainConfig,
                        progress: bool = True, strength: float = 10.0) -> pd.DataFrame:
    """Each memory's recall probe over training when all three train together (`joint`, from the
    initialisation) and when it trains alone with the other two frozen at their target, the
    construction's (`alone`): step, probe, value, mode. The talk: joint learning is faster."""
    cfg = replace(cfg, snapshot_every=cfg.snapshot_every or cfg.eval_every)
    built = task.build()
    section = model.section(built)
    seed = cfg.seed[0]
    start = init_weights(section, seed)
    targets = memory_targets(section, start, built, strength)
    frames = []
    joint = train(task, model, replace(cfg, seed=(seed,)), progress, task=built)[0]
    frames.append(probes_over_snapshots(joint).assign(mode="joint"))
    for probe, key in PROBES.items():
        others = {k: v for k, v in targets.items() if k != key}
        alone = train(task, model, replace(cfg, seed=(seed,), frozen=tuple(others)), progress, task=built,
                      initial={**start, **others})[0]
        curve = probes_over_snapshots(alone)
        frames.append(curve[curve.probe == probe].assign(mode="alone"))
    frame = pd.concat(frames, ignore_index=True)
    return frame[frame.probe.isin(list(PROBES))].reset_index(drop=True)


def steps_to_learn(curves: pd.DataFrame, threshold: float = LEARNED) -> pd.DataFrame:
    """Per probe and mode, the first step at which the probe reaches `threshold` (NaN if never)."""
    reached = curves[curves.value >= threshold].groupby(["probe", "mode"]).step.min()
    return reached.unstack("mode").reindex(index=list(PROBES), columns=["joint", "alone"]).reset_index()


def ff1_over_training(result: TrainResult) -> pd.DataFrame:
    """The final MLP's KL to the global bigrams (nats) at each snapshot, beside the bigram loss."""
    probes = probes_over_snapshots(result)
    return probes[probes.probe == "ff1"].rename(columns={"value": "ff1_kl"}).drop(columns="probe")

