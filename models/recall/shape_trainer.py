"""Runs of different shapes and tasks trained as one zero-padded stack (the padding and the
buckets: models.recall.shape_stack), on the factual-recall trainer's step, evaluation and results
(models.recall.trainer)."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from models.bridge import resolve_device
from models.cores.forward import has_positions
from models.recall import stack_state
from models.recall.config import RunConfig
from models.recall.shape_stack import (
    buckets,
    check_stackable,
    default_budget,
    gradient_masks,
    pad,
    padded_section,
    query_scales,
    sizes,
    unpad,
)
from models.recall.trainer import (
    EVAL_SEED,
    best_so_far,
    evaluate,
    kept_result,
    training_step,
)
from models.recall.training_data import TrainingData
from models.recall.weights import init_weights, model_weights, stack, trainable_keys
from models.section import ModelSection
from models.text import count
from models.training.divergence import check_finite
from models.training.graphed import Step, use_cuda_graph
from models.training.optimizer import Optimizer
from models.training.progress import progress_bar
from models.training.result import TrainResult, snapshot_schedule
from models.training.subnormals import flushed, flushing
from tasks.factual_recall import Batch, FactualRecallTask

SAVE_EVERY = 60.0  # seconds of training between a resumable stack's saved states


def train_shapes(runs: list[RunConfig], progress: bool = True, flush_subnormals: bool = True,
                 state_folder: Path | None = None, save_every: float = SAVE_EVERY) -> list[TrainResult]:
    """Train runs that differ in d, H, d_h, m or the task (S, R, D, N, facts; one seq_len) as
    one zero-padded stack (models.recall.shape_stack), one TrainResult per run: what train(run)
    gives alone, up to the summation order of the padded products. Each run keeps its models
    at their own shapes and task, its data stream, curve and early stop: a run that stops
    (its best model reached its target accuracy, it gave up, or its steps are spent) is frozen, its
    learning rates set to zero, while the others go on. The runs may also differ in lr,
    seed, steps, eval_every, target_accuracy, give_up and snapshots_per_octave; runs of different
    tasks need the counter sampler (shape_stack.check_stackable). The stack is trained as
    given, whatever its size: train_stacks splits runs into stacks that fit a memory budget.
    A non-finite model stops the whole stack. With `state_folder`, the stack saves its state
    there every `save_every` seconds of training and when it ends (models.recall.stack_state), and
    a stack started on a folder holding its state goes on from it, bit-identical to an uncut
    stack on the same device."""
    for run in runs:
        run.train.validate()
    check_stackable(runs)
    device = resolve_device(runs[0].train.device)
    with flushed(device, flush_subnormals):
        subnormals = "flushed" if device.type == "cpu" and flushing() else "kept"
        state = _start_shapes(runs, device)
        state.folder, state.save_every = state_folder, save_every
        if state_folder is not None:
            stack_state.resume(Path(state_folder), state)
        _loop_shapes(state, progress)
        return [_cell_result(state, cell, subnormals) for cell in state.cells]


def train_stacks(runs: list[RunConfig], memory_budget_bytes: int | None = None, progress: bool = True,
                 flush_subnormals: bool = True, state_folder: Path | None = None,
                 save_every: float = SAVE_EVERY) -> list[TrainResult]:
    """Train any runs as few padded stacks as the buckets allow (shape_stack.buckets: runs
    that can share a stack, none below half its stack's padded parameters, d and vocabulary,
    each stack within `memory_budget_bytes`), one stack after another; one TrainResult per
    run, in the order of `runs`, each what train(run) gives alone (train_shapes). The budget
    defaults to a fraction of the free memory of the first run's device where it is CUDA
    (shape_stack.default_budget), no limit elsewhere. A run too large for the budget alone
    is refused before anything trains (ValueError). With `state_folder`, stack j is resumable
    in its folder stack<j> there, saved every `save_every` seconds (train_shapes)."""
    if not runs:
        return []
    for run in runs:
        run.train.validate()
    if memory_budget_bytes is None:
        memory_budget_bytes = default_budget(resolve_device(runs[0].train.device))
    results: list[TrainResult | None] = [None] * len(runs)
    for j, members in enumerate(buckets(runs, memory_budget_bytes)):
        folder = None if state_folder is None else Path(state_folder) / f"stack{j}"
        for i, result in zip(members, train_shapes([runs[i] for i in members], progress, flush_subnormals, folder,
                                                   save_every)):
            results[i] = result
    return results


@dataclass
class _Cell:
    """One run of a shape stack: its models' rows in the stack, and what it has recorded."""

    run: RunConfig
    task: FactualRecallTask  # its own task
    section: ModelSection  # its config.json model section (its own shape)
    rows: slice  # its models in the stack
    schedule: set[int]  # snapshot steps
    metrics: list[dict] = field(default_factory=list)
    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # padded trainable [K_c, ...], CPU
    stopped: int | None = None  # the step it stopped at
    seconds: float = 0.0  # since the stack's start, when it stopped


@dataclass
class _ShapeTraining:
    """A shape stack in progress: the padded models of every run, one optimizer, one data stream."""

    cells: list[_Cell]
    device: torch.device
    weights: dict[str, torch.Tensor]  # [K, *padded shape] on the device
    params: dict[str, torch.Tensor]  # the trainable ones among them, their padding's gradient masked
    lr: torch.Tensor  # [K] the optimizer's learning rates (zeroed when a run stops)
    query_scale: torch.Tensor | None  # [K] each model's 1/sqrt(d_head), None when all are equal
    positional: bool
    optimizer: Optimizer
    data: TrainingData
    step_once: Step  # one update of every model: eager, or a CUDA graph's replay
    held_out: Batch  # one set every model shares [B, T], or each model's own [K, B, T]
    step: int = 0
    start: float = field(default_factory=time.perf_counter)
    folder: Path | None = None  # where its state is saved (None: not resumable)
    save_every: float = SAVE_EVERY  # seconds
    saved: float = field(default_factory=time.perf_counter)  # when it last saved its state
    evaluated: int | None = None  # a resumed state's step: its snapshots and evaluations are recorded


def _start_shapes(runs: list[RunConfig], device: torch.device) -> _ShapeTraining:
    """Every run's models initialised at their own shapes and tasks, padded into one stack;
    the gradient masks that keep the padding at zero; each model's data stream and held-out
    set at its own task."""
    cfg = runs[0].train
    built = {config: config.build() for config in dict.fromkeys(run.task for run in runs)}  # one per task
    cells, sections, models, pairs, tasks = [], [], [], [], []
    for run in runs:
        task, K = built[run.task], len(run.train.runs)
        section = run.model.checkpoint_section(task)
        cells.append(_Cell(run, task, section, slice(len(pairs), len(pairs) + K),
                           snapshot_schedule(run.train.steps, run.train.snapshots_per_octave)))
        models += [init_weights(run.model, task, seed) for _, seed in run.train.runs]
        sections += [section] * K
        tasks += [task] * K
        pairs += run.train.runs
    padded = padded_section(sections)
    initial = stack([pad(w, padded) for w in models])  # [K, ...] CPU
    weights = {k: t.to(device) for k, t in initial.items()}
    params = {k: weights[k].requires_grad_() for k in trainable_keys(weights, runs[0].model, cfg.freeze_ov)}
    for key, mask in gradient_masks(sections, list(params)).items():
        params[key].register_hook(functools.partial(torch.mul, mask.to(device)))
    lr = torch.tensor([lr for lr, _ in pairs], device=device)
    scale = query_scales(sections)
    scale = None if scale is None else scale.to(device)
    positional, optimizer = has_positions(initial), Optimizer(params, lr, cfg.optimizer)  # positions read on the CPU
    data = TrainingData(tasks if len(built) > 1 else tasks[0], pairs, cfg.batch_size, device, cfg.sampler)
    step_once = Step(training_step(weights, optimizer, data, runs[0].model.attention, positional, scale),
                     use_cuda_graph(cfg.cuda_graph, device, cfg.sampler))
    return _ShapeTraining(cells, device, weights, params, lr, scale, positional, optimizer, data, step_once,
                          _held_out(list(built.values()), tasks, cfg.eval_size, device))


def _held_out(distinct: list[FactualRecallTask], tasks: list[FactualRecallTask], size: int,
              device: torch.device) -> Batch:
    """The held-out set of train(run): one every model shares when they share a task,
    otherwise each model's own [K, size, ...] (its own token ids: the corner of the padded
    vocabulary)."""
    sets = {id(task): task.eval_set(size, EVAL_SEED, device) for task in distinct}
    if len(sets) == 1:
        return next(iter(sets.values()))
    return Batch(*(torch.stack([getattr(sets[id(task)], f.name) for task in tasks]) for f in fields(Batch)))


def _loop_shapes(state: _ShapeTraining, progress: bool) -> None:
    """Step until every run has stopped; each run snapshots, evaluates and stops on its own
    schedule, as its train() would."""
    attention = state.cells[0].run.model.attention
    bar = progress_bar(total=max(c.run.train.steps for c in state.cells), initial=state.step, disable=not progress,
                       unit="step",
                       desc=f"training {count(len(state.lr), 'model')} of {count(len(state.cells), 'shape')}")
    while True:
        active = [c for c in state.cells if c.stopped is None and state.step != state.evaluated]
        for cell in active:
            if state.step in cell.schedule:
                _snapshot_cell(state, cell)
        due = [c for c in active if state.step % c.run.train.eval_every == 0 or state.step == c.run.train.steps]
        if due:
            loss, acc = evaluate(state.weights, state.held_out.tokens, state.held_out.answers, attention,
                                 state.positional, state.query_scale)
            for cell in due:
                _evaluate_cell(state, cell, loss[cell.rows].tolist(), acc[cell.rows].tolist())
            # the evaluation waited for the device: the state is saved here, between steps
            ended = all(c.stopped is not None for c in state.cells)
            if state.folder is not None and (ended or time.perf_counter() - state.saved >= state.save_every):
                stack_state.save(Path(state.folder), state)
                state.saved = time.perf_counter()
        if all(c.stopped is not None for c in state.cells):
            break
        state.step_once()
        state.step += 1
        bar.update(1)
    bar.close()


def _snapshot_cell(state: _ShapeTraining, cell: _Cell) -> None:
    """Keep the run's trainable weights (padded) of this step, refusing non-finite ones."""
    params = {k: p[cell.rows] for k, p in state.params.items()}
    check_finite(params, cell.run.train.runs, state.step, cell.snapshots)
    cell.snapshots[state.step] = {k: p.detach().to("cpu", copy=True) for k, p in params.items()}


def _evaluate_cell(state: _ShapeTraining, cell: _Cell, loss: list[float], accuracy: list[float]) -> None:
    """Record the run's held-out losses and accuracies at this step; stop and freeze it when
    its best model reached its target, it gives up (TrainConfig.gives_up) or its steps are
    spent."""
    cfg = cell.run.train
    check_finite({"loss": torch.tensor(loss)}, cfg.runs, state.step, cell.snapshots)
    seconds = time.perf_counter() - state.start
    cell.metrics.append({"step": state.step, "seconds": round(seconds, 3),
                         "models": [{"lr": lr, "seed": s, "loss": l, "accuracy": a}
                                    for (lr, s), l, a in zip(cfg.runs, loss, accuracy)]})
    if state.step == cfg.steps or max(accuracy) >= cfg.target_accuracy or \
            cfg.gives_up(state.step, best_so_far(cell.metrics)):
        cell.stopped, cell.seconds = state.step, seconds
        state.lr[cell.rows] = 0.0  # the optimizer's views: its models keep this step's weights
        if cell.schedule and state.step not in cell.snapshots:
            _snapshot_cell(state, cell)


def _cell_result(state: _ShapeTraining, cell: _Cell, subnormals: str) -> TrainResult:
    """A run's TrainResult at its own shape, as train(run) gives it; `training.stack` records
    the padded stack it trained in."""
    def own(padded: dict) -> dict:  # [K_c, *padded shape] -> [K_c, *own shape], CPU
        return stack([unpad(model_weights(padded, k), cell.section) for k in range(len(cell.run.train.runs))])

    stacked = own({k: t[cell.rows] for k, t in state.weights.items()})
    snapshots = {s: own(snap) for s, snap in cell.snapshots.items()}
    result = kept_result(cell.run, cell.task, str(state.device), stacked, sorted(state.params), cell.metrics,
                         snapshots, cell.stopped, cell.seconds, None, subnormals, state.step_once.graphed)
    padded = padded_section([c.section for c in state.cells])
    result.training["stack"] = {"models": len(state.lr), **{k: getattr(padded, k) for k in sizes(padded)}}
    return result
