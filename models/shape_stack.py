"""Models of different shapes and tasks as one stack: each zero-padded to the stack's largest shape.

Cells of a sweep that share the sequence length and every other model and training option
but differ in heads H, head size d_h, MLP width m, embedding size d and the task (S, R, D,
N, its fact table and frequencies) train as one stack (models.shape_trainer.train_shapes).
Each model is initialised at its own shape and task (init_weights, the same draws as alone)
and zero-padded to the largest H, d_h, m, d, vocabulary V and answer count O. A padded head
has zero W_Q, W_K, W_V and W_O (a padded d_h axis zero columns and rows of them): it scores
zero and writes nothing. A padded MLP unit has a zero W_in column, b_in entry and W_out row:
relu(0) = 0 and it writes nothing. A padded residual axis is zero in every embedding and
written by no weight, so it stays zero. A padded token has a zero embedding and is never in
the model's prompts (each keeps its own token ids, the corner of the padded vocabulary). A
padded answer has a zero unembedding column and a bias of -inf: its logit is -inf, so the
softmax gives it probability exactly zero, the cross-entropy's gradient there is zero and
argmax never picks it. The trainable padding's gradients are zero already; the masks here
make that exact whatever the arithmetic, so the padding and its Adam moments stay zero. The
attention's scale is each model's own 1/sqrt(d_h) (`query_scales`).

Which cells share a stack: `buckets` groups them so that padding wastes little and each
stack fits a device-memory budget (`stack_bytes`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, replace

import torch

from models.config import RunConfig
from models.section import ModelSection
from models.weights import shapes

# What a stack's cells may differ in, besides the task (all but its sequence length).
MODEL_FREE = ("d_model", "n_heads", "d_head", "d_mlp", "init_scale")
TRAIN_FREE = ("lr", "seed", "steps", "eval_every", "target_accuracy", "snapshots_per_octave")
UNEMBED_BIAS = "unembed.b_U"  # its padded answers are -inf


def stack_differences(run: RunConfig, first: RunConfig) -> list[str]:
    """The fields in which `run` differs from `first` that a stack's runs must share: the
    sequence length, the model options other than d, H, d_h, m and init_scale, the training
    fields other than lr, seed, steps, eval_every, target_accuracy and snapshots_per_octave,
    and the sampler where the tasks differ (only the counter sampler draws a stack of tasks)."""
    differ = ["task.seq_len"] * (run.task.seq_len != first.task.seq_len)
    differ += [f"model.{k}" for k, v in asdict(run.model.resolved()).items()
               if k not in MODEL_FREE and v != getattr(first.model.resolved(), k)]
    differ += [f"train.{k}" for k, v in asdict(run.train).items()
               if k not in TRAIN_FREE and v != getattr(first.train, k)]
    if run.task != first.task and "generator" in (run.train.sampler, first.train.sampler):
        differ += ["task (a stack of tasks needs the counter sampler)"]
    return differ


def check_stackable(runs: list[RunConfig]) -> None:
    """Refuse runs that cannot share a stack (stack_differences), in one line."""
    if not runs:
        raise ValueError("train_shapes needs at least one run.")
    for i, run in enumerate(runs[1:], 1):
        differ = stack_differences(run, runs[0])
        if differ:
            raise ValueError(f"run {i} cannot share a stack with run 0: they differ in {', '.join(differ)}.")


def sizes(section: ModelSection) -> tuple[str, ...]:
    """The model section's fields that padding changes: d, H, d_h, m unless attention-only,
    the vocabulary V and the answer count O."""
    return ("d_model", "n_heads", "d_head") + (() if section.attn_only else ("d_mlp",)) + ("d_vocab", "d_vocab_out")


def padded_section(sections: list[ModelSection]) -> ModelSection:
    """The stack's model section: the largest of each of `sections`' sizes."""
    return replace(sections[0], **{k: max(getattr(s, k) for s in sections) for k in sizes(sections[0])})


def _corner(shape: torch.Size | tuple[int, ...]) -> tuple[slice, ...]:
    """Index of a tensor of `shape` in the top corner of a padded one."""
    return tuple(slice(0, n) for n in shape)


def pad(weights: dict[str, torch.Tensor], section: ModelSection) -> dict[str, torch.Tensor]:
    """One model's checkpoint dict (or part of it) zero-padded to the shapes of the
    (larger) model section `section`; the padded answers' bias is -inf."""
    target = shapes(section)
    padded = {key: t.new_full(target[key], -math.inf if key == UNEMBED_BIAS else 0.0) for key, t in weights.items()}
    for key, t in weights.items():
        padded[key][_corner(t.shape)] = t
    return padded


def unpad(weights: dict[str, torch.Tensor], section: ModelSection) -> dict[str, torch.Tensor]:
    """A padded model's checkpoint dict (or part of it) cut back to its own model section."""
    own = shapes(section)
    return {key: t[_corner(own[key])].contiguous() for key, t in weights.items()}


def gradient_masks(sections: list[ModelSection], keys: list[str]) -> dict[str, torch.Tensor]:
    """For each of `keys` that some model pads: 1 on each model's own entries, 0 on its
    padding, [K, *padded shape] (CPU float32)."""
    section = padded_section(sections)
    masks = {key: torch.stack([pad({key: torch.ones(shapes(s)[key])}, section)[key] for s in sections])
             for key in keys}
    return {key: mask for key, mask in masks.items() if not bool(mask.all())}


def query_scales(sections: list[ModelSection]) -> torch.Tensor | None:
    """Each model's attention scale 1/sqrt(d_h) [K] (CPU float32); None when every d_h is
    the same (the forward then uses the stack's own)."""
    if len({s.d_head for s in sections}) == 1:
        return None
    return torch.tensor([1 / math.sqrt(s.d_head) for s in sections])

