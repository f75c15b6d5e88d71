"""Every instrument's one-call form reads the documented default prompts."""
import pandas as pd
import pytest
import torch

from models import build_bridge
from models.recall.presets import preset
from models.recall.trainer import train
from probe.ablation import ablation_hooks, ablations
from probe.accuracy import per_fact_accuracy
from probe.attribution import direct_logit_attribution
from probe.denoising import attention_masses, denoising_scores, head_token_table
from probe.hooks import rerun_last_position
from probe.memory import fact_attention, recall_probes
from probe.patching import activation_patching
from probe.prompts import FactPrompts
from probe.stats import share_with_interval
from tests.conftest import quick


@pytest.fixture(scope="module")
def half_trained():
    """The tiny preset stopped after a few steps: it answers some contexts of a fact and not
    others, so every instrument's output moves with the prompts it reads."""
    result = train(quick(preset("tiny"), steps=40, eval_every=40), progress=False, preset_name="tiny")
    return build_bridge(result.section, result.weights), result.task


def _hook_logits(model, task, prompts=None, **kw):
    """ablation_hooks as the logits each hook list gives on the default prompts."""
    reference = FactPrompts.build(model, task)
    hooks = ablation_hooks(model, task, prompts=prompts, **kw)
    return {name: rerun_last_position(model, reference.run, hook) for name, hook in hooks.items()}


def _ablations(model, task, **kw):
    return ablations(model, task, progress=None, **kw)


# (instrument, its documented default contexts): FactPrompts.build(model, task, contexts=8, seed=0)
# for all but activation patching, which reads `--patch-contexts` (2) prompts per fact.
INSTRUMENTS = [
    (per_fact_accuracy, 8), (direct_logit_attribution, 8), (_ablations, 8), (_hook_logits, 8),
    (attention_masses, 8), (denoising_scores, 8), (head_token_table, 8),
    (fact_attention, 8), (recall_probes, 8), (activation_patching, 2),
]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    return a.shape == b.shape and a.index.equals(b.index) and a.equals(b)


@pytest.mark.parametrize("instrument, contexts", INSTRUMENTS, ids=lambda x: getattr(x, "__name__", str(x)))
def test_one_call_form_reads_the_documented_default_prompts(half_trained, instrument, contexts):
    """instrument(model, task) == instrument(..., prompts=FactPrompts.build(model, task,
    contexts=<default>, seed=0)), and one more context or another seed changes the output."""
    model, task = half_trained
    one_call = instrument(model, task)
    explicit = instrument(model, task, prompts=FactPrompts.build(model, task, contexts=contexts, seed=0))
    assert _same(one_call, explicit)
    for other in (dict(contexts=contexts + 1, seed=0), dict(contexts=contexts, seed=1)):
        assert not _same(one_call, instrument(model, task, prompts=FactPrompts.build(model, task, **other))), other


def test_accuracy_on_given_prompts_reads_their_clean_logits(half_trained):
    """Without hooks, per_fact_accuracy reads the clean run of the prompts it is given and
    runs no model (the model argument is not used); its interval is Wilson's over the contexts."""
    model, task = half_trained
    prompts = FactPrompts.build(model, task, contexts=16, seed=3)
    frame = per_fact_accuracy(None, task, prompts=prompts)
    pd.testing.assert_frame_equal(frame, per_fact_accuracy(model, task, prompts=prompts))
    hits = (prompts.run.logits.argmax(-1) == prompts.batch.answers).float().reshape(-1, 16)
    by_hand = share_with_interval("accuracy", hits)
    for name, values in by_hand.items():
        assert frame[name].to_numpy() == pytest.approx(values.numpy()), name
