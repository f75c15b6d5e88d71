"""Batched training on the association and distribution tasks (Dana et al., appendix B).

Each seed draws `batches` batches of `batch_size` sequences from the uniform prior once
(the paper's data set: 1000 batches of 1024) and every model of that seed sees them in the
same order for `epochs` epochs, with Adam (models.training.optimizer.Optimizer). All K models of a
call (any sizes, any seeds) are one padded stack (models.aot.weights.Stack): the loss is the sum
of each model's mean loss on its own batch, so each model's gradient and Adam state equal
those of its separate run.

A batch of 1024 draws from only T_0 = N^S distinct sequences (2500 for bigrams), so a
step computes the logits of the whole population once (models.aot.forward.population_logits,
a grid of contractions) and weights each sequence's loss by its count in the batch / 1024:
the same loss and gradient as the batch, and exact scores on all T_0 sequences for free.
Both scores are kept: the accuracy on all T_0 sequences at the end, and the authors' own,
the mean of the last 100 training-batch accuracies (`batch_accuracy`).

The models of the dana head layout train in their own parametrisation: each step maps it
to the equivalent TransformerLens weights (models.aot.weights.to_transformer_lens, differentiable)
and runs the same population forward.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.aot.forward import population_logits
from models.aot.weights import Stack, init_aot_weights, stack_models
from models.bridge import resolve_device
from models.section import ModelSection
from models.text import count
from models.training.graphed import Step, use_cuda_graph
from models.training.optimizer import Optimizer
from models.training.progress import progress_bar
from models.training.result import DATA_SEED_OFFSET, TrainResult
from tasks.association import SequenceTask

BATCH_ACCURACY_STEPS = 100  # batch_accuracy: the mean over the last this many training batches


def scores(stack: Stack, task: SequenceTask) -> dict[str, torch.Tensor]:
    """Accuracy and loss [K] of every stacked model on all T_0 sequences."""
    with torch.no_grad():
        return task.scores(population_logits(stack.transformer_lens(), task.context, stack.score_scale, stack.act_fn))


def population_step(stack: Stack, task: SequenceTask, optimizer: Optimizer, data_all: torch.Tensor,
                    order: torch.Tensor):
    """One update of every model on its batch of this step, as a function of no arguments
    (models.training.graphed.Step runs or replays it). `data_all` [n_seeds, batches, B] holds each
    seed's data set; the batch is the one at the optimizer's device step count `t` (modulo
    the number of batches), so a replay reads the next one. Returns the batch's population
    logits before the update (detached) [K, T_0, N] and each model's count of every sequence
    in its batch [K, T_0]."""
    n_seeds, batches, batch_size = data_all.shape
    ones = torch.ones(n_seeds, batch_size, device=data_all.device)

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        batch = data_all.index_select(1, optimizer.t % batches).squeeze(1)  # [n_seeds, B] sequence indices
        counts = torch.zeros(n_seeds, task.n_sequences, device=data_all.device)
        counts = counts.scatter_add_(1, batch, ones)[order]  # [K, T_0] this step's batch
        # [K, T_0, N]
        logits = population_logits(stack.transformer_lens(), task.context, stack.score_scale, stack.act_fn)
        (task.sequence_losses(logits) * counts).sum().div(batch_size).backward()
        optimizer.step()
        return logits.detach(), counts
    return step


@dataclass
class AoTTraining:
    """K attention-only models ready to train on one device: every tensor their step reads
    lives there (models.training.capture_check builds it on the meta device to check the step)."""

    sections: list[ModelSection]  # each model's config.json model section
    stack: Stack
    task: SequenceTask  # the task, its tables on the device
    optimizer: Optimizer
    data: torch.Tensor  # [n_seeds, batches, B] each seed's data set (sequence indices)
    order: torch.Tensor  # [K] each model's row in `data`

    def step(self):
        """One update of every model (population_step)."""
        return population_step(self.stack, self.task, self.optimizer, self.data, self.order)


def prepare(task: SequenceTask, runs: list[tuple[AoTModelConfig, int]], cfg: AoTTrainConfig,
          device: torch.device) -> AoTTraining:
    """The K (model, seed) `runs` initialised, stacked and moved to `device` with the task's
    tables, their optimizer and each seed's data set. The data are drawn on the CPU from
    seed + DATA_SEED_OFFSET and moved once: the same on every device."""
    sections = [model_cfg.checkpoint_section(task) for model_cfg, _ in runs]
    stack = stack_models([init_aot_weights(model_cfg, task, seed) for model_cfg, seed in runs], sections).to(device)
    params = {k: stack.weights[k].requires_grad_() for k in stack.trainable()}
    optimizer = Optimizer(params, torch.full((len(runs),), cfg.lr, device=device), "adam")
    seeds = sorted({seed for _, seed in runs})
    data = torch.stack([task.sample_index(cfg.batches * cfg.batch_size,
                                          torch.Generator().manual_seed(seed + DATA_SEED_OFFSET))
                        .view(cfg.batches, cfg.batch_size) for seed in seeds])  # [n_seeds, batches, B]
    order = torch.tensor([seeds.index(seed) for _, seed in runs])  # [K]
    return AoTTraining(sections, stack, task.to(device), optimizer, data.to(device), order.to(device))


def train_aot(task: SequenceTask, runs: list[tuple[AoTModelConfig, int]], cfg: AoTTrainConfig = AoTTrainConfig(),
          progress: bool = True, desc: str = "training") -> list[TrainResult]:
    """Train the K (model, seed) `runs` together on `task`; every model's final scores and
    weights, in the order of `runs`. The training section holds `final_accuracy` and
    `final_loss` (on all T_0 sequences) and `batch_accuracy` (the mean accuracy of the last
    BATCH_ACCURACY_STEPS training batches, the authors' score)."""
    cfg.validate()
    for model_cfg, _ in runs:
        model_cfg.validate()
    device = resolve_device(cfg.device)
    state = prepare(task, runs, cfg, device)
    sections, stack, on_device = state.sections, state.stack, state.task

    curves: list[list[dict]] = [[] for _ in runs]
    start = time.perf_counter()

    def record(step: int, result: dict) -> list[float]:
        loss, acc = result["loss"].tolist(), result["accuracy"].tolist()
        bad = [k for k, v in enumerate(loss) if not math.isfinite(v)]
        if bad:
            model_cfg, seed = runs[bad[0]]
            raise ValueError(f"step {step}: model {model_cfg.name} seed {seed} diverged (non-finite loss); "
                             "lower the learning rate.")
        for k in range(len(runs)):
            curves[k].append({"step": step, "loss": loss[k], "accuracy": acc[k],
                              "seconds": round(time.perf_counter() - start, 2)})
        return acc

    step_once = Step(state.step(), use_cuda_graph(cfg.cuda_graph, device))
    batch_correct = torch.zeros(len(runs), device=device)  # summed over the last BATCH_ACCURACY_STEPS batches
    window = min(BATCH_ACCURACY_STEPS, cfg.steps)
    bar = progress_bar(total=cfg.steps, disable=not progress, desc=f"{desc} ({count(len(runs), 'model')})", unit="step")
    for step in range(cfg.steps):
        logits, counts = step_once()  # this batch's logits before the update [K, T_0, N], counts [K, T_0]
        if step >= cfg.steps - window:  # this batch's accuracy, before the step (as the authors log it)
            batch_correct += (on_device.sequence_correct(logits) * counts).sum(-1)
        if step % cfg.eval_every == 0:
            acc = record(step, on_device.scores(logits))
            bar.set_postfix(mean_acc=f"{sum(acc) / len(acc):.3f}")
        bar.update(1)
    record(cfg.steps, scores(stack, on_device))
    bar.close()
    weights = {k: v.detach() for k, v in stack.effective().items()}
    batch_accuracy = (batch_correct / (window * cfg.batch_size)).tolist()
    training = {"trainer": "models.aot.trainer", **asdict(cfg), "steps": cfg.steps, "graphed": step_once.graphed}
    return [TrainResult(task, sections[k], stack.checkpoint(k, weights),
                        {**training, "seed": seed, "final_accuracy": curves[k][-1]["accuracy"],
                         "final_loss": curves[k][-1]["loss"], "batch_accuracy": batch_accuracy[k],
                         "head_layout": model_cfg.head_layout, "parameters": model_cfg.parameters(task)},
                        curves[k])
            for k, (model_cfg, seed) in enumerate(runs)]
