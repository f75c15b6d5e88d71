"""Every model's fresh batch at each step, for the factual-recall trainers (models.recall.trainer,
models.recall.shape_trainer): one stream per (task, seed), from the `generator` or the `counter`
sampler (docs/training.md)."""
from __future__ import annotations

import torch

from models.training.result import DATA_SEED_OFFSET
from tasks.counter_sampler import TaskStack
from tasks.factual_recall import FactualRecallTask


def training_batch(task, generators, runs, batch_size):
    """Tokens [K, B, T] and answers [K, B]: one fresh batch per seed, shared by that seed's
    models (a view, not a copy, when every model has the same seed)."""
    batches = {s: task.sample(batch_size, g) for s, g in generators.items()}
    if len(batches) == 1:
        batch = next(iter(batches.values()))
        K = len(runs)
        return batch.tokens.expand(K, *batch.tokens.shape), batch.answers.expand(K, batch_size)
    tokens = torch.stack([batches[s].tokens for _, s in runs])
    answers = torch.stack([batches[s].answers for _, s in runs])
    return tokens, answers


class TrainingData:
    """Every model's fresh batch at each step: tokens [K, B, T] and answers [K, B], one batch
    per (task, seed), shared by the models that have both. The `generator` sampler draws each
    seed's batch from its own torch.Generator in turn (their RNG states are the stream's
    state); `counter` draws all batches in one sample_counter call, each a function of its
    task, seed and the step alone (the step is the stream's state). `task` is one task every
    model learns, or one per model (a stack of tasks; the counter sampler only): each model's
    batch is then drawn at its own task's sizes, in its own token layout."""

    def __init__(self, task: FactualRecallTask | list[FactualRecallTask], runs: list[tuple[float, int]],
                 batch_size: int, device: torch.device, sampler: str):
        tasks = task if isinstance(task, list) else [task] * len(runs)  # [K] each model's
        distinct = list({id(t): t for t in tasks}.values())
        if len(distinct) > 1 and sampler != "counter":
            raise ValueError("models of different tasks train together only with the counter sampler "
                             "(--sampler counter).")
        draws = sorted({(distinct.index(t), seed) for t, (_, seed) in zip(tasks, runs)})  # [U] (task, seed)
        seeds = [seed for _, seed in draws]
        self.task = distinct[0] if len(distinct) == 1 else TaskStack([distinct[i] for i, _ in draws])
        self.runs, self.batch_size, self.counter = runs, batch_size, sampler == "counter"
        self.generators = {} if self.counter else {
            s: torch.Generator(device=device).manual_seed(s + DATA_SEED_OFFSET) for s in seeds}
        self.seeds = torch.tensor([s + DATA_SEED_OFFSET for s in seeds], device=device)  # [U] data seeds
        if self.counter:  # the sampler's tables, on the device before the first step reads them
            self.task.counter_tables(self.seeds.device)
        rows = [draws.index((distinct.index(t), seed)) for t, (_, seed) in zip(tasks, runs)]
        self.rows = None if rows == list(range(len(runs))) else torch.tensor(rows, device=device)  # [K] into [U]

    def batch(self, step: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of step `step` (steps taken so far; the generator sampler ignores it)."""
        if not self.counter:
            return training_batch(self.task, self.generators, self.runs, self.batch_size)
        batch = self.task.sample_counter(self.batch_size, self.seeds, step)  # [U, B, T], [U, B]
        if self.rows is None:
            return batch.tokens, batch.answers
        if len(self.seeds) == 1:  # a view, as training_batch gives
            K = len(self.runs)
            return batch.tokens.expand(K, -1, -1), batch.answers.expand(K, -1)
        return batch.tokens[self.rows], batch.answers[self.rows]
