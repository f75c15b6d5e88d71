"""Whether a factual-recall run fits its device's memory, decided before anything is built,
allocated or written: a run that cannot fit is refused in one line (`check_fits`) instead of
ending in an allocator's traceback after writing its first training states.

The estimate is the stack's (models.recall.shape_stack.stack_parts: weights and Adam's state, the
step's and the evaluation's activations) plus the task's own tables (its fact table and
sampling tables, on the host and, for the counter sampler, on the device), read from the
configs alone. It is measured against the memory the system can give now: MemAvailable of
/proc/meminfo on a CPU, the free memory on CUDA (torch.cuda.mem_get_info); where neither can
be read, nothing is refused.
"""
from __future__ import annotations

import torch

from models.recall.config import RunConfig, TaskConfig
from models.recall.shape_stack import BYTES, INDEX_BYTES, stack_parts
from models.training.memory import GIB, available_bytes

VOCABULARY = "a smaller vocabulary (--n-subjects, --n-noise)"
HINTS = {"weights": "--d-model, --d-mlp, --n-heads, fewer --lr/--seed values, or " + VOCABULARY,
         "held-out prompts": "--eval-size", "training step": "--batch-size, --d-model, or " + VOCABULARY,
         "evaluation": "--eval-size, --d-model, or " + VOCABULARY, "task tables": "--n-subjects, --n-relations"}


def task_bytes(task: TaskConfig) -> int:
    """The task's tables (bytes): the fact table [S, R] (int64) and the sampling tables [S]
    and [R] (float64 probabilities, int64 thresholds and their temporaries), on the host, and
    the counter sampler's copy of the fact table and thresholds on the device."""
    S, R = task.n_subjects, task.n_relations
    host = INDEX_BYTES * S * R + 5 * INDEX_BYTES * (S + R) + BYTES * (S + R)
    return host + INDEX_BYTES * S * R + INDEX_BYTES * (S + R)


def needed_bytes(run: RunConfig) -> dict[str, int]:
    """The run's estimated peak memory by part (bytes): stack_parts and the `task tables`."""
    return {**stack_parts([run]), "task tables": task_bytes(run.task)}


def check_fits(run: RunConfig, device: torch.device, available: int | None = None) -> None:
    """Refuse (ValueError, one line) a run whose estimated memory exceeds what `device` has
    available (`available` bytes, default available_bytes(device)), naming the largest part
    and the flags that shrink it."""
    available = available_bytes(device) if available is None else available
    if available is None:
        return
    parts = needed_bytes(run)
    need = sum(parts.values())
    if need > available:
        largest = max(parts, key=parts.get)
        raise ValueError(f"this run needs an estimated {need / GIB:.1f} GiB of memory on {device.type} "
                         f"({largest} {parts[largest] / GIB:.1f} GiB), more than the {available / GIB:.1f} GiB "
                         f"available; make it smaller ({HINTS[largest]}).")
