"""The Zipf laws' exponents (analyses/capacity/zipf/fits.py) and gradient descent over steps on
small memories (analyses/capacity/zipf/dynamics.py)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analyses.capacity.zipf import dynamics, fits
from analyses.capacity.zipf.memory import matrix_scores, zipf_law
from analyses.least_squares import t_cdf, t_quantile
from models.recall.weights import random_directions


@pytest.mark.parametrize("q, dof, value", [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 3, 3.1824),
                                           (0.975, 9, 2.2622), (0.975, 19, 2.0930), (0.975, 30, 2.0423),
                                           (0.95, 4, 2.1318), (0.995, 19, 2.8609), (0.75, 30, 0.6828)])
def test_the_t_quantile_matches_the_tables(q, dof, value):
    assert t_quantile(q, dof) == pytest.approx(value, abs=1e-4)
    assert t_cdf(t_quantile(q, dof), dof) == pytest.approx(q, abs=1e-12)


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 40.0])
def test_the_t_distribution_function_is_the_closed_forms(t):
    theta = math.atan(t / math.sqrt(5))
    closed = {1: 0.5 + math.atan(t) / math.pi, 2: 0.5 + t / (2 * math.sqrt(t * t + 2)),
              3: 0.5 + (math.atan(t / math.sqrt(3)) + math.sqrt(3) * t / (t * t + 3)) / math.pi,
              4: 0.5 + t / (2 * math.sqrt(t * t + 4)) * (1 + 2 / (t * t + 4)),
              5: 0.5 + (theta + math.sin(theta) * math.cos(theta) * (1 + 2 / 3 * math.cos(theta) ** 2)) / math.pi}
    for dof, value in closed.items():
        assert t_cdf(t, dof) == pytest.approx(value, abs=1e-12)
    for dof in (6, 7):  # the longer sums against the density integrated numerically
        x = np.linspace(0, t, 20001)
        density = math.gamma((dof + 1) / 2) / (math.sqrt(dof * math.pi) * math.gamma(dof / 2)) * (1 + x * x / dof) ** (
            -(dof + 1) / 2)
        assert t_cdf(t, dof) == pytest.approx(0.5 + np.trapezoid(density, x), abs=1e-7)


def test_the_t_quantile_refuses_what_it_cannot_compute():
    for q, dof in ((0.975, 0), (0.5, 3), (1.0, 3)):
        with pytest.raises(ValueError, match="t_quantile needs"):
            t_quantile(q, dof)


def test_a_seed_s_slope_needs_three_points_with_an_error():
    x = np.array([10.0, 100.0, 1000.0, 10000.0])
    assert fits.seed_slope(x, 3 * x ** -0.4) == pytest.approx(-0.4)
    assert fits.seed_slope(x, [0.5, 0.0, 0.005, 0.0005]) == pytest.approx(-1.0)  # the zero left out
    assert fits.seed_slope(x, [0.5, 0.0, 0.0, 0.005]) is None
    assert fits.seed_slope(x[:2], [0.5, 0.05]) is None


def test_the_exponent_is_the_mean_of_the_seeds_with_a_student_interval():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    slopes = [-0.5, -0.6, -0.7]
    e = fits.exponent(x, [x ** s for s in slopes])
    assert e.value == pytest.approx(-0.6) and e.seeds == 3
    assert e.half_width == pytest.approx(4.3027 * 0.1 / math.sqrt(3), abs=1e-4)
    assert e.text() == f"-0.60 ± {e.half_width:.2f}"


def test_too_few_points_are_undetermined_not_a_number():
    e = fits.exponent([1.0, 2.0], [[0.5, 0.25], [0.4, 0.2]])
    assert e.value is None and e.half_width is None and e.seeds == 0
    assert e.text() == "undetermined: no seed has 3 points with an error > 0"
    one = fits.exponent([1.0, 2.0, 4.0], [[0.5, 0.25, 0.125], [0.5, 0.0, 0.0]])
    assert one.value == pytest.approx(-1.0) and one.half_width is None and one.seeds == 1
    assert one.text() == "-1.00 (one seed: no interval)"
    assert fits.interval([], "why").text() == "why"


def test_local_exponents_steepen_for_a_faster_than_power_decay():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    local = fits.local_exponents(x, [np.exp(-x), np.exp(-x)])
    assert local == pytest.approx([-1 / math.log(2), -2 / math.log(2), -4 / math.log(2)])
    assert fits.local_exponents(x, [[1.0, 0.5, 0.0, 0.0]]) == [pytest.approx(-1.0), None, None]
    assert fits.local_exponents(x, [[1.0, 0.0, 0.5, 0.25]]) == [None, None, pytest.approx(-1.0)]


@pytest.mark.parametrize("scheme, axis, alpha, value", [
    ("counts", "d", 2.0, -0.25), ("gd", "d", 3.0, -1 / 3), ("threshold", "d", 1.5, -0.5), ("threshold", "d", 3.0, -2.0),
    ("seen", "n", 2.0, -0.5), ("counts", "n", 1.5, -1 / 3), ("adam", "n", 3.0, -2 / 3),
    ("seen", "d", 2.0, None), ("sgd", "d", 2.0, None), ("adam", "d", 2.0, None), ("counts", "n", 1.0, None),
    ("threshold", "d", 0.8, None)])
def test_the_talk_s_exponents(scheme, axis, alpha, value):
    law, text = fits.theory(scheme, axis, alpha)
    assert law == (pytest.approx(value) if value is not None else None)
    texts = {("n", "counts"): "n^-(α-1)/α (Hutter; where the d-term is small)", ("d", "counts"): "d^-(α-1)/(2α)",
             ("d", "gd"): "d^-(α-1)/(2α)", ("d", "threshold"): "d^-(α-1)",
             ("d", "seen"): "faster than any power of d once d >> N",
             ("d", "sgd"): "faster than any power of d once d >> N",
             ("d", "adam"): "none given by the talk"}
    expected = "none drawn: the laws need α > 1" if alpha <= 1 else texts.get((axis, scheme), texts[("n", "counts")])
    assert text == expected


def test_a_fixed_threshold_has_no_d_law_and_seen_once_none_but_faster_than_any_power():
    assert fits.theory("threshold", "d", 2.0, auto_threshold=False) == (None, "none: the law chooses s with n and d")
    assert fits.theory("seen", "d", 2.0)[1] == "faster than any power of d once d >> N"


def test_the_infinite_memory_error_is_the_expected_unseen_mass_with_hutter_s_slope():
    p = zipf_law(2.0, 5).numpy()
    assert fits.infinite_memory_error(p, [0, 3]) == pytest.approx([1.0, float((p * (1 - p) ** 3).sum())])
    big = zipf_law(2.0, 10 ** 5).numpy()
    n = np.array([100.0, 1000.0, 10000.0])
    assert fits.seed_slope(n, fits.infinite_memory_error(big, n)) == pytest.approx(-0.5, abs=0.02)


def test_the_top_tokens_error_is_the_mass_beyond_the_budget_with_the_threshold_d_law():
    p = zipf_law(1.0, 4).numpy()  # 12/25, 6/25, 4/25, 3/25
    assert fits.top_tokens_error(p, [0, 1, 3, 4, 9]) == pytest.approx([1.0, 13 / 25, 3 / 25, 0.0, 0.0])
    big = zipf_law(2.0, 10 ** 6).numpy()
    d = np.array([64.0, 256.0, 1024.0])
    assert fits.seed_slope(d, fits.top_tokens_error(big, d // 8)) == pytest.approx(-1.0, abs=0.03)


# ------------------------------------------------------------------ gradient descent over steps
def _problems():
    """The over-optimisation problem (d = M = 2), and one with d = 3, M = 4 answers of which the
    last never occurs."""
    g = torch.Generator().manual_seed(0)
    E, U = (torch.randn(1, n, 3, generator=g, dtype=torch.float64) for n in (5, 4))
    other = (E, U, zipf_law(1.0, 5), torch.tensor([[0, 2, 1, 0, 2]]))
    return [dynamics.circle_tokens(6, 1.0, [0, 1]), other]


@pytest.mark.parametrize("problem", [0, 1])
def test_descent_is_gradient_descent_on_the_population_loss_recorded_before_each_step(problem):
    E, U, p, answers = _problems()[problem]
    loss, error = dynamics.descent(E, U, p, answers, [0.1, 2.0], 3)
    B = E.shape[0]
    assert loss.shape == error.shape == (B, 2, 3)
    assert torch.allclose(loss[..., 0], torch.full((B, 2), math.log(U.shape[1]), dtype=torch.float64))  # W = 0
    assert torch.allclose(error[..., 0], torch.ones(B, 2, dtype=torch.float64))  # every answer tied: nothing recalled
    for k in range(B):
        for i, lr in enumerate([0.1, 2.0]):
            W = torch.zeros(E.shape[-1], E.shape[-1], dtype=torch.float64)
            for t in range(3):
                W.requires_grad_()
                population = (p * F.cross_entropy(matrix_scores(W[None, None], E[k:k + 1], U[k:k + 1])[0, 0],
                                                   answers[k], reduction="none")).sum()
                assert float(loss[k, i, t]) == pytest.approx(population.item(), abs=1e-12)
                (grad,) = torch.autograd.grad(population, W)
                W = (W - lr * grad).detach()
    assert dynamics.descent(E, U, p, answers, [1.0], 1)[0].shape == (B, 1, 1)  # one step is a run


def test_orthogonal_tokens_are_recalled_after_one_step_and_a_large_step_wins_on_correlated_ones():
    loss, error = dynamics.descent(*dynamics.two_tokens(0.0, 0.75), [0.1, 10.0], 30)
    assert (error[0, :, 1:] == 0).all() and (loss[0].diff(dim=-1) < 0).all()  # any step size, no oscillation
    loss, error = dynamics.descent(*dynamics.two_tokens(0.95, 0.75), [1.0, 10.0], 60)
    perfect = [int(np.flatnonzero(e.numpy() == 0)[0]) for e in error[0]]
    assert perfect[1] < perfect[0]  # the large step reaches perfect accuracy sooner ...
    assert (loss[0, 1].diff() > 0).sum() > 2 and (loss[0, 0].diff() > 0).sum() == 0  # ... oscillating on the way


def test_the_problems_are_the_authors_and_refuse_bad_input():
    E, U, p, answers = dynamics.two_tokens(0.6, 0.7)
    assert float(E[0, 0] @ E[0, 1]) == pytest.approx(0.6) and torch.allclose(E[0].norm(dim=-1), torch.ones(2).double())
    assert p.tolist() == pytest.approx([0.7, 0.3]) and answers.tolist() == [[0, 1]]
    assert torch.equal(U[0], torch.eye(2).double())
    E, U, p, answers = dynamics.circle_tokens(5, 2.0, [3, 4])
    assert E.shape == (2, 5, 2) and torch.allclose(E.norm(dim=-1), torch.ones(2, 5).double())
    assert answers.tolist() == [[0, 1, 0, 1, 0]] * 2 and torch.allclose(p, zipf_law(2.0, 5))
    assert torch.equal(E[0], random_directions(5, 2, "sphere", torch.Generator().manual_seed(3)).double())
    assert dynamics.circle_tokens(2, 1.0, [0])[0].shape == (1, 2, 2)
    for bad in ((1.0, 0.5), (-1.0, 0.5), (0.5, 0.0), (0.5, 1.0)):
        with pytest.raises(ValueError, match="two tokens need"):
            dynamics.two_tokens(*bad)
    with pytest.raises(ValueError, match="N \\(tokens\\) must be >= 2"):
        dynamics.circle_tokens(1, 1.0, [0])
    with pytest.raises(ValueError, match="descent needs"):
        dynamics.descent(E, U, p, answers, [0.0], 3)
    with pytest.raises(ValueError, match="descent needs"):
        dynamics.descent(E, U, p, answers, [1.0], 0)


@pytest.mark.parametrize("tokens", [3, 4, 9])
def test_the_best_error_is_the_smallest_over_every_direction_and_below_training(tokens):
    E, U, p, answers = dynamics.circle_tokens(tokens, 1.0, list(range(12)))
    best = dynamics.best_error(E, p, answers)
    angles = torch.linspace(0, 2 * math.pi, 20001, dtype=torch.float64)
    gamma = torch.stack([angles.cos(), angles.sin()], -1)  # [A, 2]
    predicted_zero = (E @ gamma.T) > 0  # [K, N, A]
    wrong = predicted_zero != (answers == 0)[..., None]
    assert torch.allclose(best, (wrong.double() * p[None, :, None]).sum(1).amin(-1))
    _, error = dynamics.descent(E, U, p, answers, [1.0], 200)
    assert (best <= error[:, 0].amin(-1) + 1e-12).all()
    with pytest.raises(ValueError, match="^best_error is for d = 2.$"):
        dynamics.best_error(torch.zeros(1, 3, 3), p[:3], answers[:1, :3])
