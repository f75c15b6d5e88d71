"""The clean run is explicit state: computed per call unless the caller passes one, never
stale after weights are edited in place, never keeping a model alive, refused on other prompts."""
import gc
import weakref

import pytest
import torch

from models import build_bridge
from models.bridge import load_weights
from models.weights import MLP
from probe.ablation import ablations
from probe.accuracy import per_fact_accuracy
from probe.attribution import direct_logit_attribution
from probe.contexts import fact_run
from probe.patching import activation_patching


def _without_mlp_write(weights: dict) -> dict:
    return {**weights, MLP + "W_out": torch.zeros_like(weights[MLP + "W_out"])}


def test_an_instrument_sees_weights_edited_in_place(tiny_result):
    model = build_bridge(tiny_result.section, tiny_result.weights)
    before = direct_logit_attribution(model, tiny_result.task, contexts=2)
    edited = _without_mlp_write(tiny_result.weights)
    load_weights(model, edited)  # in place: the same model object
    after = direct_logit_attribution(model, tiny_result.task, contexts=2)
    fresh = direct_logit_attribution(build_bridge(tiny_result.section, edited), tiny_result.task, contexts=2)
    assert (before["mlp_margin"] != 0).any() and (after["mlp_margin"] == 0).all()
    assert after.equals(fresh)


def test_no_instrument_keeps_the_model_alive(tiny_result):
    model = build_bridge(tiny_result.section, tiny_result.weights)
    ablations(model, tiny_result.task, contexts=2)
    activation_patching(model, tiny_result.task, "subject", contexts=1)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


def test_a_shared_run_gives_the_instrument_s_own_answer_and_other_prompts_are_refused(tiny_result):
    model, task = build_bridge(tiny_result.section, tiny_result.weights), tiny_result.task
    _, run = fact_run(model, task, contexts=2, seed=0)
    own = per_fact_accuracy(model, task, contexts=2, seed=0)
    assert per_fact_accuracy(model, task, contexts=2, seed=0, run=run).equals(own)
    for contexts, seed in ((3, 0), (2, 1)):
        with pytest.raises(ValueError, match="other prompts"):
            per_fact_accuracy(model, task, contexts=contexts, seed=seed, run=run)
