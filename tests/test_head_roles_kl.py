"""Head roles in attention-only models and the rank-d KL floor, pinned to values computed by hand."""
import math

import pytest
import torch
import torch.nn.functional as F

from models.aot.config import AoTModelConfig
from models.bridge import build_bridge
from models.section import shapes
from probe.head_roles import THRESHOLD, _variance_shares, head_roles, key_token_table, sequences_run
from probe.hooks import clean_run
from probe.kl_floor import kl_of_logits, rank_d_kl_floor
from tasks.association import AssociationTask

L3 = math.log(3)  # sigmoid(ln 3) = 3/4


# --------------------------------------------------------------------------- a hand-built model
def hand_model():
    """N = 3 tokens, S = 2, three heads of d_head 3 (residual: token one-hot 0-2, position
    indicators 3-4, head 0's output 5-7). The last query's mass on position 0 is sigmoid of
    a score difference set by hand:
      head 0 (position): 3/4 on every sequence;
      head 1 (query token): sigmoid(s_q[t1]), s_q = (0, ln 3, -ln 3) -> 1/2, 3/4, 1/4;
      head 2 (key token):   sigmoid(s_k[t0]), s_k = (ln 3, 0, -ln 3) -> 3/4, 1/2, 1/4.
    Only head 0 writes: the one-hot of the tokens it reads (3/4 t0 + 1/4 t1) to the logits,
    plus a 0.01 bias on token 0, so it predicts t0, the next token of every sequence."""
    task = AssociationTask(n_tokens=3, context=2, next_tokens=[0, 0, 0, 1, 1, 1, 2, 2, 2])
    section = AoTModelConfig(d_model=8, n_heads=3, d_head=3).checkpoint_section(task)
    w = {key: torch.zeros(shape) for key, shape in shapes(section).items()}
    A, r = "blocks.0.attn.", math.sqrt(3)  # scores are divided by sqrt(d_head)
    s_q, s_k = [0.0, L3, -L3], [L3, 0.0, -L3]
    w["pos_embed.W_pos"][0, 3] = w["pos_embed.W_pos"][1, 4] = 1
    w[A + "b_Q"][0, 0], w[A + "W_K"][0, 3, 0] = r * L3, 1  # q . k = ln 3 at position 0, 0 at 1
    w[A + "W_K"][1, 3, 0] = 1
    w[A + "b_Q"][2, 0], w[A + "W_K"][2, 4, 1] = r, 1  # q = r (1, -s_k[t1]), k = (s_k[t], [p = 1])
    for t in range(3):
        w["embed.W_E"][t, t] = 1
        w[A + "W_V"][0, t, t] = w[A + "W_O"][0, t, 5 + t] = w["unembed.W_U"][5 + t, t] = 1
        w[A + "W_Q"][1, t, 0] = r * s_q[t]
        w[A + "W_Q"][2, t, 1], w[A + "W_K"][2, t, 0] = -r * s_k[t], s_k[t]
    w["unembed.b_U"][0] = 0.01
    return build_bridge(section, w), task


@pytest.fixture(scope="module")
def hand():
    return hand_model()


def test_head_roles_on_the_hand_model(hand):
    """Masses, denoising (max - 1/2) / (1/2), total variation from the mean pattern, the
    variance shares (head 1 all query token, head 2 all key token, head 0 constant: no
    share explained, the rest 1), roles at the default threshold, and the mean ablations
    (head 0's mean output is the uniform (1/3, 1/3, 1/3): the 0.01 bias picks token 0,
    right on 3 of 9 sequences; heads 1 and 2 write nothing)."""
    model, task = hand
    roles = head_roles(model, task)
    assert list(roles.columns) == ["head", "mass_pos0", "mass_pos1", "denoising_score", "token_dependence",
                                   "var_key_token", "var_query_token", "var_interaction", "role",
                                   "clean_accuracy", "mean_ablation_accuracy", "accuracy_drop"]
    assert roles["head"].tolist() == [0, 1, 2]
    expected = {"mass_pos0": [3 / 4, 1 / 2, 1 / 2], "mass_pos1": [1 / 4, 1 / 2, 1 / 2],
                "denoising_score": [1 / 2, 1 / 3, 1 / 3],  # head 1, 2: (0 + 1/2 + 1/2) / 3
                "token_dependence": [0, 1 / 6, 1 / 6],  # |m - 1/2| = 0, 1/4, 1/4
                "var_key_token": [0, 0, 1], "var_query_token": [0, 1, 0], "var_interaction": [1, 0, 0],
                "clean_accuracy": [1, 1, 1], "mean_ablation_accuracy": [1 / 3, 1, 1],
                "accuracy_drop": [2 / 3, 0, 0]}
    for column, values in expected.items():
        assert roles[column].tolist() == pytest.approx(values, abs=1e-5), column
    assert THRESHOLD == 0.1 and roles.role.tolist() == ["position", "token", "token"]


def test_head_roles_threshold_is_strict(hand):
    """role is "position" when token_dependence < threshold: head 0's dependence is exactly
    0, so threshold 0 makes it "token"; above 1/6 every head is a position head."""
    model, task = hand
    run = sequences_run(model, task)
    assert head_roles(model, task, threshold=0.0, run=run).role.tolist() == ["token"] * 3
    assert head_roles(model, task, threshold=0.2, run=run).role.tolist() == ["position"] * 3
    assert head_roles(model, task, 0.2).role.tolist() == ["position"] * 3  # threshold is the third parameter


def test_head_roles_uses_the_given_run(hand):
    """A given clean run is what is read: one with its patterns swapped between heads 1 and
    2 swaps their key and query shares."""
    model, task = hand
    run = clean_run(model, task.sequences())
    assert sequences_run(model, task, run) is run
    swapped = type(run)(**{**run.__dict__, "pattern": run.pattern[:, [0, 2, 1]]})
    roles = head_roles(model, task, run=swapped)
    assert roles.var_key_token.tolist() == pytest.approx([0, 1, 0], abs=1e-5)
    assert roles.var_query_token.tolist() == pytest.approx([0, 0, 1], abs=1e-5)
    table = key_token_table(model, task, run=swapped)
    assert table.loc[1].tolist() == pytest.approx([3 / 4, 1 / 2, 1 / 4], abs=1e-6)


def test_key_token_table_on_the_hand_model(hand):
    """Mass on position 0 by the token there, averaged over the query token: head 0 3/4
    throughout, head 1 (1/2 + 3/4 + 1/4) / 3 = 1/2 throughout, head 2 sigmoid(s_k[t])."""
    model, task = hand
    table = key_token_table(model, task)
    assert list(table.columns) == ["t0", "t1", "t2"] and table.index.name == "head"
    assert table.index.tolist() == [0, 1, 2]
    expected = [[3 / 4] * 3, [1 / 2] * 3, [3 / 4, 1 / 2, 1 / 4]]
    assert table.to_numpy().tolist() == [pytest.approx(row, abs=1e-6) for row in expected]


def test_key_token_table_groups_by_the_first_token_with_s_3():
    """With S = 3 the sequences are in base-N order, first token most significant: a head
    whose mass on position 0 is 0.1 t0 + 0.01 t1 + 0.001 t2 (built as a run's pattern) has
    table rows 0.1 t + the mean of the other two terms."""
    model, task = hand_model()
    task3 = AssociationTask(n_tokens=3, context=3)
    seqs = task3.sequences().float()
    mass = 0.1 * seqs[:, 0] + 0.01 * seqs[:, 1] + 0.001 * seqs[:, 2]  # [27]
    run = clean_run(model, task.sequences())
    fake = type(run)(**{**run.__dict__, "pattern": torch.stack([mass, 1 - mass, torch.zeros(27)], -1)[:, None]})
    table = key_token_table(model, task3, run=fake)
    assert table.loc[0].tolist() == pytest.approx([0.011, 0.111, 0.211], abs=1e-6)


# --------------------------------------------------------------------------- variance shares
def test_variance_shares_by_hand_s_2():
    """N = 2, S = 2, mass[t0, t1] in grid order. (0, 1; 2, 3): total variance 5/4, key effect
    +-1 (share 4/5), query effect +-1/2 (share 1/5), no interaction. (1, 0; 0, 1): no main
    effect, all interaction. A constant head: nothing to explain, shares 0 (no NaN)."""
    mass = torch.tensor([[0.0, 1.0, 0.5], [1.0, 0.0, 0.5], [2.0, 0.0, 0.5], [3.0, 1.0, 0.5]])  # [T_0, H]
    shares = _variance_shares(mass, 2, 2)
    assert list(shares) == ["var_key_token", "var_query_token", "var_interaction"]
    assert shares["var_key_token"].tolist() == pytest.approx([4 / 5, 0, 0])
    assert shares["var_query_token"].tolist() == pytest.approx([1 / 5, 0, 0])
    assert shares["var_interaction"].tolist() == pytest.approx([0, 1, 1], abs=1e-6)


def test_variance_shares_by_hand_s_3():
    """S = 3: mass = x[t0] + y[t1] + z[t2] with variances 4, 1, 9 (out of 14): the key token
    (t0) explains 4/14, the query token (t2, the last) 9/14, the middle token goes to the rest."""
    seqs = AssociationTask(n_tokens=2, context=3).sequences().float()
    mass = 4 * seqs[:, 0] + 2 * seqs[:, 1] + 6 * seqs[:, 2]  # +-2, +-1, +-3 around the mean
    shares = _variance_shares(mass[:, None], 2, 3)
    assert shares["var_key_token"].item() == pytest.approx(4 / 14)
    assert shares["var_query_token"].item() == pytest.approx(9 / 14)
    assert shares["var_interaction"].item() == pytest.approx(1 / 14)


def test_variance_shares_interaction_floor_at_zero():
    """var_interaction is 1 - key - query clamped at 0: never negative by rounding. Pure
    key effect: the rest is exactly 0, not a tiny negative number."""
    seqs = AssociationTask(n_tokens=3, context=2).sequences().float()
    for scale in (0.1, 0.3, 0.7, 1.1, 1.9, 2.3):
        shares = _variance_shares((scale * seqs[:, :1]).repeat(1, 2), 3, 2)
        assert (shares["var_interaction"] >= 0).all()


def test_single_position_head_roles():
    """S = 1: all attention is on position 0, so mass_pos0 is 1, the denoising score is
    defined as 0 (no NaN from 1 - 1/S = 0), and the pattern ignores the token."""
    task = AssociationTask(n_tokens=3, context=1, next_tokens=[0, 1, 2])
    section = AoTModelConfig(d_model=3, n_heads=2, d_head=1).checkpoint_section(task)
    w = {key: torch.zeros(shape) for key, shape in shapes(section).items()}
    w["embed.W_E"] = torch.eye(3)
    w["unembed.W_U"] = torch.eye(3)
    roles = head_roles(build_bridge(section, w), task)
    assert roles.mass_pos0.tolist() == [1, 1] and roles.denoising_score.tolist() == [0, 0]
    assert roles.token_dependence.tolist() == [0, 0] and roles.role.tolist() == ["position"] * 2
    assert roles.clean_accuracy.tolist() == [1, 1] and roles.accuracy_drop.tolist() == [0, 0]


# --------------------------------------------------------------------------- KL
def test_kl_of_logits_by_hand_and_against_torch():
    """pi = (1/2, 1/2) against logits (0, ln 3), q = (1/4, 3/4): KL = ln(4/3) / 2; a row
    predicted exactly adds 0, so the mean over the two rows is ln(4/3) / 4. On random rows it
    equals torch's kl_div(log q, log pi, log_target) summed over tokens, averaged over rows."""
    log_pi = torch.tensor([[0.5, 0.5], [0.2, 0.8]], dtype=torch.float64).log()
    logits = torch.tensor([[0.0, L3], [5.0, 5.0 + math.log(4)]], dtype=torch.float64)
    assert kl_of_logits(log_pi, logits).item() == pytest.approx(math.log(4 / 3) / 4, rel=1e-12)
    g = torch.Generator().manual_seed(0)
    log_pi, logits = torch.randn(6, 5, generator=g).log_softmax(-1), 3 * torch.randn(6, 5, generator=g)
    reference = F.kl_div(logits.log_softmax(-1), log_pi, log_target=True, reduction="batchmean")
    assert kl_of_logits(log_pi, logits).shape == () and torch.allclose(kl_of_logits(log_pi, logits), reference)


@pytest.mark.parametrize("d", [0, -1, 1.0, True, "2"])
def test_kl_floor_refuses_bad_d(d):
    with pytest.raises(ValueError, match=r"d must be an integer >= 1, got "):
        rank_d_kl_floor(torch.zeros(2, 3), d)


def two_sequences():
    """The two-sequence N = 3 targets of tests/test_aot_models.py (rank-1 floor about 0.1)."""
    return (2 * torch.tensor([[3.0, -3.0, 0.0], [1.0, 1.0, -2.0]], dtype=torch.float64)).log_softmax(-1)


def test_kl_floor_zero_exactly_from_d_equal_n_minus_1():
    """d = N - 1 = 2 reaches every target: 0.0 without optimising; d = 1 does not."""
    assert rank_d_kl_floor(two_sequences(), 2) == 0.0 and rank_d_kl_floor(two_sequences(), 3) == 0.0
    assert rank_d_kl_floor(two_sequences(), 1, restarts=0) > 0.05


def test_kl_floor_svd_start_is_exact_on_rank_d_targets():
    """Targets whose row-centred log pi has rank 1 (log pi_t = a_t b - logsumexp) are reached by
    the truncated-SVD start itself: KL 0 after a single L-BFGS iteration and no restarts. The
    uncentred log pi has rank 2 (a row shift is added), so the centring is what makes it exact."""
    a = torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64)
    b = torch.tensor([[2.0, -1.0, 0.0, 1.5, -0.5]], dtype=torch.float64)
    log_pi = (a @ b).log_softmax(-1)
    assert torch.linalg.matrix_rank(log_pi).item() == 2
    assert rank_d_kl_floor(log_pi.float(), 1, restarts=0, iterations=1) < 1e-10


def brute_force_rank_1(log_pi: torch.Tensor) -> float:
    """N = 3, d = 1: logits a_t b with b a unit vector (angle theta) of the plane orthogonal to
    (1, 1, 1). Each row's KL is convex in a_t (Newton from 0); theta on a grid, then refined."""
    pi = log_pi.exp()
    u = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64) / math.sqrt(2)
    v = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64) / math.sqrt(6)

    def value(theta):  # [n] -> [n], the best mean KL along each direction
        b = (torch.cos(theta)[:, None] * u + torch.sin(theta)[:, None] * v)[:, None]  # [n, 1, 3]
        a = torch.zeros(len(theta), len(pi), 1, dtype=torch.float64)
        for _ in range(50):
            q = (a * b).softmax(-1)
            grad = ((q - pi) * b).sum(-1, keepdim=True)
            hess = (q * b**2).sum(-1, keepdim=True) - (q * b).sum(-1, keepdim=True) ** 2
            a = a - grad / hess.clamp(min=1e-12)
        return (pi * (log_pi - (a * b).log_softmax(-1))).sum(-1).mean(-1)

    theta = torch.linspace(0, math.pi, 721, dtype=torch.float64)  # b and -b are the same encoder
    centre = theta[value(theta).argmin()]
    return value(centre + torch.linspace(-0.005, 0.005, 1001, dtype=torch.float64)).min().item()


def test_kl_floor_restarts_escape_the_svd_stationary_point():
    """The two-sequence example: row 1's centred log pi is the top singular direction (1, -1, 0)
    and row 2's is orthogonal to it, so the SVD start (row 1 exact, row 2 uniform) is a
    stationary point, where L-BFGS stays: KL(pi_2 || uniform) / 2 = (ln 3 - H(pi_2)) / 2. A
    random restart reaches the global optimum, the brute-force value (about 0.0573); the
    default keeps 4 restarts."""
    log_pi = two_sequences()
    pi_2 = log_pi[1].exp()
    stationary = (math.log(3) + (pi_2 * pi_2.log()).sum().item()) / 2
    assert rank_d_kl_floor(log_pi, 1, restarts=0) == pytest.approx(stationary, abs=1e-9)
    brute = brute_force_rank_1(log_pi)
    assert 0.05 < brute < stationary - 0.1
    assert rank_d_kl_floor(log_pi, 1, restarts=1) == pytest.approx(brute, abs=1e-6)
    assert rank_d_kl_floor(log_pi.float(), 1) == pytest.approx(brute, abs=1e-6)  # float32 targets, defaults


def test_kl_floor_restarts_keep_the_best_and_are_seeded():
    """Stopped early (6 iterations) on the two-sequence example, the SVD start stays at its
    stationary point and each random start ends elsewhere, so the result shows the starts:
    the default is 4 restarts from seed 0, another seed or a fifth restart changes it, the
    same seed repeats it, and more restarts never do worse."""
    log_pi = two_sequences()
    default = rank_d_kl_floor(log_pi, 1, iterations=6)
    assert default < rank_d_kl_floor(log_pi, 1, restarts=0, iterations=6)
    assert default == rank_d_kl_floor(log_pi, 1, restarts=4, iterations=6, seed=0)
    assert default != rank_d_kl_floor(log_pi, 1, restarts=4, iterations=6, seed=1)
    assert rank_d_kl_floor(log_pi, 1, restarts=5, iterations=6) < default


def test_head_roles_shares_are_of_the_mass_on_position_0():
    """With S = 3 (where the mass on position 1 is not 1 - the mass on position 0), head_roles'
    variance shares are those of the last query's mass on position 0 (random weights)."""
    from models.aot.weights import init_aot_weights

    task = AssociationTask(n_tokens=3, context=3)
    cfg = AoTModelConfig(d_model=4, n_heads=2, d_head=2)
    w = {key: 2 * value for key, value in init_aot_weights(cfg, task, 0).items()}
    model = build_bridge(cfg.checkpoint_section(task), w)
    run = sequences_run(model, task)
    roles = head_roles(model, task, run=run)
    shares = _variance_shares(run.pattern.float()[..., 0], 3, 3)
    other = _variance_shares(run.pattern.float()[..., 1], 3, 3)
    for column, value in shares.items():
        assert roles[column].tolist() == pytest.approx(value.tolist(), abs=1e-6)
        assert not torch.allclose(value, other[column], atol=1e-3)


def test_kl_floor_honours_iterations():
    """L-BFGS runs at most `iterations` iterations: two leave the two-sequence example's random
    start short of the optimum that 300 (the default) reach."""
    log_pi = two_sequences()
    converged = rank_d_kl_floor(log_pi, 1, restarts=1)
    assert rank_d_kl_floor(log_pi, 1, restarts=1, iterations=2) > converged + 1e-3
