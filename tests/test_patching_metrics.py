"""probe.metrics on logits written by hand: the logit difference, the last-position loss, and
the patching metrics built on them (per prompt, mean, normalised)."""
import pytest
import torch

from probe.metrics import answer_logit_diff, last_position_loss, logit_diff_metric, loss_metric


def logits(last: list[list[float]]) -> torch.Tensor:
    """[batch, pos 3, d_vocab_out]: `last` at the last position, decoys (9) before it."""
    last = torch.tensor(last)
    return torch.cat([torch.full((len(last), 2, last.shape[1]), 9.0), last[:, None]], dim=1)


CLEAN = logits([[1.0, 4.0, 0.0, 2.0], [3.0, 0.0, 5.0, 1.0]])
CORRUPTED = logits([[1.0, 2.0, 0.0, 2.0], [3.0, 0.0, 3.0, 1.0]])
ANSWERS, RIVALS = torch.tensor([1, 2]), torch.tensor([0, 3])  # clean differences 3, 4; corrupted 1, 2


def test_the_logit_difference_is_answer_minus_rival_at_the_last_position():
    assert answer_logit_diff(CLEAN[:, -1], ANSWERS, RIVALS).tolist() == [3.0, 4.0]
    assert logit_diff_metric(ANSWERS, RIVALS, per_prompt=True)(CLEAN).tolist() == [3.0, 4.0]
    assert logit_diff_metric(ANSWERS, RIVALS)(CLEAN).item() == 3.5


def test_the_normalised_metric_scores_the_corrupted_run_0_and_the_clean_run_1():
    """(diff - corrupted) / (clean - corrupted), with a corrupted value away from 0 so that a
    division by the clean value alone would show."""
    metric = logit_diff_metric(ANSWERS, RIVALS, normalise=(3.5, 1.5))
    assert metric(CLEAN).item() == pytest.approx(1.0) and metric(CORRUPTED).item() == pytest.approx(0.0)
    per_prompt = logit_diff_metric(ANSWERS, RIVALS, per_prompt=True, normalise=(3.5, 1.5))
    assert per_prompt(CLEAN).tolist() == pytest.approx([0.75, 1.25])


def test_the_loss_is_the_cross_entropy_of_the_answers_at_the_last_position():
    expected = [-torch.log_softmax(CLEAN[i, -1], -1)[ANSWERS[i]].item() for i in range(2)]
    assert last_position_loss(CLEAN, ANSWERS, per_prompt=True).tolist() == pytest.approx(expected)
    assert last_position_loss(CLEAN, ANSWERS).item() == pytest.approx(sum(expected) / 2)
    assert loss_metric(ANSWERS)(CLEAN).item() == pytest.approx(sum(expected) / 2)
    assert loss_metric(ANSWERS, per_prompt=True)(CLEAN).tolist() == pytest.approx(expected)
    assert last_position_loss(CLEAN.half(), ANSWERS).dtype == torch.float32  # computed in float32
