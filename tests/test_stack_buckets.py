"""Buckets: which runs share a padded stack (none below half its stack's size, each stack
within a memory budget), and the memory estimate they rest on."""
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from models.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from models.shape_stack import _activation_bytes, buckets, padded_section, run_section, stack_bytes
from models.shape_trainer import _start_shapes, train_stacks
from models.trainer import evaluate
from tests.test_shape_stack import task_runs


def cell(S: int, d: int, H: int, d_head: int, seq_len: int = 12, seed: int = 0, steps: int = 50) -> RunConfig:
    return RunConfig(task=TaskConfig(n_subjects=S, n_relations=S, answers_per_relation=4, n_noise=2 * S,
                                     seq_len=seq_len),
                     model=ModelConfig(d_model=d, n_heads=H, d_head=d_head, d_mlp=d, parameterisation="authors"),
                     train=TrainConfig(batch_size=64, steps=steps, eval_every=5, eval_size=64, seed=(seed,),
                                       sampler="counter", device="cpu"))


# parameters 6144, 3456, 1536, 3456, 1536; d 32, 24, 16, 24, 16; V 65, 49, 33, 49, 33
CELLS = [cell(16, 32, 4, 8), cell(12, 24, 4, 6), cell(8, 16, 4, 4), cell(12, 24, 4, 6, seq_len=10),
         cell(8, 16, 4, 4, seed=1)]


def test_buckets_keep_every_run_above_half_its_stack_and_apart_from_runs_it_cannot_share_with():
    assert buckets(CELLS) == [[0, 1], [2, 4], [3]]  # 2 has a quarter of 0's parameters; 3 another seq_len
    assert buckets(CELLS[::-1]) == [[0, 2], [1], [3, 4]]  # the same stacks whatever the order given


def test_a_stack_over_the_memory_budget_is_split_before_it_starts():
    pair = stack_bytes(CELLS[:2])
    assert pair == 2 * stack_bytes(CELLS[:1])  # two models at the larger one's size
    assert buckets(CELLS, memory_budget_bytes=pair) == [[0, 1], [2, 4], [3]]
    assert buckets(CELLS, memory_budget_bytes=pair - 1) == [[0], [1], [2, 4], [3]]
    with pytest.raises(ValueError, match=r"^run 0 alone needs an estimated 0\.\d+ GiB, more than the memory budget "
                                         r"of 0\.00 GiB\.$"):
        buckets(CELLS, memory_budget_bytes=stack_bytes(CELLS[:1]) - 1)


def test_train_stacks_trains_each_bucket_as_one_stack_and_returns_the_runs_in_order():
    runs = [replace(r, train=replace(r.train, steps=3)) for r in (CELLS[2], CELLS[0], CELLS[4])]
    results = train_stacks(runs, memory_budget_bytes=stack_bytes(runs[:1]) + stack_bytes(runs[1:2]), progress=False)
    assert [r.section.d_model for r in results] == [16, 32, 16] and [r.training["seed"] for r in results] == [0, 0, 1]
    assert [r.training["stack"]["models"] for r in results] == [2, 1, 2]
    with pytest.raises(ValueError, match="alone needs an estimated"):  # refused before any training
        train_stacks(runs, memory_budget_bytes=1000, progress=False)


def _peak_bytes(step) -> int:
    """The most bytes `step` holds at once beyond what existed before it (the CPU profiler's
    allocations and frees, in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def test_the_estimate_bounds_a_step_and_an_evaluation_from_above():
    """Measured on the CPU: the step's and the evaluation's transient memory lie below their
    estimates, and within a factor of three of them (about two, measured)."""
    runs = task_runs("authors")
    state = _start_shapes(runs, torch.device("cpu"))
    state.step_once()  # the first step allocates Adam's lazily-made buffers, if any
    padded, K, cfg = padded_section([run_section(r) for r in runs]), len(state.lr), runs[0].train
    step = _peak_bytes(state.step_once)
    held_out = _peak_bytes(lambda: evaluate(state.weights, state.held_out.tokens, state.held_out.answers, "softmax",
                                            state.positional, state.query_scale))
    for measured, estimated in ((step, _activation_bytes(padded, K, cfg.batch_size, backward=True)),
                                (held_out, _activation_bytes(padded, K, cfg.eval_size, backward=False))):
        assert measured <= estimated <= 3 * measured, (measured, estimated)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("members", [[0], [0, 1], [2, 4]], ids=["one run", "two shapes", "two seeds"])
def test_the_stack_estimate_bounds_what_a_training_stack_holds_at_once(members):
    """Measured on the CPU: what the stack keeps (weights, Adam's moments, gradients kept, the
    held-out prompts) plus a step's and an evaluation's transient memory lie below
    stack_bytes, and within a factor of three of it (about two, measured)."""
    runs = [CELLS[i] for i in members]
    state = _start_shapes(runs, torch.device("cpu"))
    state.step_once()  # Adam's moments exist from here on
    kept = _bytes([*state.weights.values(), *state.optimizer.m.values(), *state.optimizer.v.values(),
                   *(p.grad for p in state.params.values() if p.grad is not None), state.held_out.tokens,
                   state.held_out.answers])
    step = _peak_bytes(state.step_once)
    held_out = _peak_bytes(lambda: evaluate(state.weights, state.held_out.tokens, state.held_out.answers, "softmax",
                                            state.positional, state.query_scale))
    measured = kept + step + held_out
    assert measured <= stack_bytes(runs) <= 3 * measured, (measured, stack_bytes(runs))
