"""Attribution patching (one backward pass) against activation patching, on the
constructions whose storage is known."""
import pytest
import torch

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
    is first-order; pooled over components and facts it still follows the measurement."""
    *_, patched, attributed = both("mlp", "subject")
    pooled = agreement(patched, attributed, "subject").set_index("component").loc["all"]
    assert pooled["correlation"] >= 0.75 and pooled["sign_agreement"] >= 0.9, pooled


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
