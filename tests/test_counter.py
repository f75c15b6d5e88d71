"""The counter sampler: each seed's batch depends on its seed and step alone, all seeds are
drawn in a fixed number of torch calls, and the prompts follow the task's distribution."""
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.recall.training_data import TrainingData
from tasks import counter
from tasks.counter_sampler import TaskStack, counter_prompts
from tasks.factual_recall import FactualRecallTask
from tests.conftest import TEST_DEVICE, triton_on


def mix32_reference(x: int) -> int:
    """mix32 in Python's unbounded integers, wrapped to 32 bits as uint32 arithmetic does."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def test_mix32_is_exact_uint32_arithmetic_in_int64():
    rng = random.Random(0)
    values = [0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1] + [rng.randrange(2 ** 32) for _ in range(1000)]
    mixed = counter.mix32(torch.tensor(values))
    assert mixed.tolist() == [mix32_reference(v) for v in values]
    assert len(set(mixed.tolist())) == len(set(values))  # a bijection


def test_a_seed_draws_the_same_batch_alone_and_in_a_stack():
    task = FactualRecallTask(10, 5, 3, 7, 9, subject_zipf=0.8)
    stack = torch.tensor([5, 2 ** 40 + 3, 0, 3, 7, 1, 2, 9])  # [8] data seeds, one beyond 32 bits
    for step in (0, 1, 1000):
        together = task.sample_counter(64, stack, step)
        for k, seed in enumerate(stack.tolist()):
            alone = task.sample_counter(64, torch.tensor([seed]), step)
            for name in ("tokens", "subjects", "relations", "answers", "subject_pos", "relation_pos"):
                assert torch.equal(getattr(together, name)[k], getattr(alone, name)[0]), (step, seed, name)
    steps = [task.sample_counter(64, stack, step).tokens for step in (0, 1)]
    assert not torch.equal(steps[0], steps[1])  # a fresh batch every step
    assert not torch.equal(steps[0][0], steps[0][3])  # and for every seed
    assert not torch.equal(steps[0][2], steps[0][1])  # seeds 2^40 + 3 and 3 are two seeds


def test_the_test_device_draws_what_the_cpu_draws():
    task = FactualRecallTask(10, 5, 3, 7, 9, subject_zipf=1.1, relation_zipf=0.5)
    seeds = torch.tensor([0, 1, 123456789])
    cpu = task.sample_counter(256, seeds, 17)
    device = task.sample_counter(256, seeds.to(TEST_DEVICE), torch.tensor([17], device=TEST_DEVICE))
    assert torch.equal(device.tokens.cpu(), cpu.tokens) and torch.equal(device.answers.cpu(), cpu.answers)


needs_triton = triton_on(TEST_DEVICE)
FIELDS = ("tokens", "subjects", "relations", "answers", "subject_pos", "relation_pos")


@needs_triton
def test_the_kernel_draws_the_bits_the_torch_operations_draw():
    """counter_prompts as one Triton kernel (interpreted on the CPU) equals its torch form on
    every field: one task shared by every seed and a stack of tasks, uniform and Zipf draws,
    seeds beyond 32 bits and negative, the step as an int and as a device tensor, a batch
    that is not a whole number of the kernel's blocks."""
    shared = FactualRecallTask(10, 5, 3, 7, 9, subject_zipf=0.8)
    stack = TaskStack([shared, FactualRecallTask(3, 3, 4, 6, 9, fact_seed=1),
                       FactualRecallTask(70, 2, 2, 1, 9, relation_zipf=1.1)])
    seeds = torch.tensor([5, 2 ** 40 + 3, -7], device=TEST_DEVICE)
    for draws in (shared, stack):
        for step in (0, 1000, torch.tensor([2 ** 31 + 5], device=TEST_DEVICE)):
            draws.sample_counter(8, seeds, 0)  # the tables, built once
            tables = next(iter(draws._counter_tables.values()))
            ours = counter_prompts(tables, 45, seeds, step, kernel=True)
            theirs = counter_prompts(tables, 45, seeds, step, kernel=False)
            for name in FIELDS:
                assert torch.equal(getattr(ours, name), getattr(theirs, name)), (draws, step, name)


def test_a_model_gets_its_own_seeds_batch_in_any_stack():
    """TrainingData with the counter sampler: a model's batch is its seed's, whatever else trains."""
    task = FactualRecallTask(16, 4, 4, 16, 12)
    runs = [(1e-2, 3), (3e-3, 3), (1e-2, 0), (3e-3, 0), (1e-2, 7)]  # seed-major, seeds not sorted
    together = TrainingData(task, runs, 32, torch.device("cpu"), "counter")
    shared = TrainingData(task, runs[:2], 32, torch.device("cpu"), "counter")  # one seed, two models
    for step in (0, 5):
        tokens, answers = together.batch(step)  # [5, 32, 12], [5, 32]
        for k, run in enumerate(runs):
            alone_tokens, alone_answers = TrainingData(task, [run], 32, torch.device("cpu"), "counter").batch(step)
            assert torch.equal(tokens[k], alone_tokens[0]) and torch.equal(answers[k], alone_answers[0])
        assert torch.equal(shared.batch(step)[0], tokens[:2])


def test_a_stack_of_tasks_draws_each_seeds_batch_at_its_own_task():
    """Row k of a TaskStack's batch is seed k's batch on task k alone, in task k's own token
    layout, whatever the other rows' sizes, frequencies and fact tables."""
    tasks = [FactualRecallTask(10, 5, 3, 7, 9, subject_zipf=0.8), FactualRecallTask(3, 3, 4, 6, 9, fact_seed=1),
             FactualRecallTask(24, 2, 2, 1, 9, relation_zipf=1.1), FactualRecallTask(3, 3, 4, 6, 9, fact_seed=1)]
    seeds = torch.tensor([5, 2 ** 40 + 3, 0, 7])  # [4], one per task
    for step in (0, 1000):
        together = TaskStack(tasks).sample_counter(64, seeds, step)
        for k, (task, seed) in enumerate(zip(tasks, seeds.tolist())):
            alone = task.sample_counter(64, torch.tensor([seed]), step)
            for name in ("tokens", "subjects", "relations", "answers", "subject_pos", "relation_pos"):
                assert torch.equal(getattr(together, name)[k], getattr(alone, name)[0]), (step, k, name)
    with pytest.raises(ValueError, match="one seq_len"):
        TaskStack([tasks[0], FactualRecallTask(10, 5, 3, 7, 12)]).sample_counter(8, seeds[:2], 0)


def test_models_of_different_tasks_get_their_own_batches():
    small, large = FactualRecallTask(4, 4, 4, 8, 12), FactualRecallTask(16, 16, 4, 32, 12)
    runs = [(1e-2, 0), (3e-3, 0), (1e-2, 0), (1e-2, 1)]
    tasks = [small, small, large, large]  # models 0, 1 share a batch; 2 has the same seed on another task
    together = TrainingData(tasks, runs, 32, torch.device("cpu"), "counter")
    tokens, answers = together.batch(3)  # [4, 32, 12], [4, 32]
    for k, (task, run) in enumerate(zip(tasks, runs)):
        alone_tokens, alone_answers = TrainingData(task, [run], 32, torch.device("cpu"), "counter").batch(3)
        assert torch.equal(tokens[k], alone_tokens[0]) and torch.equal(answers[k], alone_answers[0])
    assert not torch.equal(tokens[0], tokens[2])
    with pytest.raises(ValueError, match="only with the counter sampler"):
        TrainingData(tasks, runs, 32, torch.device("cpu"), "generator")


class _Ops(TorchDispatchMode):
    """Counts the torch operations run under it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("subject_zipf", [0.0, 1.1])
def test_k_seeds_take_as_many_torch_calls_as_one(subject_zipf):
    task = FactualRecallTask(16, 4, 4, 16, 12, subject_zipf=subject_zipf)

    def ops(k: int, sampler: str) -> int:
        data = TrainingData(task, [(1e-2, s) for s in range(k)], 32, torch.device("cpu"), sampler)
        data.batch(2)
        with _Ops() as recorder:
            data.batch(3)
        return recorder.count

    assert ops(8, "counter") == ops(1, "counter")
    assert ops(8, "generator") > 7 * ops(1, "generator")  # the count sees per-seed sampling


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's statistic of observed counts against expected probabilities."""
    counts = expected * observed.sum()
    return float(((observed - counts) ** 2 / counts).sum())


def assert_fits(observed: torch.Tensor, expected: torch.Tensor) -> None:
    """The counts fit the probabilities: chi-square within its mean + 5 standard deviations."""
    dof = len(expected) - 1
    assert chi_square(observed.double(), expected.double()) < dof + 5 * (2 * dof) ** 0.5


@pytest.mark.parametrize("zipf", [(0.0, 0.0), (1.1, 0.5)])
def test_counter_prompts_follow_the_tasks_distribution(zipf):
    S, R, D, N, T = 8, 4, 3, 6, 7
    task = FactualRecallTask(S, R, D, N, T, subject_zipf=zipf[0], relation_zipf=zipf[1], fact_seed=2)
    b = task.sample_counter(50_000, torch.tensor([0, 1, 2, 3]), 11)
    tokens, n = b.tokens.flatten(0, 1), 4 * 50_000  # [n, T]
    subjects, relations = b.subjects.flatten(), b.relations.flatten()
    subject_pos, relation_pos = b.subject_pos.flatten(), b.relation_pos.flatten()
    rows = torch.arange(n)
    assert (subject_pos != relation_pos).all() and (subject_pos < T - 1).all() and (relation_pos < T - 1).all()
    assert (tokens[rows, subject_pos] == subjects).all() and (tokens[rows, relation_pos] == S + relations).all()
    assert ((tokens < S).sum(1) == 1).all() and (((tokens >= S) & (tokens < S + R)).sum(1) == 1).all()
    assert (tokens[:, -1] == task.eos).all() and (tokens[:, :-1] != task.eos).all()
    assert (b.answers.flatten() == task.facts[subjects, relations]).all()
    # (s, r) independent with the task's frequencies; the ordered position pair uniform; noise uniform
    joint = task.subject_probs.double()[:, None] * task.relation_probs.double()[None, :]  # [S, R]
    assert_fits(torch.bincount(subjects * R + relations, minlength=S * R), joint.flatten())
    pairs = torch.bincount(subject_pos * (T - 1) + relation_pos, minlength=(T - 1) ** 2).view(T - 1, T - 1)
    off_diagonal = ~torch.eye(T - 1, dtype=torch.bool)
    assert_fits(pairs[off_diagonal], torch.full(((T - 1) * (T - 2),), 1 / ((T - 1) * (T - 2))))
    noise = tokens[tokens >= S + R][tokens[tokens >= S + R] < task.eos]
    assert_fits(torch.bincount(noise - S - R, minlength=N), torch.full((N,), 1 / N))


def test_shortest_prompts_use_both_positions():
    task = FactualRecallTask(3, 2, 2, 0, 3)  # T = 3: subject and relation fill both positions, no noise
    b = task.sample_counter(1000, torch.tensor([0]), 0)
    assert (b.subject_pos + b.relation_pos == 1).all() and (b.tokens[..., -1] == task.eos).all()
    assert set(b.subject_pos.flatten().tolist()) == {0, 1}
