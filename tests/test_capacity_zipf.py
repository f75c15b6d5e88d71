"""Associative memories under Zipf data (analyses/capacity/zipf/memory.py, optimisers.py):
the data, the schemes' q(z), the exact error, the read-back of q, and the optimisers' memories
against autograd and torch.optim."""
import math

import pytest
import torch
import torch.nn.functional as F

from analyses.capacity.zipf import memory as mem
from analyses.capacity.zipf import optimisers as opt


def test_the_zipf_law_is_normalised_with_ratios_z_to_the_minus_alpha():
    p = mem.zipf_law(1.5, 50)
    assert p.dtype == torch.float64 and p.shape == (50,)
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float(p[0] / p[1]) == pytest.approx(2 ** 1.5)
    assert float(p[2] / p[5]) == pytest.approx(2 ** 1.5)
    assert torch.allclose(mem.zipf_law(0.0, 4), torch.full((4,), 0.25, dtype=torch.float64))
    assert float(mem.zipf_law(2.0, 1)[0]) == 1.0


@pytest.mark.parametrize("alpha, tokens, message", [(2.0, 0, r"N \(tokens\) must be >= 1, got 0"),
                                                    (-0.5, 10, "the Zipf exponent α must be >= 0")])
def test_the_zipf_law_refuses_bad_input(alpha, tokens, message):
    with pytest.raises(ValueError, match=message):
        mem.zipf_law(alpha, tokens)


def test_embeddings_are_nested_in_d_with_variance_one_over_d():
    small, large = mem.nested_embeddings(400, 24, seed=3, stream=1), mem.nested_embeddings(400, 80, seed=3, stream=1)
    assert small.shape == (400, 24) and large.shape == (400, 80)
    assert torch.allclose(small * math.sqrt(24), large[:, :24] * math.sqrt(80), atol=1e-5)  # the same draw
    assert float(large.var()) == pytest.approx(1 / 80, rel=0.05)
    assert float(small.var()) == pytest.approx(1 / 24, rel=0.05)
    assert not torch.allclose(small, mem.nested_embeddings(400, 24, seed=3, stream=2))  # another stream
    assert not torch.allclose(small, mem.nested_embeddings(400, 24, seed=4, stream=1))  # another seed
    assert mem.nested_embeddings(4, 1, seed=0, stream=1).shape == (4, 1)
    with pytest.raises(ValueError, match="d must be >= 1"):
        mem.nested_embeddings(4, 0, seed=0, stream=1)


def test_the_draw_is_the_one_recorded_sweeps_used():
    """The recorded cells depend on the seeding: block j of stream t of seed s comes from
    random_directions with a generator seeded (3 s + t) * 100003 + j, E from stream 1, U from 2."""
    from models.recall.weights import random_directions

    blocks = [random_directions(6, mem.BLOCK, "gaussian", torch.Generator().manual_seed((3 * 7 + 2) * 100_003 + j))
              for j in range(3)]
    U = torch.cat(blocks, 1)[:, :40] * math.sqrt(mem.BLOCK / 40)
    data = mem.draw(2.0, 9, 6, 5, 40, [7])
    assert torch.equal(data.U[0], U)
    assert torch.equal(data.E[0], mem.nested_embeddings(9, 40, 7, 1))
    assert torch.equal(data.p, mem.zipf_law(2.0, 9))


def test_a_draw_shares_map_and_samples_across_d_and_refuses_one_output():
    a, b = mem.draw(2.0, 30, 4, 200, 8, [5, 6]), mem.draw(2.0, 30, 4, 200, 32, [5, 6])
    assert a.E.shape == (2, 30, 8) and a.U.shape == (2, 4, 8) and a.samples.shape == (2, 200)
    assert torch.equal(a.answers, b.answers) and torch.equal(a.samples, b.samples)
    assert int(a.answers.min()) >= 0 and int(a.answers.max()) < 4 and int(a.samples.max()) < 30
    assert not torch.equal(a.samples[0], a.samples[1])
    # frequent tokens are sampled more: token 1 (index 0) most of all
    assert int(torch.bincount(a.samples.flatten(), minlength=30).argmax()) == 0
    assert mem.draw(2.0, 30, 4, 0, 8, [0]).samples.shape == (1, 0)
    assert mem.draw(2.0, 30, 4, 0, 8, [0]).samples.dtype == torch.long  # the population: no samples
    assert int(mem.draw(2.0, 30, 2, 10, 8, [0]).answers.max()) == 1  # two answers suffice
    with pytest.raises(ValueError, match="M \\(outputs\\) must be >= 2"):
        mem.draw(2.0, 30, 1, 10, 8, [0])


def test_prefix_counts_count_the_first_n_samples():
    samples = torch.randint(7, (3, 50), generator=torch.Generator().manual_seed(0))
    counts = mem.prefix_counts(samples, [1, 10, 50], 7)
    assert counts.shape == (3, 3, 7) and counts.dtype == torch.long
    for k in range(3):
        for i, n in enumerate([1, 10, 50]):
            assert torch.equal(counts[k, i], torch.bincount(samples[k, :n], minlength=7))


COUNTS = torch.tensor([[0, 1, 2, 5, 0, 3]])  # [1, 6]


def test_each_scheme_has_its_own_q():
    assert torch.equal(mem.memory_q(COUNTS, "counts"), torch.tensor([[0.0, 1, 2, 5, 0, 3]]))
    assert torch.equal(mem.memory_q(COUNTS, "seen"), torch.tensor([[0.0, 1, 1, 1, 0, 1]]))
    assert torch.equal(mem.memory_q(COUNTS, "threshold", 1), torch.tensor([[0.0, 0, 1, 1, 0, 1]]))  # s = 2
    assert torch.equal(mem.memory_q(COUNTS, "threshold", 2), torch.tensor([[0.0, 0, 0, 1, 0, 1]]))  # s = 3
    assert torch.equal(mem.memory_q(COUNTS, "threshold", 0), mem.memory_q(COUNTS, "seen"))  # s = 1
    rows = torch.cat([COUNTS, COUNTS])
    assert torch.equal(mem.memory_q(rows, "threshold", torch.tensor([0, 4])),
                       torch.tensor([[0.0, 1, 1, 1, 0, 1], [0, 0, 0, 1, 0, 0]]))  # a cut per row
    with pytest.raises(ValueError, match=r"^the threshold scheme needs s >= 1 \(a cut >= 0\)\.$"):
        mem.memory_q(COUNTS, "threshold", -1)
    with pytest.raises(ValueError, match="^unknown memory scheme 'often': choose counts, seen, threshold.$"):
        mem.memory_q(COUNTS, "often")


def test_the_threshold_cut_stores_at_most_the_budget_and_no_fewer_than_it_must():
    counts = torch.tensor([[9, 0, 4, 4, 1, 7, 2, 0]])
    for budget in range(1, 9):
        cut = mem.threshold_cut(counts, budget)
        stored = int((counts > cut[..., None]).sum())
        assert stored <= budget
        assert cut == 0 or int((counts > cut[..., None] - 1).sum()) > budget  # s - 1 would store too many
        assert not (counts > cut[..., None])[counts == 0].any()  # an unseen token is never stored
    assert mem.threshold_cut(counts, 3).tolist() == [4]  # 9, 7 stored; 4, 4 tie and would make 4
    assert mem.threshold_cut(counts, 100).tolist() == [0]
    assert mem.threshold_cut(counts, 100).dtype == counts.dtype
    stacked = torch.stack([counts, counts.flip(-1), counts * 2])  # [K = 3, S = 1, N = 8]
    assert mem.threshold_cut(stacked, 3).tolist() == [[4], [4], [8]]
    assert mem.threshold_cut(stacked, 8).shape == (3, 1)
    p = mem.zipf_law(2.0, 10)[None]  # the population: the `budget` most frequent tokens
    assert (p > mem.threshold_cut(p, 3)[..., None]).tolist() == [[True] * 3 + [False] * 7]
    with pytest.raises(ValueError, match="at least 1 token"):
        mem.threshold_cut(counts, 0)


def _memory(K=2, S=3, N=12, M=3, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(K, S, N, generator=g)
    answers = torch.randint(M, (K, N), generator=g)
    E, U = torch.randn(K, N, d, generator=g), torch.randn(K, M, d, generator=g)
    return q, answers, E, U


def test_the_outer_memory_is_the_sum_of_q_u_e_and_both_score_forms_agree():
    q, answers, E, U = _memory()
    assert mem.outer_memory(q, answers.clamp(max=1), E, 3).shape == (2, 3, 3, 6)  # M rows, whichever answers occur
    A = mem.outer_memory(q, answers, E, 3)
    W = torch.stack([torch.stack([sum(q[k, s, z] * torch.outer(U[k, answers[k, z]], E[k, z]) for z in range(12))
                                  for s in range(3)]) for k in range(2)])  # [K, S, d, d] by the definition
    assert torch.allclose(U.transpose(1, 2)[:, None] @ A, W, atol=1e-5)  # W = Σ_y u_y a_y^T
    assert torch.allclose(mem.span_scores(A, E, U), mem.matrix_scores(W, E, U), atol=1e-4)
    by_hand = torch.einsum("kym,ksmd,kzd->kszy", U, W, E)  # u_y^T W e_z
    assert torch.allclose(mem.matrix_scores(W, E, U), by_hand, atol=1e-4)


def test_recall_counts_ties_as_errors_and_the_error_sums_p_over_the_wrong_tokens():
    scores = torch.tensor([[[[2.0, 1.0], [1.0, 1.0], [0.0, 3.0], [5.0, 4.0]]]])  # [1, 1, 4, 2]
    answers = torch.tensor([[0, 0, 0, 1]])
    assert mem.recall_wrong(scores, answers).tolist() == [[[False, True, True, True]]]
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    assert mem.recall_error(scores, answers, p).tolist() == [[pytest.approx(0.6, abs=1e-15)]]
    assert mem.recall_error(torch.zeros(1, 1, 4, 2), answers, p).tolist() == [[pytest.approx(1.0)]]  # stores nothing


def test_the_error_is_summed_over_every_token_not_sampled():
    """A wrong token of probability 1e-9 counts exactly its probability: a Monte-Carlo estimate
    over any feasible number of draws reads 0, and differs from run to run elsewhere."""
    N = 2000
    p = mem.zipf_law(2.0, N)
    answers = torch.zeros(1, N, dtype=torch.long)
    scores = torch.zeros(1, 1, N, 2)
    scores[..., 0] = 1.0  # every token recalled ...
    scores[0, 0, N - 1] = torch.tensor([0.0, 1.0])  # ... but the rarest
    assert mem.recall_error(scores, answers, p).item() == p[-1].item()  # ~1.6e-7, to the last bit
    scores[0, 0, 1000:] = torch.tensor([0.0, 1.0])
    assert mem.recall_error(scores, answers, p).item() == pytest.approx(float(p[1000:].sum()), rel=1e-12)
    assert mem.recall_error(scores, answers, p).item() == mem.recall_error(scores, answers, p).item()


def test_the_read_back_q_is_the_scheme_s_q_and_one_step_holds_counts_times_one_minus_one_over_m():
    data = mem.draw(1.5, 20, 4, 300, 64, [0, 1, 2])  # K = 3 seeds, S = 2 sizes
    counts = mem.prefix_counts(data.samples, [30, 300], 20)
    for scheme in ("counts", "seen", "threshold"):
        q = mem.memory_q(counts, scheme, 2)
        A = mem.outer_memory(q, data.answers, data.E, 4)
        held = mem.effective_q(mem.span_scores(A, data.E, data.U), data.answers, data.E, data.U)
        assert torch.allclose(held, q.double(), atol=1e-4 * float(q.max()))
    counts = mem.prefix_counts(data.samples, [1, 30, 300], 20)  # from one sample on
    A = opt.gd_memory(counts, data.answers, data.E, 4)
    held = mem.effective_q(mem.span_scores(A, data.E, data.U), data.answers, data.E, data.U)
    assert torch.allclose(held, counts.double() / counts.sum(-1, keepdim=True) * (1 - 1 / 4), atol=1e-5)


def _cross_entropy_mean(W, E, U, z, answers):
    return F.cross_entropy(E[z] @ W.T @ U.T, answers[z])


def test_one_gradient_step_is_minus_the_gradient_at_zero_on_the_whole_sample():
    data = mem.draw(2.0, 15, 3, 40, 10, [0, 1])
    counts = mem.prefix_counts(data.samples, [7, 40], 15)
    A = opt.gd_memory(counts, data.answers, data.E, 3)  # [K, S, M, d]
    for k in range(2):
        for i, n in enumerate([7, 40]):
            W = torch.zeros(10, 10, requires_grad=True)
            _cross_entropy_mean(W, data.E[k], data.U[k], data.samples[k, :n], data.answers[k]).backward()
            assert torch.allclose(data.U[k].T @ A[k, i], -W.grad, atol=1e-6)


@pytest.mark.parametrize("batch, sizes", [(1, [5, 25]), (3, [2, 5, 25])])
def test_sgd_is_the_plain_loop_on_each_seed(batch, sizes):
    data = mem.draw(1.5, 12, 3, 25, 8, [2, 3])
    A = opt.sgd_memories(data, sizes, lr=0.5, batch=batch)
    for k in range(2):
        W, snapshots = torch.zeros(8, 8, requires_grad=True), {0: torch.zeros(8, 8)}
        for step in range(1, 25 // batch + 1):
            z = data.samples[k, (step - 1) * batch:step * batch]
            (grad,) = torch.autograd.grad(_cross_entropy_mean(W, data.E[k], data.U[k], z, data.answers[k]), W)
            W = (W - 0.5 * grad).detach().requires_grad_()
            snapshots[step] = W.detach()
        for i, n in enumerate(sizes):  # after ⌊n / batch⌋ steps (none for n < batch)
            assert torch.allclose(data.U[k].T @ A[k, i], snapshots[n // batch], atol=1e-5)
    with pytest.raises(ValueError, match="SGD needs a step size > 0 and a batch >= 1, got 0.0 and 1"):
        opt.sgd_memories(data, [5], lr=0.0)
    with pytest.raises(ValueError, match="SGD needs"):
        opt.sgd_memories(data, [5], lr=1.0, batch=0)


def test_adam_runs_each_seed_as_its_own_torch_adam_and_snapshots_whole_steps():
    data = mem.draw(2.0, 12, 3, 30, 6, [0, 1])
    W = opt.adam_memories(data, [4, 10, 30], lr=0.6, batch=4, betas=(0.9, 0.99))
    assert W.shape == (2, 3, 6, 6)
    for k in range(2):
        w = torch.zeros(6, 6, requires_grad=True)
        adam, snapshots = torch.optim.Adam([w], lr=0.6 / 6, betas=(0.9, 0.99)), {0: torch.zeros(6, 6)}
        for step in range(1, 8):
            loss = _cross_entropy_mean(w, data.E[k], data.U[k], data.samples[k, 4 * step - 4:4 * step], data.answers[k])
            adam.zero_grad()
            loss.backward()
            adam.step()
            snapshots[step] = w.detach().clone()
        for i, n in enumerate([4, 10, 30]):  # after ⌊n / 4⌋ steps
            assert torch.allclose(W[k, i], snapshots[n // 4], atol=1e-6)
    assert torch.equal(opt.adam_memories(data, [3], lr=0.6, batch=4)[:, 0], torch.zeros(2, 6, 6))  # no whole step
    assert not torch.equal(opt.adam_memories(data, [3], lr=0.6, batch=1)[:, 0], torch.zeros(2, 6, 6))  # batch one
    for lr, batch in ((0.6, 0), (0.0, 4), (-1.0, 4)):
        with pytest.raises(ValueError, match="Adam needs a step size > 0 and a batch >= 1"):
            opt.adam_memories(data, [4], lr=lr, batch=batch)


def test_sgd_with_a_large_step_holds_about_one_and_one_step_holds_about_p_when_d_is_large():
    """The talk's memory schemes of the optimisers: at d >> N, q(z) of SGD with batch one and a
    large step is nearly flat over the tokens seen, while one large-batch step follows p(z)."""
    data = mem.draw(2.0, 30, 5, 2000, 256, [0])
    counts = mem.prefix_counts(data.samples, [2000], 30)
    seen = counts[0, 0] > 0
    gd = mem.effective_q(mem.span_scores(opt.gd_memory(counts, data.answers, data.E, 5), data.E, data.U),
                         data.answers, data.E, data.U)[0, 0][seen]
    sgd = mem.effective_q(mem.span_scores(opt.sgd_memories(data, [2000], 10.0), data.E, data.U), data.answers,
                          data.E, data.U)[0, 0][seen]
    assert float(gd.max() / gd.min()) > 100  # counts: the most frequent token ~ 1000 times the rarest seen
    assert float(sgd.max() / sgd.min()) < 5
