"""Whether an induction run fits its device's memory, decided from its configs before anything is
allocated or written: a run that cannot fit is refused in one line (`check_fits`) instead of
ending in an allocator's traceback.

The estimate (float32, 4 bytes a number) is the weights of the K models with their gradients and
optimizer state (and the host's initial copies), plus the larger of a training step's activations
and an evaluation's, plus the token batches. Per position of a batch, a step keeps for its backward
about L (2 H T + 4 d + 3 m) + 3 N numbers (attention scores and patterns, the residual stream and
its projections, the MLP's hidden layer, the logits and their log-softmax); an evaluation, one layer
at a time, 2 H T + 4 d + 2 m + 3 N. Peak resident memory measured on a CPU (the paper preset, 2
steps): the simplified model 1.41 GiB against 1.61 estimated; the generic one with MLPs and Adam
(analyses.induction layers) 4.95 against 4.64.
"""
from __future__ import annotations

import math

import torch

from models.induction.config import InductionModelConfig, InductionTrainConfig
from models.induction.weights import trainable_keys
from models.training.memory import GIB, available_bytes
from tasks.induction import InductionTask

FLOAT, INDEX = 4, 8  # bytes of a weight or activation, of a token
HINTS = {"weights": "--d-model, --d-mlp, or fewer --lr/--seed values",
         "training step": "--batch-size, --seq-len, --d-model or --d-mlp",
         "evaluation": "--eval-size, --seq-len, --d-model or --d-mlp"}


def needed_bytes(task: InductionTask, model: InductionModelConfig, cfg: InductionTrainConfig) -> dict[str, int]:
    """The run's estimated memory by part (bytes): weights, training step, evaluation, batches."""
    section = model.section(task)
    shapes = section.weight_shapes()
    K, B, E, T = len(cfg.runs), cfg.batch_size, cfg.eval_size, task.seq_len
    d, H, m, L, N = section.d_model, section.n_heads, section.d_mlp or 0, section.n_layers, section.d_vocab_out
    every = sum(math.prod(s) for s in shapes.values())
    trained = sum(math.prod(shapes[k]) for k in trainable_keys(section, cfg.frozen))
    states = 2 if cfg.optimizer == "adam" else 1
    return {"weights": FLOAT * K * (2 * every + trained * (1 + states)),
            "training step": FLOAT * K * B * T * (L * (2 * H * T + 4 * d + 3 * m) + 3 * N),
            "evaluation": FLOAT * K * E * T * (2 * H * T + 4 * d + 2 * m + 3 * N),
            "batches": INDEX * T * (6 * K * B + 6 * E)}


def check_fits(task: InductionTask, model: InductionModelConfig, cfg: InductionTrainConfig,
               device: torch.device, available: int | None = None) -> None:
    """Refuse (ValueError, one line) a run whose estimated memory exceeds what `device` has
    available (`available` bytes, default available_bytes(device)), naming its largest part and
    the flags that shrink it; nothing is refused where the memory cannot be read."""
    available = available_bytes(device) if available is None else available
    if available is None:
        return
    parts = needed_bytes(task, model, cfg)
    need = parts["weights"] + parts["batches"] + max(parts["training step"], parts["evaluation"])
    if need > available:
        largest = max(HINTS, key=parts.get)
        raise ValueError(f"this run needs an estimated {need / GIB:.1f} GiB of memory on {device.type} "
                         f"({largest} {parts[largest] / GIB:.1f} GiB), more than the {available / GIB:.1f} GiB "
                         f"available; make it smaller ({HINTS[largest]}).")
