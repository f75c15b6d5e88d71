"""The factual-recall trainer: K models (a learning-rate sweep, several seeds) trained as one job.

Every tensor carries a leading model axis [K, ...]; the loss is the sum over models of each
model's mean cross-entropy on its own fresh batch, so each model's gradient, Adam state and
data stream equal those of its separate run. Training reads only the last position through
models.cores.forward; the best model by held-out accuracy is kept and written as a checkpoint.
Runs of different shapes and tasks train as one zero-padded stack in models.recall.shape_trainer.

What every family's trainer shares (the result type TrainResult, the data-seed offset, the
snapshot schedule, the optimizer, the CUDA-graph step, what becomes of a diverging model) is
models/training/; every model's data stream is models.recall.training_data.
"""
from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from models.bridge import resolve_device
from models.cores.forward import has_positions, last_position_logits
from models.recall.config import RunConfig, resolved_record
from models.recall.fits import check_fits
from models.recall.training_data import TrainingData
from models.recall.weights import init_weights, model_weights, stack, trainable_keys
from models.text import count
from models.training.divergence import describe, drop, nonfinite, stopped
from models.training.graphed import Step, use_cuda_graph
from models.training.optimizer import Optimizer
from models.training.progress import progress_bar
from models.training.result import DATA_SEED_OFFSET, TrainResult, snapshot_schedule
from models.training.subnormals import flushed, flushing
from models.training.train_state import complete_steps, load_state, remove_partial, restore, save_state, saved_snapshots
from tasks.factual_recall import Batch, FactualRecallTask

EVAL_SEED = 999  # the held-out set


def evaluate(weights: dict, tokens: torch.Tensor, answers: torch.Tensor, attention: str,
             positional: bool | None = None, query_scale: torch.Tensor | None = None):
    """Held-out loss (nats) and accuracy per model: two [K] tensors, on tokens [B, T] and
    answers [B] every model shares, or [K, B, T] and [K, B] of its own."""
    K, B, T = next(iter(weights.values())).shape[0], *tokens.shape[-2:]
    with torch.no_grad():
        logits = last_position_logits(weights, tokens.expand(K, B, T), attention, positional, query_scale)  # [K, B, O]
        loss = F.cross_entropy(logits.transpose(1, 2), answers.expand(K, -1), reduction="none").mean(-1)
        accuracy = (logits.argmax(-1) == answers).float().mean(-1)
    return loss, accuracy


def train(run: RunConfig, progress: bool = True, wandb_project: str | None = None,
          preset_name: str | None = None, state_folder: Path | None = None,
          flush_subnormals: bool = True) -> TrainResult:
    """Train the K = len(lr) x len(seed) models of `run` together; keep the best.
    A model whose loss or weights become NaN or infinite is dropped, said in one line on
    stderr and recorded (`training.dropped`), and the others train on; when every model has
    diverged, TrainingDiverged (models.training.divergence). With `state_folder`, the training
    state is saved there with every snapshot, and a run finds its last complete state there and
    continues from it (bit-identical on a CPU). On a CPU, subnormal floats are flushed to
    zero on every torch thread while it trains (models.training.subnormals: a trained model's
    tiny probabilities otherwise slow the step down); `flush_subnormals=False` keeps them, for
    comparison."""
    run.train.validate()
    device = resolve_device(run.train.device)
    check_fits(run, device)  # a run that cannot fit is refused before anything is allocated
    with flushed(device, flush_subnormals):
        subnormals = "flushed" if device.type == "cpu" and flushing() else "kept"
        state = _start(run, device, state_folder)
        logger = _wandb(wandb_project, run, preset_name) if wandb_project else None
        _loop(state, state_folder, progress, logger)
        if logger:
            logger.finish()
        return _result(state, preset_name, subnormals)


@dataclass
class _Training:
    """A run in progress: the K models, their optimizer and data streams, and what has been
    recorded so far."""

    run: RunConfig
    task: FactualRecallTask
    device: torch.device
    weights: dict[str, torch.Tensor]  # [K, ...] on the device, frozen tensors included
    params: dict[str, torch.Tensor]  # the trainable ones among them
    positional: bool  # W_pos is non-zero (it is frozen: decided once, no per-step host sync)
    optimizer: Optimizer
    data: TrainingData  # every model's data stream
    step_once: Step  # one update of every model: eager, or a CUDA graph's replay
    held_out: Batch
    schedule: set[int]  # snapshot steps
    step: int  # steps taken
    metrics: list[dict]  # one row per evaluation
    snapshots: dict[int, dict[str, torch.Tensor]]  # trainable weights [K, ...] by step, CPU
    start: float  # time.perf_counter() at step 0 (earlier sessions' seconds included)
    dropped: list[dict]  # the models that diverged: model, lr, seed, step, reason
    first_step: int = 0  # the step this call started from (a resumed run's last saved state)
    session_start: float = 0.0  # time.perf_counter() when this call's training began
    prompt_sets: dict = None  # two-hop: the prompt sets whose accuracy each evaluation records (eval_sets)


def _start(run: RunConfig, device: torch.device, state_folder: Path | None) -> _Training:
    """Initial weights, optimizer and data streams; with `state_folder`, the last complete
    saved state put back into them."""
    cfg = run.train
    task = run.task.build()
    runs = cfg.runs
    initial = stack([init_weights(run.model, task, seed) for _, seed in runs])  # [K, ...] CPU
    positional = has_positions(initial)  # read on the CPU: the run's device is never waited for
    weights = {k: t.to(device) for k, t in initial.items()}
    params = {k: weights[k].requires_grad_() for k in trainable_keys(weights, run.model, cfg.freeze_ov)}
    optimizer = Optimizer(params, torch.tensor([lr for lr, _ in runs], device=device), cfg.optimizer)
    data = TrainingData(task, runs, cfg.batch_size, device, cfg.sampler)
    step_once = Step(training_step(weights, optimizer, data, run.model.attention, positional),
                     use_cuda_graph(cfg.cuda_graph, device, cfg.sampler))
    held_out = task.eval_set(cfg.eval_size, EVAL_SEED, device)
    schedule = snapshot_schedule(cfg.steps, cfg.snapshots_per_octave)

    step, metrics, snapshots, dropped = 0, [], {}, []
    saved = complete_steps(state_folder) if state_folder else []
    if state_folder:
        remove_partial(state_folder)
    if saved:
        tensors, info = load_state(state_folder, saved[-1])
        step, metrics = restore(tensors, info, params, optimizer, data.generators, cfg.sampler)
        snapshots = saved_snapshots(state_folder, params)
        dropped = info.get("dropped", [])
        for gone in dropped:  # its weights were saved as zeros; its learning rate comes from the run
            drop(gone["model"], params, optimizer)
    now = time.perf_counter()
    start = now - (metrics[-1]["seconds"] if metrics else 0.0)
    prompt_sets = task.eval_sets(cfg.eval_size, EVAL_SEED + 1, device) if hasattr(task, "eval_sets") else {}
    return _Training(run, task, device, weights, params, positional, optimizer, data, step_once, held_out,
                     schedule, step, metrics, snapshots, start, dropped, step, now, prompt_sets)


def _loop(state: _Training, state_folder: Path | None, progress: bool, logger) -> None:
    """Step until the step budget is spent, the best model reaches the target accuracy or
    the run gives up (TrainConfig.gives_up), evaluating every eval_every steps and taking the scheduled snapshots."""
    cfg, runs = state.run.train, state.run.train.runs
    K = len(runs)
    bar = progress_bar(total=cfg.steps, initial=state.step, disable=not progress,
                       desc=f"training {count(K, 'model')}", unit="step")
    while True:
        if state.step in state.schedule and state.step not in state.snapshots:
            _snapshot(state, state_folder)
        if state.step % cfg.eval_every == 0 or state.step == cfg.steps:
            best = _evaluate(state, logger)
            bar.set_postfix(acc=f"{best['accuracy']:.3f}", loss=f"{best['loss']:.3f}")
            if state.step == cfg.steps or best["accuracy"] >= cfg.target_accuracy or \
                    cfg.gives_up(state.step, best_so_far(state.metrics)):
                break
        state.step_once()
        state.step += 1
        bar.update(1)
    bar.close()
    if state.step not in state.snapshots and state.schedule:
        state.snapshots[state.step] = {k: p.detach().to("cpu", copy=True) for k, p in state.params.items()}


def best_so_far(metrics: list[dict], k: int | None = None) -> float:
    """The best held-out accuracy of any model (or of model `k`) at any evaluation in
    `metrics`; a dropped model's evaluations (None) do not count."""
    return max(m["accuracy"] for row in metrics for m in (row["models"] if k is None else [row["models"][k]])
               if m["accuracy"] is not None)


def _snapshot(state: _Training, state_folder: Path | None) -> None:
    """Keep the trainable weights of this step (dropping models with non-finite ones); save
    the whole training state beside them when the run is resumable."""
    _drop_diverged(state, state.params)
    state.snapshots[state.step] = {k: p.detach().to("cpu", copy=True) for k, p in state.params.items()}
    if state_folder:
        save_state(state_folder, state.step, state.params, state.optimizer, state.data.generators, state.metrics,
                   state.run.train.sampler, state.dropped)


def _drop_diverged(state: _Training, tensors: dict[str, torch.Tensor]) -> None:
    """Drop each model with a NaN or inf in `tensors` ([K, ...]), saying so in one line each;
    raise TrainingDiverged (one line) where no model would be left."""
    runs = state.run.train.runs
    gone = {d["model"] for d in state.dropped}
    new = {k: what for k, what in nonfinite(tensors, len(runs)).items() if k not in gone}
    if new and len(gone) + len(new) == len(runs):  # none would be left: the run stops, named by the first
        k, what = next(iter(new.items()))
        raise stopped(state.step, k, runs, what, state.snapshots)
    for k, what in new.items():
        drop(k, state.params, state.optimizer)
        gone.add(k)
        state.dropped.append({"model": k, "lr": runs[k][0], "seed": runs[k][1], "step": state.step,
                              "reason": f"non-finite {what}"})
        tqdm.write(f"{describe(state.step, k, runs, what)}; dropped it, {len(runs) - len(gone)} of {len(runs)} "
                   "models train on.", file=sys.stderr)


def _evaluate(state: _Training, logger) -> dict:
    """Record every model's held-out loss and accuracy at this step (None for a dropped
    model); the best model's entry."""
    runs = state.run.train.runs
    loss, acc = evaluate(state.weights, state.held_out.tokens, state.held_out.answers, state.run.model.attention,
                         state.positional)
    _drop_diverged(state, {"loss": loss})
    gone = {d["model"] for d in state.dropped}
    row = {"step": state.step, "seconds": round(time.perf_counter() - state.start, 3),
           "models": [{"lr": lr, "seed": s, "loss": None if k in gone else float(l),
                       "accuracy": None if k in gone else float(a)}
                      for k, ((lr, s), l, a) in enumerate(zip(runs, loss.tolist(), acc.tolist()))]}
    for name, prompts in state.prompt_sets.items():  # two-hop: one-hop, two-hop and held-out compositions
        accuracy = evaluate(state.weights, prompts.tokens, prompts.answers, state.run.model.attention,
                            state.positional)[1].tolist()
        for k, m in enumerate(row["models"]):
            m[name] = None if k in gone else accuracy[k]
    state.metrics.append(row)
    if logger:
        logger.log({f"model{k}/{key}": m[key] for k, m in enumerate(row["models"])
                    for key in ("loss", "accuracy") if m[key] is not None}, step=state.step)
    return max((m for m in row["models"] if m["accuracy"] is not None), key=lambda m: (m["accuracy"], -m["loss"]))


def _result(state: _Training, preset_name: str | None, subnormals: str) -> TrainResult:
    """The kept model (the best final held-out accuracy, then loss) with its training section,
    curve and snapshots (the run's totals: `steps_run`, `seconds`); all K final models under
    `stacked`; what this call ran under `session`."""
    stacked = {k: t.detach().to("cpu") for k, t in state.weights.items()}
    now = time.perf_counter()
    result = kept_result(state.run, state.task, str(state.device), stacked, sorted(state.params), state.metrics,
                         state.snapshots, state.step, now - state.start, preset_name, subnormals,
                         state.step_once.graphed, state.dropped)
    result.session = {"from_step": state.first_step, "steps": state.step - state.first_step,
                      "seconds": round(now - state.session_start, 2)}
    return result


def kept_result(run: RunConfig, task: FactualRecallTask, device: str, stacked: dict, trainable: list[str],
                metrics: list[dict], snapshots: dict, steps_run: int, seconds: float, preset_name: str | None,
                subnormals: str, graphed: bool, dropped: list[dict] = ()) -> TrainResult:
    """The kept model's TrainResult (`_result`, and models.recall.shape_trainer's per run) from its
    parts: the run's final models `stacked` [K, ...] (CPU), their curve, their trainable
    weights' snapshots [K, ...] by step, the steps and seconds they ran, whether their
    step was a CUDA graph's replay, and the models dropped as diverged (never kept; their
    final weights are zeros)."""
    cfg, runs = run.train, run.train.runs
    final = metrics[-1]["models"]
    kept = max((k for k in range(len(runs)) if final[k]["accuracy"] is not None),
               key=lambda k: (final[k]["accuracy"], -final[k]["loss"]))
    for row in metrics:  # the kept model's curve is the checkpoint's curve; all K stay under "models"
        row.update({key: value for key, value in row["models"][kept].items() if key not in ("lr", "seed")})
    kept_weights = model_weights(stacked, kept)
    training = {
        **{k: v for k, v in asdict(cfg).items() if k not in ("lr", "seed")},
        "lr": runs[kept][0], "seed": runs[kept][1], "preset": preset_name,
        "steps_run": steps_run, "final_loss": final[kept]["loss"], "final_accuracy": final[kept]["accuracy"],
        "reached_target": final[kept]["accuracy"] >= cfg.target_accuracy,
        "stopped_by": cfg.stopped_by(steps_run, final[kept]["accuracy"]),
        "kept_model": kept, "runs": final, "dropped": list(dropped), "device": device,
        "seconds": round(seconds, 2), "batch_seeds": f"seed + {DATA_SEED_OFFSET}",
        "trainer": "models.recall.trainer", "trainable": trainable, "subnormals": subnormals, "graphed": graphed,
        "task_config": asdict(run.task), "model_config": resolved_record(run.model),
    }
    snapshots = {s: {**kept_weights, **model_weights(snap, kept)} for s, snap in snapshots.items()}
    return TrainResult(task, run.model.checkpoint_section(task), kept_weights, training, metrics, snapshots, stacked)


def summed_loss(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Each model's mean cross-entropy over its batch (nats), summed over the models: logits
    [K, B, O], answers [K, B]. Written as log-softmax, gather and sum because CUDA's
    cross_entropy reduces its rows in one block of threads (99 µs of a 1.1 ms step at 64 models
    of B = 1024 on an H100); its gradients are the same bits."""
    picked = logits.log_softmax(-1).gather(-1, answers[..., None])  # [K, B, 1]
    return picked.sum() / -answers.shape[1]


def train_step(weights: dict, optimizer: Optimizer, tokens: torch.Tensor, answers: torch.Tensor,
               attention: str = "softmax", positional: bool | None = None,
               query_scale: torch.Tensor | None = None, attention_core: str = "auto") -> torch.Tensor:
    """One update of every model on tokens [K, B, T], answers [K, B]; returns the summed loss.
    `query_scale` [K]: each model's 1/sqrt(d_head) in a stack of padded shapes;
    `attention_core`: models.cores.forward.CORES."""
    logits = last_position_logits(weights, tokens, attention, positional, query_scale, attention_core)  # [K, B, O]
    loss = summed_loss(logits, answers)
    loss.backward()
    optimizer.step()
    return loss.detach()


def training_step(weights: dict, optimizer: Optimizer, data: TrainingData, attention: str, positional: bool,
                  query_scale: torch.Tensor | None = None, attention_core: str = "auto"):
    """One update of every model on its batch of this step, as a function of no arguments
    (models.training.graphed.Step runs or replays it): the step count is read from the optimizer's
    device counter `t` (steps taken), never from the host, so a replay draws the next batch."""
    def step() -> tuple[torch.Tensor]:
        tokens, answers = data.batch(optimizer.t)  # [K, B, T], [K, B]
        return (train_step(weights, optimizer, tokens, answers, attention, positional, query_scale, attention_core),)
    return step


def _wandb(project: str, run: RunConfig, preset_name: str | None):
    """A Weights & Biases run; offline unless WANDB_MODE says otherwise (no network needed)."""
    import os

    import wandb

    return wandb.init(project=project, config={"preset": preset_name, **asdict(run)},
                      mode=os.environ.get("WANDB_MODE", "offline"), dir=tempfile.gettempdir())
