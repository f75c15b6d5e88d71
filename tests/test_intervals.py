"""Intervals honest at the edges: a share of 0/1 outcomes gets Wilson's interval (0 of 64 is
[0, 5.7%], 64 of 64 [94.3%, 1]), where a bootstrap of identical outcomes collapses to a point;
other means keep the bootstrap."""
import pandas as pd
import pytest
import torch

from analyses.locate_summary import LocateSummary
from probe import columns
from probe.stats import share_with_interval, wilson_interval, with_interval
from probe.storage import LABELS


def test_wilson_is_honest_at_zero_and_one():
    low, high = wilson_interval(torch.tensor([0.0, 1.0, 0.5]), 64)
    assert low.tolist() == pytest.approx([0.0, 0.9434, 0.3810], abs=1e-4)
    assert high.tolist() == pytest.approx([0.0566, 1.0, 0.6190], abs=1e-4)
    cols = share_with_interval("hit", torch.tensor([[0.0] * 64, [1.0] * 64]))
    assert cols["hit"].tolist() == [0.0, 1.0]
    assert cols["hit_high"][0] == pytest.approx(0.0566, abs=1e-4) and cols["hit_low"][1] == pytest.approx(0.9434,
                                                                                                         abs=1e-4)
    collapsed = with_interval("hit", torch.ones(64))  # what the bootstrap said
    assert collapsed["hit_low"] == collapsed["hit_high"] == 1.0


def test_none_of_n_starts_at_exactly_0_and_all_of_n_ends_at_exactly_1_for_every_n():
    n = torch.arange(1, 201)  # [200]: centre - half cancels to float noise at some n on any CPU
    none_low, _ = wilson_interval(torch.zeros(200), n)
    _, all_high = wilson_interval(torch.ones(200), n)
    assert (none_low == 0).all() and (all_high == 1).all()


def test_a_share_drops_nan_and_refuses_values_outside_0_1():
    cols = share_with_interval("hit", torch.tensor([1.0, float("nan"), 1.0, 0.0]))
    assert cols["hit"] == pytest.approx(2 / 3)
    assert (cols["hit_low"], cols["hit_high"]) == tuple(x for x in wilson_interval(torch.tensor(2 / 3), 3))
    with pytest.raises(ValueError, match="a share is a mean of values in"):
        share_with_interval("margin", torch.tensor([0.5, 2.0]))


def test_the_summary_of_64_facts_all_answered_has_no_collapsed_interval():
    n = 64
    facts = pd.DataFrame({columns.ACCURACY: [1.0] * n, columns.LABEL: ["mlp"] * 53 + ["both"] * 11,
                          columns.ov_probe(): [1.0] * n, columns.MLP_PROBE: [float("nan")] * n,
                          **{columns.path_accuracy(s): [1.0] * n for s in columns.STORES}})
    heads = pd.DataFrame({"head": [0], "denoising_score": [0.5], "subject_score": [0.4], "relation_score": [0.3]})
    s = LocateSummary.of(facts, heads, "task", {}, 1.0)
    assert s.accuracy == 1.0 and s.accuracy_interval.low == pytest.approx(0.9434, abs=1e-4)
    assert s.accuracy_interval.high == 1.0
    attention = s.label_share_intervals["attention"]
    assert (attention.value, attention.low) == (0.0, 0.0) and attention.high == pytest.approx(0.0566, abs=1e-4)
    assert set(s.label_share_intervals) == set(LABELS) and list(s.recall) == [columns.ov_probe()]
    assert s.to_json()["intervals"] == "wilson"
