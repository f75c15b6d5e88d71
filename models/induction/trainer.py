"""The induction trainer: K models (one per learning rate and seed) of one section trained as one
job on fresh batches of the trigger task (Bietti et al. 2023).

Every tensor carries a leading model axis [K, ...]. Each step draws each seed's batch from the
counter sampler (tasks.induction: a function of the seed and the step, the same on every device),
runs the fast forward (models.induction.forward) and sums over the models each one's mean
cross-entropy on its own positions: the outputs from their second occurrence (`in_context`, the
authors' loss_head_only) or every next token (`all`). So each model's gradient and optimizer state
are those of its separate run. SGD with momentum and weight decay, or AdamW (models.optimizer).

Every eval_every steps the models are scored on a held-out set (`scores`); every snapshot_every
steps their weights are kept (the probes over training read them), and with a state folder the
whole training state is saved at every evaluation (the earlier ones deleted but at the snapshot steps,
whose weights a resumed run's snapshots read), from which a run resumes bit-identically.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

import torch

from models.bridge import resolve_device
from models.induction.config import InductionModelConfig, InductionTaskConfig, InductionTrainConfig
from models.induction.forward import forward_for, sequence_logits
from models.induction.weights import init_weights, trainable_keys
from models.section import InductionSection
from models.training.optimizer import Optimizer
from models.training.progress import progress_bar
from models.training.result import DATA_SEED_OFFSET, TrainResult
from models.training.train_state import complete_steps, load_state, remove_partial, restore, save_state
from tasks.induction import InductionBatch, InductionTask

EVAL_SEED = 999  # the held-out set's counter seed (training data use seed + DATA_SEED_OFFSET)


def position_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (nats) at every position: logits [..., T, N], targets [..., T] -> [..., T]."""
    return -logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values [K, B, T] over the positions of mask [K, B, T] per model -> [K] (NaN where none)."""
    mask = mask.float()
    return (values * mask).sum((-1, -2)) / mask.sum((-1, -2))


def scores(w: dict, section: InductionSection, batch: InductionBatch, prefix: str = "",
           forward=sequence_logits) -> dict[str, torch.Tensor]:
    """Each stacked model's scores [K] on a batch every model reads ([B, T]): `in_context_accuracy`
    (targets at counter >= 2), `first_output_accuracy` (counter 1: not yet seen in the sequence),
    `in_context_loss` and `bigram_loss` (counter 0, nats); `forward`: a fast forward of
    models.induction.forward."""
    K = next(iter(w.values())).shape[0]
    with torch.no_grad():
        logits = forward(w, batch.tokens.expand(K, -1, -1), section)  # [K, B, T, N]
        targets, counts = batch.targets.expand(K, -1, -1), batch.counts.expand(K, -1, -1)
        correct = (logits.argmax(-1) == targets).float()  # [K, B, T]
        losses = position_losses(logits, targets)
        return {prefix + "in_context_accuracy": masked_mean(correct, counts >= 2),
                prefix + "first_output_accuracy": masked_mean(correct, counts == 1),
                prefix + "in_context_loss": masked_mean(losses, counts >= 2),
                prefix + "bigram_loss": masked_mean(losses, counts == 0)}


class Training:
    """A run in progress: the K models on one device, their optimizer, data seeds and records."""

    def __init__(self, task: InductionTask, model: InductionModelConfig, cfg: InductionTrainConfig,
                 initial: dict[str, torch.Tensor] | None = None):
        cfg.validate()
        self.task, self.cfg, self.runs = task, cfg, cfg.runs
        self.device = resolve_device(cfg.device)
        self.section = model.section(task)
        initial = [initial or init_weights(self.section, seed) for _, seed in self.runs]
        self.weights = {k: torch.stack([w[k] for w in initial]).to(self.device) for k in initial[0]}  # [K, ...]
        self.forward = forward_for(self.weights, self.section)  # training keeps the form it starts in
        self.trainable = trainable_keys(self.section, cfg.frozen)
        self.joining = list(cfg.frozen) if cfg.frozen_until else []  # frozen until step cfg.frozen_until
        self.snapshot_keys = self.trainable + self.joining  # what a snapshot keeps: every weight that moves
        self.params = {k: self.weights[k].requires_grad_() for k in self.trainable}
        lr = torch.tensor([lr for lr, _ in self.runs], device=self.device)
        self.optimizer = Optimizer(self.params, lr, cfg.optimizer, cfg.momentum if cfg.optimizer == "sgd" else 0.0,
                                   cfg.weight_decay)
        seeds = sorted({seed for _, seed in self.runs})
        self.data_seeds = torch.tensor([s + DATA_SEED_OFFSET for s in seeds], device=self.device)  # [U]
        self.rows = torch.tensor([seeds.index(s) for _, s in self.runs], device=self.device)  # [K] into [U]
        self.held_out = task.eval_set(cfg.eval_size, EVAL_SEED, self.device)
        self.ood = task.eval_set(cfg.eval_size, EVAL_SEED, self.device, ood=True) if task.held_out_outputs else None
        self.step, self.metrics, self.snapshots = 0, [], {}
        self.start = time.perf_counter()

    def train_step(self) -> torch.Tensor:
        """One update of every model on its seed's batch of this step; the summed loss."""
        batch = self.task.sample_counter(self.cfg.batch_size, self.data_seeds, self.optimizer.t)
        tokens, targets, counts = (getattr(batch, f)[self.rows] for f in ("tokens", "targets", "counts"))  # [K, B, T]
        losses = position_losses(self.forward(self.weights, tokens, self.section), targets)  # [K, B, T]
        mask = counts >= 2 if self.cfg.loss == "in_context" else torch.ones_like(counts, dtype=torch.bool)
        loss = ((losses * mask).sum((-1, -2)) / mask.sum((-1, -2)).clamp(min=1)).sum()
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def evaluate(self) -> dict:
        """Score every model at this step and record it; the row."""
        found = scores(self.weights, self.section, self.held_out, forward=self.forward)
        if self.ood is not None:
            found.update(scores(self.weights, self.section, self.ood, "ood_", self.forward))
        values = {k: v.tolist() for k, v in found.items()}
        row = {"step": self.step, "seconds": round(time.perf_counter() - self.start, 2),
               "models": [{"lr": lr, "seed": seed, **{k: v[i] for k, v in values.items()}}
                          for i, (lr, seed) in enumerate(self.runs)]}
        bad = [m for m in row["models"] if not math.isfinite(m["bigram_loss"])]
        if bad:
            raise ValueError(f"step {self.step}: the model of lr {bad[0]['lr']:g}, seed {bad[0]['seed']} diverged "
                             "(non-finite loss); lower the learning rate.")
        self.metrics.append(row)
        return row

    def join(self) -> None:
        """The frozen-until weights join training (at step cfg.frozen_until, the authors' freeze_until)."""
        joining, self.joining = self.joining, []
        self.optimizer.add({k: self.weights[k].requires_grad_() for k in joining})

    def keep_snapshot(self) -> None:
        self.snapshots[self.step] = {k: self.weights[k].detach().to("cpu", copy=True) for k in self.snapshot_keys}

    def save(self, folder: Path) -> None:
        moving = {k: self.weights[k] for k in self.snapshot_keys}  # the frozen-until weights too (snapshots)
        save_state(folder, self.step, moving, self.optimizer, {}, self.metrics, "counter")
        for step in complete_steps(folder)[:-1]:  # resume needs the last state and the snapshot steps' weights
            if not self.snapshot_due(step):
                for suffix in (".json", ".safetensors"):  # the JSON first: never a damaged complete state
                    (folder / f"step_{step:08d}{suffix}").unlink(missing_ok=True)

    def resume(self, folder: Path) -> None:
        """Continue from the last complete state in `folder`, if any (snapshots of earlier steps included)."""
        remove_partial(folder)
        saved = complete_steps(folder)
        if not saved:
            return
        tensors, info = load_state(folder, saved[-1])
        if self.joining and f"sgd.momentum.{self.joining[0]}" in tensors:  # saved after they joined
            self.join()
        self.step, self.metrics = restore(tensors, info, self.params, self.optimizer, {}, "counter")
        for step in saved:
            if self.snapshot_due(step):
                tensors = load_state(folder, step)[0]
                self.snapshots[step] = {k: tensors[f"weights.{k}"] for k in self.snapshot_keys}
        self.start = time.perf_counter() - (self.metrics[-1]["seconds"] if self.metrics else 0.0)

    def snapshot_due(self, step: int) -> bool:
        every = self.cfg.snapshot_every
        return bool(every) and (step % every == 0 or step == self.cfg.steps)

    def results(self, task_cfg: InductionTaskConfig | None, model: InductionModelConfig) -> list[TrainResult]:
        """One TrainResult per model: its final weights, training section, curve and snapshots."""
        final = {k: v.detach().to("cpu") for k, v in self.weights.items()}
        training = {"trainer": "models.induction.trainer", **asdict(self.cfg), "model_config": asdict(model),
                    "task_config": asdict(task_cfg) if task_cfg else None, "steps_run": self.step,
                    "device": str(self.device), "trainable": self.trainable,
                    "batch_seeds": f"seed + {DATA_SEED_OFFSET}", "seconds": self.metrics[-1]["seconds"]}
        out = []
        for i, (lr, seed) in enumerate(self.runs):
            weights = {k: v[i] for k, v in final.items()}
            last = self.metrics[-1]["models"][i]
            curve = [{"step": row["step"], "seconds": row["seconds"], **row["models"][i]} for row in self.metrics]
            snapshots = {s: {**weights, **{k: v[i] for k, v in snap.items()}} for s, snap in self.snapshots.items()}
            out.append(TrainResult(self.task, self.section, weights,
                                   {**training, "lr": lr, "seed": seed, "final_accuracy": last["in_context_accuracy"],
                                    "final_loss": last["in_context_loss"], **{f"final_{k}": v for k, v in last.items()
                                                                              if k not in ("lr", "seed")}},
                                   curve, snapshots))
        return out


def train(task_cfg: InductionTaskConfig, model: InductionModelConfig, cfg: InductionTrainConfig,
          progress: bool = True, state_folder: Path | None = None, task: InductionTask | None = None,
          initial: dict[str, torch.Tensor] | None = None) -> list[TrainResult]:
    """Train the K = len(lr) x len(seed) models together; one TrainResult per model, in the order of
    cfg.runs. With `state_folder`, the training state is saved there at every evaluation and a run
    continues from the last complete one. `initial`: one model's starting weights (CPU) for every
    model, in place of the seeds' initialisation (the seeds still choose the data)."""
    run = Training(task or task_cfg.build(), model, cfg, initial)
    if state_folder:
        run.resume(state_folder)
    bar = progress_bar(total=cfg.steps, initial=run.step, disable=not progress,
                       desc=f"training {len(run.runs)} model{'s' * (len(run.runs) > 1)}", unit="step")
    while True:
        if run.snapshot_due(run.step) and run.step not in run.snapshots:
            run.keep_snapshot()
        if run.step % cfg.eval_every == 0 or run.step == cfg.steps:
            if not run.metrics or run.metrics[-1]["step"] != run.step:
                row = run.evaluate()
                bar.set_postfix(in_context=f"{max(m['in_context_accuracy'] for m in row['models']):.3f}")
                if state_folder:
                    run.save(state_folder)
            if run.step == cfg.steps:
                break
        if run.joining and run.step >= cfg.frozen_until:
            run.join()
        run.train_step()
        run.step += 1
        bar.update(1)
    bar.close()
    return run.results(task_cfg, model)
