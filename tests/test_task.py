"""Sampler invariants and bad-argument refusals of tasks/factual_recall.py; the task protocol."""
import pytest
import torch

from tasks import TASKS, Task, task_from_config
from tasks.association import AssociationTask, DistributionTask
from tasks.factual_recall import FactualRecallTask


def sample(task, n=4096, seed=0):
    return task.sample(n, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("T", [3, 4, 12, 32])
def test_one_subject_one_relation_distinct_positions_eos_last(T):
    task = FactualRecallTask(10, 5, 3, 7, T)
    b = sample(task)
    S, R = task.n_subjects, task.n_relations
    is_subject = b.tokens < S
    is_relation = (b.tokens >= S) & (b.tokens < S + R)
    assert (is_subject.sum(1) == 1).all() and (is_relation.sum(1) == 1).all()
    rows = torch.arange(len(b))
    assert (b.subject_pos != b.relation_pos).all()
    assert (b.tokens[rows, b.subject_pos] == b.subjects).all()
    assert (b.tokens[rows, b.relation_pos] == S + b.relations).all()
    assert (b.tokens[:, -1] == task.eos).all() and (b.tokens[:, :-1] != task.eos).all()
    assert (b.subject_pos < T - 1).all() and (b.relation_pos < T - 1).all()
    # either order, every position used
    assert (b.subject_pos < b.relation_pos).any() and (b.subject_pos > b.relation_pos).any()
    assert set(b.subject_pos.tolist()) == set(range(T - 1))


def test_answers_in_their_relations_block_and_match_the_table():
    task = FactualRecallTask(12, 6, 5, 9, 10, fact_seed=3)
    b = sample(task)
    D = task.answers_per_relation
    assert ((b.answers // D) == b.relations).all()
    assert (b.answers == task.facts[b.subjects, b.relations]).all()
    for r in range(task.n_relations):
        assert set(task.facts[:, r].tolist()) <= set(task.relation_answers(r))


def test_zipf_frequencies_within_tolerance():
    task = FactualRecallTask(8, 4, 2, 5, 6, subject_zipf=1.0, relation_zipf=0.5)
    b = sample(task, n=200_000)
    for drawn, n, alpha in [(b.subjects, 8, 1.0), (b.relations, 4, 0.5)]:
        expected = (torch.arange(1, n + 1.0) ** -alpha)
        expected /= expected.sum()
        observed = torch.bincount(drawn, minlength=n).float() / len(drawn)
        assert torch.allclose(observed, expected, atol=0.005), (observed, expected)


def test_uniform_noise_and_generator_determinism():
    task = FactualRecallTask(4, 2, 2, 6, 16)
    a, b = sample(task, seed=5), sample(task, seed=5)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, sample(task, seed=6).tokens)
    noise = a.tokens[(a.tokens >= 6) & (a.tokens < 12)]
    counts = torch.bincount(noise - 6, minlength=6).float()
    assert (counts / counts.mean() - 1).abs().max() < 0.05


def test_eval_set_is_deterministic():
    task = FactualRecallTask(4, 2, 2, 6, 8)
    assert torch.equal(task.eval_set(100, seed=1).tokens, task.eval_set(100, seed=1).tokens)


def test_structured_facts_and_answer_sets():
    task = FactualRecallTask(16, 4, 8, 20, 32, facts="structured")
    assert task.facts[5, 2].item() == 5 * 8 // 16 + 2 * 8
    assert task.subject_answers(5) == task.facts[5].tolist()
    assert list(task.relation_answers(3)) == list(range(24, 32))
    s, r, a = task.all_facts()
    assert len(s) == task.n_facts == 64 and torch.equal(a, task.facts[s, r])


def test_given_fact_table_round_trips_through_config():
    task = FactualRecallTask(3, 2, 2, 4, 5, facts=[[0, 2], [1, 3], [1, 2]])
    again = FactualRecallTask.from_config(task.to_config())
    assert torch.equal(task.facts, again.facts) and again.d_vocab == 3 + 2 + 4 + 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(seq_len=2), "seq_len must be an integer >= 3"),
    (dict(answers_per_relation=0), "answers_per_relation must be an integer >= 1"),
    (dict(n_subjects=0), "n_subjects must be an integer >= 1"),
    (dict(facts=[[0, 2], [1, 1]]), "fact (1, 1) = 1 lies outside relation 1's answer block 2..3"),
    (dict(facts=[[0, 2]]), "facts must be an S x R = 2 x 2 table"),
    (dict(facts="sorted"), "facts must be 'random', 'structured'"),
    (dict(subject_zipf=-1), "subject_zipf must be a number"),
    (dict(n_noise=0), "n_noise must be >= 1"),
])
def test_bad_arguments_raise_one_clear_sentence(kwargs, message):
    args = dict(n_subjects=2, n_relations=2, answers_per_relation=2, n_noise=3, seq_len=6)
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        FactualRecallTask(**args)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("task", [FactualRecallTask(3, 2, 2, 4, 5), AssociationTask(4, 2, table_seed=1),
                                  DistributionTask(3, 2, target_seed=2, concentration=0.5)], ids=repr)
def test_every_task_satisfies_the_protocol_and_round_trips_by_kind(task):
    assert isinstance(task, Task) and TASKS[task.kind] is type(task)
    config = task.to_config()
    assert config["kind"] == task.kind and config["seq_len"] == task.seq_len
    again = task_from_config(config)
    assert type(again) is type(task) and again.to_config() == config
    assert (again.d_vocab, again.d_vocab_out) == (task.d_vocab, task.d_vocab_out)
    assert again.token_label(task.d_vocab - 1) == task.token_label(task.d_vocab - 1)


def test_task_from_config_defaults_to_factual_recall_and_refuses_unknown_kinds():
    config = FactualRecallTask(3, 2, 2, 4, 5).to_config()
    del config["kind"]  # checkpoints written before kinds existed
    assert isinstance(task_from_config(config), FactualRecallTask)
    with pytest.raises(ValueError, match="task kind 'parity' is not one of factual_recall, association, distribution"):
        task_from_config({**config, "kind": "parity"})
    with pytest.raises(ValueError, match="task section lacks n_tokens, context"):
        task_from_config({**config, "kind": "association"})


@pytest.mark.parametrize("task", [AssociationTask(n_tokens=5, context=2, table_seed=1),
                                  DistributionTask(n_tokens=5, context=2, target_seed=1, concentration=3.0)],
                         ids=["association", "distribution"])
def test_memorisation_tasks_have_the_held_out_api_of_factual_recall(task):
    """eval_set(n, seed, device) and sample(n, generator), as factual recall's: the same
    prompts for a seed, `tokens` [n, S] and `answers` [n] (the next token; the distribution
    task's most likely one), which a model that answers them scores 1 on."""
    held = task.eval_set(32, seed=7)
    assert torch.equal(held.tokens, task.eval_set(32, seed=7).tokens)
    assert not torch.equal(held.tokens, task.eval_set(32, seed=8).tokens)
    assert held.tokens.shape == (32, task.context) and len(held) == 32
    assert torch.equal(held.tokens, task.sequences(held.sequences))
    drawn = task.sample(32, torch.Generator().manual_seed(7))
    assert torch.equal(drawn.tokens, held.tokens) and torch.equal(drawn.answers, held.answers)
    if isinstance(task, AssociationTask):
        expected = task.next_tokens[held.sequences]
    else:
        expected = task.log_targets.argmax(-1)[held.sequences]
    assert torch.equal(held.answers, expected) and held.answers.unique().numel() > 1
    every = task.prompts(torch.arange(task.n_sequences))  # [T_0] prompts
    answering = torch.nn.functional.one_hot(every.answers, task.n_tokens).float() * 50  # [T_0, N] logits
    assert task.scores(answering)["accuracy"] == 1
    assert task.answer_label(int(held.answers[0])) == task.token_label(int(held.answers[0]))
