"""The clean run is explicit state: built with the prompts per call unless the caller passes
them, never stale after weights are edited in place, never keeping a model alive."""
import gc
import weakref

import torch

from models import build_bridge
from models.bridge import load_weights
from models.section import MLP
from probe.ablation import ablations
from probe.accuracy import per_fact_accuracy
from probe.attribution import direct_logit_attribution
from probe.patching import activation_patching
from probe.prompts import FactPrompts


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


def test_shared_prompts_give_each_instrument_its_own_answer(tiny_result):
    model, task = build_bridge(tiny_result.section, tiny_result.weights), tiny_result.task
    prompts = FactPrompts.build(model, task, contexts=2, seed=1)
    for instrument in (per_fact_accuracy, direct_logit_attribution, ablations):
        assert instrument(model, task, prompts=prompts).equals(instrument(model, task, contexts=2, seed=1))
