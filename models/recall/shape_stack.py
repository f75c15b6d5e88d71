"""Models of different shapes and tasks as one stack: each zero-padded to the stack's largest shape.

Cells of a sweep that share the sequence length and every other model and training option
but differ in heads H, head size d_h, MLP width m, embedding size d and the task (S, R, D,
N, its fact table and frequencies) train as one stack (models.recall.shape_trainer.train_shapes).
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

from models.recall.config import RunConfig
from models.recall.weights import parameter_count, trainable_keys
from models.section import ModelSection, shapes

# What a stack's cells may differ in, besides the task (all but its sequence length).
MODEL_FREE = ("d_model", "n_heads", "d_head", "d_mlp", "init_scale")
TRAIN_FREE = ("lr", "seed", "steps", "eval_every", "target_accuracy", "give_up", "snapshots_per_octave")
UNEMBED_BIAS = "unembed.b_U"  # its padded answers are -inf


def stack_differences(run: RunConfig, first: RunConfig) -> list[str]:
    """The fields in which `run` differs from `first` that a stack's runs must share: the
    sequence length, the model options other than d, H, d_h, m and init_scale, the training
    fields other than lr, seed, steps, eval_every, target_accuracy, give_up and snapshots_per_octave,
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
    if runs[0].model.n_layers != 1:  # padding and the stack's forward know one block
        raise ValueError(f"a stack of shapes trains one-layer models; got n_layers {runs[0].model.n_layers}.")
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



# ------------------------------------------------------------------ buckets and memory
BYTES = 4  # float32
INDEX_BYTES = 8  # int64 tokens and counter values
MEMORY_FRACTION = 0.8  # of the free device memory: the default budget on CUDA


def run_section(run: RunConfig) -> ModelSection:
    """The run's config.json model section, at its own task's sizes (read from the task's
    config: the task, its fact table, is not built)."""
    return run.model.checkpoint_section(run.task)


def stack_bytes(runs: list[RunConfig]) -> int:
    """An estimate of the device memory (bytes) a stack of `runs` (stackable) holds at its
    peak (_estimate). Its dominant terms are the [K, H, B, V] attention buffer of the step
    and of the evaluation (B: batch and held-out size), the weights and Adam's state."""
    return _estimate([run_section(run) for run in runs], runs)


def stack_parts(runs: list[RunConfig]) -> dict[str, int]:
    """stack_bytes by part (bytes): `weights` (with gradients and Adam's state), `held-out
    prompts`, the `training step`'s activations and the `evaluation`'s."""
    return _parts([run_section(run) for run in runs], runs)


def _estimate(sections: list[ModelSection], runs: list[RunConfig]) -> int:
    """The device bytes of a stack of `runs`, their model sections given (_parts)."""
    return sum(_parts(sections, runs).values())


def _parts(sections: list[ModelSection], runs: list[RunConfig]) -> dict[str, int]:
    """The device bytes of a stack of `runs` by part, their model sections given: the weights; the
    trainable ones' gradients, two Adam moments and gradient masks; Adam's temporaries (three of
    the largest trainable tensor); and the step's and the evaluation's activations at once (a
    step captured in a CUDA graph keeps its memory while the evaluation runs)."""
    counts = [len(run.train.runs) for run in runs]
    padded, K, cfg = padded_section(sections), sum(counts), runs[0].train
    shape = shapes(padded)
    trained = [math.prod(shape[key]) for key in trainable_keys(shape, runs[0].model, cfg.freeze_ov)]
    weights = sum(math.prod(s) for s in shape.values()) + 4 * sum(trained) + 3 * max(trained, default=0)
    return {"weights": K * BYTES * weights,
            "held-out prompts": K * cfg.eval_size * padded.n_ctx * INDEX_BYTES,  # each model's own (at most)
            "training step": _activation_bytes(padded, K, cfg.batch_size, backward=True),
            "evaluation": _activation_bytes(padded, K, cfg.eval_size, backward=False)}


def _activation_bytes(section: ModelSection, K: int, B: int, backward: bool) -> int:
    """The largest buffers of one forward (and backward) of K padded models on B prompts:
    the [K, H, B, V] attention buffer; scores, pattern and their gradients [K, H, B, T]; the
    key and value tables [K, H, d_h, V] and their gradients; queries, head outputs, residual
    stream, MLP and logits [K, B, .] and their gradients; the counter values and tokens
    [K, B, T + 3] (int64, four at once while sampling). Each layer before the last of an L-layer
    model (models.cores.deep) adds its every-position residual stream, queries, keys, values,
    head outputs, scores and MLP [K, B, T, .] and their gradients."""
    H, e, V, T = section.n_heads, section.d_head, section.d_vocab, section.n_ctx
    d, m, O = section.d_model, section.mlp_width, section.d_vocab_out
    passes = 2 if backward else 1
    floats = (H * B * V + 2 * passes * H * B * T + 2 * passes * H * e * V
              + passes * B * (4 * d + 2 * m + 2 * O + 2 * H * e))
    floats += (section.n_layers - 1) * passes * B * T * (4 * d + 4 * H * e + H * T + 2 * m)
    sampling = 4 * B * (T + 3) * INDEX_BYTES if backward else 0
    return K * (BYTES * floats + sampling)


def default_budget(device: torch.device) -> int | None:
    """The memory budget of a stack on `device` (bytes): MEMORY_FRACTION of the free memory
    on CUDA; None (no limit) elsewhere."""
    if device.type != "cuda":
        return None
    return int(MEMORY_FRACTION * torch.cuda.mem_get_info(device)[0])


def buckets(runs: list[RunConfig], memory_budget_bytes: int | None = None) -> list[list[int]]:
    """The runs grouped into stacks, as lists of indices into `runs` (increasing, the stacks
    ordered by their first run). Runs that
    can share a stack (stack_differences) are taken largest first (parameters, d, V) and each
    joins the first stack where, with it, every run keeps at least half the stack's padded
    size in parameters (the paper's count: 4 H d_h d + 2 m d), in d and in vocabulary V, and
    the stack's estimated memory (stack_bytes) fits `memory_budget_bytes` (None: no limit);
    otherwise it starts a stack of its own. A run whose estimate alone exceeds the budget is
    refused (ValueError): no stack is started that would run out of memory."""
    sections = [run_section(run) for run in runs]
    size = {i: (parameter_count(s)["total"], s.d_model, s.d_vocab) for i, s in enumerate(sections)}
    stacks: list[list[int]] = []
    for i in sorted(range(len(runs)), key=lambda i: size[i], reverse=True):
        for members in stacks:
            if not stack_differences(runs[i], runs[members[0]]) and _fits(members + [i], runs, sections,
                                                                            memory_budget_bytes):
                members.append(i)
                break
        else:
            if not _fits([i], runs, sections, memory_budget_bytes):
                need = _estimate([sections[i]], [runs[i]])
                raise ValueError(f"run {i} alone needs an estimated {need / 2 ** 30:.2f} GiB, more than the memory "
                                 f"budget of {memory_budget_bytes / 2 ** 30:.2f} GiB.")
            stacks.append([i])
    return sorted(sorted(members) for members in stacks)


def _fits(members: list[int], runs: list[RunConfig], sections: list[ModelSection], budget: int | None) -> bool:
    """Whether runs `members` make a stack: none below half its padded parameters, d and V,
    and its estimate within `budget`."""
    padded = padded_section([sections[i] for i in members])
    if any(2 * parameter_count(sections[i])["total"] < parameter_count(padded)["total"]
           or 2 * sections[i].d_model < padded.d_model or 2 * sections[i].d_vocab < padded.d_vocab for i in members):
        return False
    return budget is None or _estimate([sections[i] for i in members], [runs[i] for i in members]) <= budget
