"""Attribution patching (one backward pass) against activation patching, on the
constructions whose storage is known."""
import math

import pandas as pd
import pytest
import torch

from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build
from probe import columns
from probe.attribution_patching import agreement, attribution_patching
from probe.patching import activation_patching
from probe.prompts import FactPrompts
from tests.test_locate_facts import constructed


def both(kind: str, corrupt: str):
    model, task = constructed(kind)
    prompts = FactPrompts.build(model, task, contexts=2, seed=0)
    return (model, task, prompts, activation_patching(model, task, corrupt, prompts=prompts),
            attribution_patching(model, task, corrupt, prompts=prompts))


@pytest.mark.parametrize("corrupt", ["subject", "relation"])
def test_exact_where_the_logit_difference_is_linear(corrupt):
    """Attention-only: each head's z at EOS reaches the logits linearly, so the estimate is the
    measurement, fact by fact; with an MLP, the MLP output is linear in the logits."""
    model, task, _, patched, attributed = both("attention", corrupt)
    heads = [columns.head(h) for h in range(model.cfg.n_heads)]
    for head in heads:
        estimate = attributed[columns.attribution(corrupt, head)]
        assert (patched[columns.patch(corrupt, head)] - estimate).abs().max() < 1e-4
    assert max(patched[columns.patch(corrupt, head)].abs().max() for head in heads) > 0.1  # heads that restore
    *_, patched, attributed = both("mlp", corrupt)
    assert (patched[columns.patch(corrupt, "mlp")] - attributed[columns.attribution(corrupt, "mlp")]).abs().max() < 1e-4


def test_agrees_with_activation_patching_through_the_mlp():
    """Theorem 4 construction, subjects swapped: the heads feed the ReLU MLP, so the estimate
    is first-order; pooled over components and facts it still follows the measurement. It misses
    where restoring a head switches on the fact's MLP unit, off on the corrupted prompt: the
    gradient there is exactly 0 (float noise of ~1e-6 either side), the measurement 0.5, and
    those 17 of the 160 (fact, component) pairs disagree on every CPU."""
    *_, patched, attributed = both("mlp", "subject")
    pooled = agreement(patched, attributed, "subject").set_index("component").loc["all"]
    assert pooled["correlation"] >= 0.75 and pooled["sign_agreement"] == 143 / 160, pooled


def test_a_value_that_is_0_up_to_float_noise_has_no_sign():
    measured = {"head0": ([0.5, 0.5, -0.5, 0.0, 0.3], [1e-7, -1e-7, 1e-6, -1e-7, 0.2])}
    patched, attributed = pd.DataFrame(index=range(5)), pd.DataFrame(index=range(5))
    for component, (a, b) in measured.items():
        patched[columns.patch("subject", component)] = a
        attributed[columns.attribution("subject", component)] = b
    table = agreement(patched, attributed).set_index("component")
    assert table.loc["head0", "sign_agreement"] == 2 / 5  # the 0 with 0, the 0.3 with 0.2


def test_gradients_whatever_the_parameters_require(tmp_path):
    """The same estimates with the parameters requiring grad or not, and no parameter's .grad set."""
    model, task, prompts, _, frozen = both("mlp", "subject")
    for p in model.parameters():
        p.requires_grad_(True)
    live = attribution_patching(model, task, "subject", prompts=prompts)
    assert all(p.grad is None for p in model.parameters())
    torch.testing.assert_close(torch.tensor(live.to_numpy()), torch.tensor(frozen.to_numpy()), equal_nan=True)
    resid = live[columns.attribution("subject", "resid")]
    assert resid.notna().all() and resid.abs().max() > 0.1


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_the_residual_is_read_at_the_corrupted_token_s_position(kind):
    """Relations swapped: the residual input differs from the clean run only at the relation's
    position, and restoring it there restores everything (activation patching gives 1). Read
    at the subject's position, where clean and corrupted agree, the estimate would be 0."""
    *_, attributed = both(kind, "relation")
    resid = attributed[columns.attribution("relation", "resid")]
    assert resid.notna().all() and (resid - 1).abs().max() < 1e-3, resid.describe()


def test_agreement_per_component_and_pooled_on_values_written_by_hand():
    """Facts where either measure is NaN are left out; signs agree when both are within 0.05 of
    0 or both on one side (0.05 itself is not near 0); a component whose measures spread
    less than 0.001 (the smaller standard deviation) has no correlation."""
    nan = float("nan")
    measured = {  # component: (activation patching, attribution patching) per fact
        "head0": ([0.9, 0.01, 0.05, -0.01, 0.5, -0.01, nan, 0.2], [0.8, -0.04, -0.01, 0.05, -0.01, 0.5, 0.3, nan]),
        "head1": ([0.0, 0.001, 0.002, nan, nan, nan, nan, nan], [0.0, 0.5, 1.0, nan, nan, nan, nan, nan]),
        "mlp": ([0.3, 0.6, nan, nan, nan, nan, nan, 0.1], [0.2, 0.7, nan, nan, nan, nan, nan, nan]),
        "head2": ([0.1, 0.1001, 0.1002, nan, nan, nan, nan, nan], [0.1, 0.5, 0.9, nan, nan, nan, nan, nan]),
    }
    patched = pd.DataFrame({"accuracy": [1.0] * 8})  # a column of another measure
    attributed = pd.DataFrame(index=range(8))
    for component, (a, b) in measured.items():
        for suffix in ("", "_low", "_high"):
            patched[columns.patch("subject", component) + suffix] = a
            attributed[columns.attribution("subject", component) + suffix] = b
    table = agreement(patched, attributed).set_index("component")  # corrupt: subject, the default
    assert list(table.index) == ["head0", "head1", "mlp", "head2", "all"]
    assert list(table.columns) == ["facts", "correlation", "sign_agreement", "max_abs_difference"]
    assert table["facts"].tolist() == [6, 3, 2, 3, 14]
    assert table["sign_agreement"].tolist() == pytest.approx([2 / 6, 1.0, 1.0, 1.0, 10 / 14])
    assert table["max_abs_difference"].tolist() == pytest.approx([0.51, 0.998, 0.1, 0.7998, 0.998])
    head0 = pd.Series([0.9, 0.01, 0.05, -0.01, 0.5, -0.01]).corr(pd.Series([0.8, -0.04, -0.01, 0.05, -0.01, 0.5]))
    assert table.loc["head0", "correlation"] == pytest.approx(head0)
    assert table.loc["head1", "correlation"] == pytest.approx(1.0)  # a spread of exactly 0.001 is enough
    assert table.loc["mlp", "correlation"] == pytest.approx(1.0)  # two facts
    assert math.isnan(table.loc["head2", "correlation"])  # spread 0.0001
    pooled = [(x, y) for a, b in measured.values() for x, y in zip(a, b) if not (math.isnan(x) or math.isnan(y))]
    xs, ys = zip(*pooled)
    assert table.loc["all", "correlation"] == pytest.approx(pd.Series(xs).corr(pd.Series(ys)))
    relation = agreement(patched.rename(columns=lambda c: c.replace("_subject_", "_relation_")),
                         attributed.rename(columns=lambda c: c.replace("_subject_", "_relation_")), "relation")
    assert relation.equals(agreement(patched, attributed, "subject"))


def test_the_defaults_are_the_subject_swapped_with_two_contexts_and_seed_0():
    model, task = constructed("mlp")
    given = attribution_patching(model, task, "subject", prompts=FactPrompts.build(model, task, contexts=2, seed=0))
    pd.testing.assert_frame_equal(attribution_patching(model, task), given)
    assert not attribution_patching(model, task, seed=1).equals(given)


def test_the_prompts_split_into_runs_of_any_size_give_the_same_estimates(monkeypatch):
    model, task = constructed("mlp")
    prompts = FactPrompts.build(model, task, contexts=2, seed=0)
    whole = attribution_patching(model, task, "relation", prompts=prompts)
    assert len(prompts.batch.tokens) > 2 * 7
    monkeypatch.setattr("probe.attribution_patching.PROMPTS_PER_RUN", 7)
    split = attribution_patching(model, task, "relation", prompts=prompts)
    pd.testing.assert_frame_equal(split, whole, atol=1e-5, rtol=1e-5)


def test_the_restored_share_does_not_depend_on_the_logit_scale():
    """The unembedding scaled by 1/100: the logit differences and their gradients shrink
    alike, the share restored (their ratio) stays; only a difference below 1e-6 is no scale."""
    task = CONSTRUCTION_TASK.build()
    config = override(CONSTRUCTION_MODEL, {"attn_only": False})
    weights = build("mlp", task, config)
    small = {k: v / 100 if k.startswith("unembed.") else v for k, v in weights.items()}
    shares = [attribution_patching(build_bridge(config.checkpoint_section(task), w), task, "subject")
              for w in (weights, small)]
    assert shares[0].notna().all().all()
    pd.testing.assert_frame_equal(shares[1], shares[0], atol=1e-4, rtol=1e-4)


def test_a_prompt_whose_swap_has_no_other_answer_scores_nan(monkeypatch):
    from probe import patching

    def no_other_answer(*args):
        tokens, answers = patching.corrupted_prompts(*args)
        return tokens, torch.full_like(answers, -1)

    monkeypatch.setattr("probe.attribution_patching.corrupted_prompts", no_other_answer)
    model, task = constructed("mlp")
    assert attribution_patching(model, task, "subject").isna().all().all()


def test_the_intervals_are_seeded_by_the_prompts(monkeypatch):
    from probe import attribution_patching as module

    seeds = []
    monkeypatch.setattr(module, "with_interval", lambda name, values, seed: seeds.append(seed) or {name: values[:, 0]})
    model, task = constructed("attention")
    attribution_patching(model, task, "subject", prompts=FactPrompts.build(model, task, contexts=2, seed=3))
    assert seeds and set(seeds) == {3}
