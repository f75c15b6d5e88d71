"""The induction task's sampler: the authors' generative process (triggers always followed by their
output, pi_b elsewhere, pi_u first), its counter, its held-out outputs, a seed's batch that depends
on its seed and step alone, and bad settings refused in one line."""
import pytest
import torch

from tasks import counter, task_from_config
from tasks.induction import InductionBatch, InductionTask, _draw, text_counts


def draw(task, n=512, seed=3, step=0, ood=False):
    return task.sample_counter(n, torch.tensor([seed]), step, ood)


def test_the_text_has_65_characters_and_counts_that_agree():
    vocabulary, unigrams, bigrams = text_counts("shakespeare")
    assert len(vocabulary) == 65 and len(set(vocabulary)) == 65
    assert {"\n", " ", "e", "E", "?"} <= set(vocabulary)
    assert bigrams.shape == (65, 65) and (bigrams.sum(-1) > 0).all()  # every character has a successor
    # each character's count is its bigram row's (as first) or column's (as second) total, but for file edges
    assert (unigrams - bigrams.sum(-1)).abs().max() <= 42 and (unigrams - bigrams.sum(0)).abs().max() <= 42


def test_a_trigger_is_always_followed_by_its_output_and_the_counter_counts_it():
    task = InductionTask(n_triggers=4, seq_len=64)
    b = draw(task)
    tokens, targets = b.tokens[0], b.targets[0]  # [B, T]
    for s in range(64):
        trig, out = b.triggers[0, s].tolist(), b.outputs[0, s].tolist()
        seen = {q: 0 for q in trig}
        for t in range(64):
            z = tokens[s, t].item()
            if z in seen:
                seen[z] += 1
                assert targets[s, t].item() == out[trig.index(z)]
            assert b.counts[0, s, t].item() == (seen[z] if z in seen else 0)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])  # inputs and targets are one sequence shifted
    assert (b.counts >= 2).float().mean() > 0.1  # in-context predictions are common at T = 64


def test_fixed_triggers_are_the_most_frequent_characters():
    task = InductionTask(n_triggers=3)
    _, unigrams, _ = text_counts("shakespeare")
    assert set(task.fixed_triggers.tolist()) == set(unigrams.argsort(descending=True)[:3].tolist())
    assert task.vocabulary[task.fixed_triggers[0]] in " e"  # space and e lead the counts
    assert (draw(task, 8).triggers[0] == task.fixed_triggers).all()


def test_bigram_positions_follow_pi_b_and_the_first_token_follows_pi_u():
    task = InductionTask(n_triggers=1, seq_len=128)  # the trigger is the space
    b = draw(task, 2048)
    prev, nxt = b.tokens[0], b.targets[0]
    free = b.counts[0] == 0  # [B, T] positions whose next token is drawn from pi_b
    pi_b = task.conditionals
    for i in (43, 58, 0):  # e, t, newline: frequent rows
        rows = free & (prev == i)
        empirical = torch.bincount(nxt[rows], minlength=65).float() / rows.sum()
        assert (empirical - pi_b[i]).abs().max() < 4 * (pi_b[i].max() / rows.sum()).sqrt()
    first = torch.bincount(prev[:, 0], minlength=65).float() / 2048
    assert (first - task.marginal).abs().max() < 0.03


def test_outputs_are_uniform_and_held_out_outputs_split_the_vocabulary():
    outs = draw(InductionTask(n_triggers=5), 4096).outputs[0].flatten()
    counts = torch.bincount(outs, minlength=65).float()
    assert counts.min() > 0 and (counts / counts.mean() - 1).abs().max() < 0.35
    split = InductionTask(n_triggers=5, held_out_outputs=True)
    assert split.n_train_outputs == 48
    assert draw(split, 1024).outputs.max() < 48
    ood = draw(split, 1024, ood=True).outputs
    assert ood.min() >= 48 and len(ood.unique()) == 17
    with pytest.raises(ValueError, match="held_out_outputs"):
        draw(InductionTask(), 4, ood=True)


def test_bigram_outputs_follow_the_triggers_conditional():
    task = InductionTask(n_triggers=1, outputs="bigram")
    q = task.fixed_triggers[0].item()
    outs = draw(task, 8192).outputs[0, :, 0]
    empirical = torch.bincount(outs, minlength=65).float() / 8192
    assert (empirical - task.conditionals[q]).abs().max() < 0.02


def test_random_triggers_are_distinct_and_drawn_from_the_marginals():
    task = InductionTask(n_triggers=5, triggers="random")
    trig = draw(task, 4096).triggers[0]  # [B, K]
    assert all(len(set(row)) == 5 for row in trig.tolist())
    first = torch.bincount(trig[:, 0], minlength=65).float() / 4096  # the first draw is from pi_u itself
    assert (first - task.marginal).abs().max() < 0.03
    assert len(trig.unique()) > 20  # not only the frequent ones
    task.unigrams = torch.ones(65, dtype=torch.long)  # a flat text: a drawn trigger must leave nothing behind
    task._tables.clear()
    assert all(len(set(row)) == 5 for row in draw(task, 256).triggers[0].tolist())


def test_a_seeds_batch_depends_on_its_seed_and_step_alone():
    task = InductionTask(n_triggers=3, seq_len=16, triggers="random")
    seeds = torch.tensor([5, 2 ** 40 + 1, 0])
    together = task.sample_counter(8, seeds, 7)
    for k, seed in enumerate(seeds.tolist()):
        alone = task.sample_counter(8, torch.tensor([seed]), 7)
        for field in ("tokens", "targets", "counts", "triggers", "outputs"):
            assert torch.equal(getattr(together, field)[k], getattr(alone, field)[0])
    assert not torch.equal(task.sample_counter(8, seeds, 8).tokens, together.tokens)
    assert torch.equal(task.eval_set(4, seed=9).tokens, task.eval_set(4, seed=9).tokens)


def test_the_config_round_trips_and_names_characters():
    task = InductionTask("shakespeare", 2, 10, "random", "uniform", True)
    again = task_from_config(task.to_config())
    assert again.to_config() == task.to_config() and isinstance(again, InductionTask)
    bigram = InductionTask("shakespeare", 2, 10, outputs="bigram")
    assert task_from_config(bigram.to_config()).outputs == "bigram"
    assert task.token_label(1) == " " and task.answer_label(0) == "\n"


@pytest.mark.parametrize("kwargs, message", [
    ({"n_triggers": 66}, "n_triggers must be an integer in 1..65"),
    ({"n_triggers": 0}, "n_triggers must be an integer in 1..65"),
    ({"seq_len": 1}, "seq_len T must be an integer >= 2"),
    ({"seq_len": True}, "seq_len T must be an integer >= 2, got True"),
    ({"seq_len": 64.0}, "seq_len T must be an integer >= 2, got 64.0"),
    ({"n_triggers": True}, "n_triggers must be an integer in 1..65 (the vocabulary of 'shakespeare'), got True"),
    ({"outputs": "zipf"}, "outputs must be one of uniform, bigram, got 'zipf'"),
    ({"text": "hamlet"}, "unknown text 'hamlet'; the texts are shakespeare"),
    ({"triggers": "rare"}, "triggers must be one of fixed, random"),
    ({"outputs": "bigram", "held_out_outputs": True},
     "held_out_outputs needs uniform outputs (bigram outputs range over every token)."),
])
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError) as e:
        InductionTask(**kwargs)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_config_whose_vocabulary_differs_from_the_text_is_refused():
    cfg = {**InductionTask().to_config(), "n_tokens": 64}
    with pytest.raises(ValueError, match="n_tokens 64 differs"):
        InductionTask.from_config(cfg)


def test_a_batch_is_the_counter_streams_values_read_in_the_authors_order():
    """The whole batch rebuilt from counter.bits one sequence and one token at a time: values 0..K-1 of a
    sequence draw its triggers (random triggers), K..2K-1 its outputs, 2K its first token from pi_u, 2K + t
    its token t + 1 (pi_b, or the output after a trigger)."""
    for triggers in ("fixed", "random"):
        task = InductionTask(n_triggers=3, seq_len=12, triggers=triggers)
        batch = task.sample_counter(6, torch.tensor([4]), 9)
        K, T, N = 3, 12, task.n_tokens
        values = counter.bits(torch.tensor([4]), 9, 6 * (2 * K + T + 1)).view(6, 2 * K + T + 1).tolist()
        cdf = [int(c) for c in task.unigrams.cumsum(0)]
        rows = [[int(c) for c in row] for row in task.bigrams.cumsum(-1)]

        def pick(cumulative, value):  # the first i with cumulative[i] > floor(value * total / 2^32)
            r = value * cumulative[-1] >> 32
            return next(i for i, c in enumerate(cumulative) if c > r)
        for s, v in enumerate(values):
            if triggers == "fixed":
                trig = task.fixed_triggers.tolist()
            else:
                left, trig = task.unigrams.tolist(), []
                for j in range(K):
                    trig.append(pick([sum(left[:i + 1]) for i in range(N)], v[j]))
                    left[trig[-1]] = 0
            outs = [v[K + j] * N >> 32 for j in range(K)]
            seq = [pick(cdf, v[2 * K])]
            for t in range(1, T + 1):
                seq.append(outs[trig.index(seq[-1])] if seq[-1] in trig else pick(rows[seq[-1]], v[2 * K + t]))
            assert batch.triggers[0, s].tolist() == trig and batch.outputs[0, s].tolist() == outs, (triggers, s)
            assert batch.tokens[0, s].tolist() == seq[:T] and batch.targets[0, s].tolist() == seq[1:], (triggers, s)
        assert batch.tokens.dtype == batch.counts.dtype == batch.outputs.dtype == torch.long


def test_an_exact_draw_reads_the_counts_cumulated():
    """_draw: value v falls in bin i where cdf[i-1] <= floor(v * total / 2^32) < cdf[i] (total = cdf[-1])."""
    values = torch.tensor([0, 2 ** 30 - 1, 2 ** 30, 2 ** 31, 3 * 2 ** 30, 2 ** 32 - 1])
    assert _draw(torch.tensor([1, 2, 4]), values).tolist() == [0, 0, 1, 2, 2, 2]
    assert _draw(torch.tensor([[1, 2, 4], [0, 3, 4]]), torch.tensor([2 ** 30, 2 ** 30])).tolist() == [1, 1]


def test_the_eval_set_is_the_seeds_step_0_batch_and_its_ood_outputs_are_held_out():
    task = InductionTask(n_triggers=3, seq_len=10, held_out_outputs=True)
    batch = task.eval_set(5, seed=8)
    assert len(batch) == 5 and torch.equal(batch.tokens, task.sample_counter(5, torch.tensor([8]), 0).tokens[0])
    ood = task.eval_set(5, seed=8, ood=True)
    assert ood.outputs.min() >= task.n_train_outputs and len(ood) == 5
    moved = batch.to("cpu")
    assert isinstance(moved, InductionBatch) and all(
        torch.equal(getattr(moved, f), getattr(batch, f)) for f in InductionBatch.__dataclass_fields__)
    assert torch.equal(batch.answers, batch.targets)


def test_the_vocabulary_bounds_triggers_and_labels():
    every = InductionTask(n_triggers=65, seq_len=2)  # K = N and T = 2 are allowed
    assert len(every.fixed_triggers) == 65 and every.seq_len == 2
    random = InductionTask(n_triggers=3, triggers="random")
    assert random.fixed_triggers.dtype == torch.long and len(random.fixed_triggers) == 0
    assert every.fixed_triggers.dtype == torch.long
    with pytest.raises(ValueError, match=r"^token id 65 is outside the vocabulary 0\.\.64\.$"):
        every.token_label(65)


def test_the_config_names_every_setting_and_reads_the_defaults():
    task = InductionTask("shakespeare", 2, 10, "random", "uniform", True)
    assert task.to_config() == {"kind": "induction", "text": "shakespeare", "n_tokens": 65, "n_triggers": 2,
                                "seq_len": 10, "triggers": "random", "outputs": "uniform", "held_out_outputs": True}
    authors = InductionTask()  # the authors' example: K = 5 fixed triggers, T = 256, uniform outputs
    assert (authors.n_triggers, authors.seq_len, authors.triggers, authors.outputs) == (5, 256, "fixed", "uniform")
    least = InductionTask.from_config({"kind": "induction", "text": "shakespeare", "n_triggers": 2, "seq_len": 10})
    assert (least.triggers, least.outputs, least.held_out_outputs) == ("fixed", "uniform", False)
    assert repr(task) == ("InductionTask(shakespeare, N=65, K=2 random triggers, T=10, uniform outputs, "
                          "held-out outputs)")
    assert repr(least) == "InductionTask(shakespeare, N=65, K=2 fixed triggers, T=10, uniform outputs)"
    with pytest.raises(ValueError, match=r"^task kind 'recall' is not 'induction'\.$"):
        InductionTask.from_config({"kind": "recall"})
    with pytest.raises(ValueError, match=r"^task section lacks n_triggers, seq_len\.$"):
        InductionTask.from_config({"kind": "induction", "text": "shakespeare"})
    with pytest.raises(ValueError, match=r"^the out-of-distribution test needs a task with held_out_outputs\.$"):
        least.eval_set(2, ood=True)
