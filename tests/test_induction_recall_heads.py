"""memory_recall's two readings of a layer with several heads: each head's recall (ours; the studies keep
the best head) and the authors' full-width product, the scores summed over heads (heads="sum"). On a
two-head model whose probe scores are built by hand, the readings differ where they should: a memory
split between the heads is whole only in the sum, and a head that cancels a perfect one spoils only the sum."""
import pytest
import torch

from models.bridge import build_bridge
from models.induction.config import InductionModelConfig, InductionTaskConfig
from models.induction.weights import init_weights
from probe.induction import memory_recall

TASK = InductionTaskConfig(n_triggers=4, seq_len=33).build()  # wk0: 32 queries; wk1: 4 triggers; wo1: 65 tokens
SECTION = InductionModelConfig("generic", 2, 128, 2, 0, False).section(TASK)  # d = 128 > N = 65, d_head 64
INITIAL = init_weights(SECTION, 0)


def split(m: int) -> list[torch.Tensor]:
    """Two heads' scores [m, m]: head 0 ranks the first half's keys first and sends the second half to key 0,
    head 1 the reverse (to key m-1); each head alone recalls half, their sum all."""
    half = m // 2
    first, second = torch.zeros(m, m, dtype=torch.float64), torch.zeros(m, m, dtype=torch.float64)
    for i in range(m):
        own, other = (first, second) if i < half else (second, first)
        own[i, i] = 2.0
        other[i, m - 1 if i < half else 0] = 1.0
    return [first, second]


def cancelled(m: int) -> list[torch.Tensor]:
    """Head 0 recalls every key (2 on the diagonal); head 1 scores the right key -3 and the next one 0.5:
    the best head recalls all, the sum none."""
    eye = torch.eye(m, dtype=torch.float64)
    return [2.0 * eye, -3.0 * eye + 0.5 * eye.roll(1, dims=1)]


def factor(left: torch.Tensor, right: torch.Tensor, scores: torch.Tensor, width: int) -> tuple[torch.Tensor, ...]:
    """A [d, width], B [d, width] with (left A)(right B)^T = scores, for left [m, d], right [m', d] of full row
    rank and scores of rank <= width."""
    U, S, Vh = torch.linalg.svd(scores)
    r = int((S > 1e-9 * S[0]).sum())
    assert r <= width
    F = torch.zeros(len(scores), width, dtype=torch.float64)
    G = torch.zeros(scores.shape[1], width, dtype=torch.float64)
    F[:, :r], G[:, :r] = U[:, :r] * S[:r], Vh[:r].T
    return torch.linalg.pinv(left.double()) @ F, torch.linalg.pinv(right.double()) @ G


def built(probe: str, design) -> dict:
    """INITIAL with one probe's two heads set so that their scores are `design`'s matrices."""
    w = {k: v.clone() for k, v in INITIAL.items()}
    E, P, W_U = (w[k].double() for k in ("embed.W_E", "pos_embed.W_pos", "unembed.W_U"))  # [N, d], [T, d], [d, N]
    triggers = TASK.fixed_triggers
    remapped = sum(E[triggers] @ w["blocks.0.attn.W_V"][h].double() @ w["blocks.0.attn.W_O"][h].double()
                   for h in range(2))  # [K, d]
    left, right, names = {"wk0": (P[1:], P[:-1], ("blocks.0.attn.W_Q", "blocks.0.attn.W_K")),
                          "wk1": (E[triggers], remapped, ("blocks.1.attn.W_Q", "blocks.1.attn.W_K")),
                          "wo1": (E, W_U.T, ("blocks.1.attn.W_V", "blocks.1.attn.W_O"))}[probe]
    for h, scores in enumerate(design(len(left))):
        A, B = factor(left, right, scores, 64)
        w[names[0]][h] = A.float()
        w[names[1]][h] = (B.T if probe == "wo1" else B).float()  # W_O is [d_head, d]
    return w


def readings(w: dict, probe: str) -> tuple[float, float]:
    model = build_bridge(SECTION, w, "cpu", TASK)
    each = memory_recall(model, TASK)
    summed = memory_recall(model, TASK, heads="sum")
    assert summed[summed.probe == probe]["head"].isna().all()  # one row per probe, of no single head
    return each[each.probe == probe].value.max(), summed[summed.probe == probe].value.item()


@pytest.mark.parametrize("probe", ["wk0", "wk1", "wo1"])
def test_a_memory_split_between_heads_is_whole_only_in_the_summed_reading(probe):
    best, summed = readings(built(probe, split), probe)
    assert best < 0.6  # each head recalls its half (16 of 32, 2 of 4, 33 of 65)
    assert summed == 1.0


@pytest.mark.parametrize("probe", ["wk0", "wk1"])
def test_a_head_cancelling_a_perfect_one_spoils_only_the_summed_reading(probe):
    best, summed = readings(built(probe, cancelled), probe)
    assert best == 1.0
    assert summed == 0.0


def test_with_one_head_both_readings_agree():
    section = InductionModelConfig(d_model=64).section(TASK)  # the simplified model: one head per layer
    model = build_bridge(section, init_weights(section, 1), "cpu", TASK)
    each, summed = memory_recall(model, TASK), memory_recall(model, TASK, heads="sum")
    assert each.value.tolist() == summed.value.tolist()


def test_an_unknown_reading_is_refused():
    with pytest.raises(ValueError, match="heads must be one of each, sum"):
        memory_recall(build_bridge(SECTION, INITIAL, "cpu", TASK), TASK, heads="best")
