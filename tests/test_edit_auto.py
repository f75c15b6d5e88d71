"""The editor's default value, `auto` (probe/editing.py): the closed form where it is exact (the
last block's write at the last position, d_model >= the answers' count), ROME's optimisation
elsewhere; and ROME's v*, found once per model it is keyed on, not again on each doubling."""
from types import SimpleNamespace

import pytest
import torch

from models import build_bridge, load
from models.recall.constructions import CONSTRUCTION_TASK
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for
from probe import edit_values, editing
from probe.editing import FactEdit, closed_form_exact, edit_facts

TASK = CONSTRUCTION_TASK.build()  # O = R * D = 16 answers


@pytest.fixture(scope="module")
def mixed():
    """The two-layer construction (d = 80): facts in block 0's heads, block 1's MLP, or enriched
    at block 0's MLP at the subject's position."""
    return build_bridge(DEPTH_MODEL.checkpoint_section(TASK), build_depth(TASK, DEPTH_MODEL, plan_for("mixed", TASK)),
                        task=TASK)


@pytest.fixture(scope="module")
def tiny(tiny_ckpt):
    return load(tiny_ckpt, device="cpu")


def other_answer(task, s: int, r: int) -> int:
    block = task.relation_answers(r)
    return block[(int(task.facts[s, r]) - block.start + 1) % len(block)]


@pytest.mark.parametrize("d_model, layer, position, exact", [
    (16, 1, "last", True),  # d = O: W_U [16, 16] is invertible
    (15, 1, "last", False),  # d < O: least squares only
    (80, 0, "last", False),  # a block below the last: the later block is in between
    (80, 0, "subject", False),
    (80, 1, "subject", False),
])
def test_the_closed_form_is_exact_at_the_last_block_s_last_position_when_d_holds_the_answers(d_model, layer, position,
                                                                                              exact):
    model = SimpleNamespace(cfg=SimpleNamespace(d_model=d_model, n_layers=2, d_vocab_out=16))
    assert closed_form_exact(model, layer, position) is exact


def counted(monkeypatch, scale: float = 1.0) -> list:
    """Count (and scale) every optimised value the editor asks for."""
    calls, optimise = [], edit_values.optimised_value

    def value(*args):
        calls.append(args[-1])  # the layer
        return scale * optimise(*args)
    monkeypatch.setattr(edit_values, "optimised_value", value)
    return calls


def test_auto_takes_the_closed_form_where_exact_and_optimises_below(mixed, monkeypatch):
    """On the two-layer construction, one batch: block 1's MLP fact at the last position (exact:
    d = 80 >= 16) is written as the closed form writes it, block 0's MLP fact at the subject's
    position as ROME's v* writes it; only block 0's value is optimised."""
    last, subject = FactEdit(1, 0, other_answer(TASK, 1, 0), "mlp"), FactEdit(0, 1, other_answer(TASK, 0, 1), "mlp",
                                                                                position="subject")
    calls = counted(monkeypatch)
    auto = edit_facts(mixed, TASK, [last, subject], contexts=4, tries=1).deltas
    assert calls == [0]
    closed = edit_facts(mixed, TASK, [last], contexts=4, tries=1, value="closed").deltas
    optimised = edit_facts(mixed, TASK, [subject], contexts=4, tries=1, value="optimise").deltas
    assert torch.allclose(auto["blocks.1.mlp.W_out"], closed["blocks.1.mlp.W_out"], atol=1e-6)
    assert torch.allclose(auto["blocks.0.mlp.W_out"], optimised["blocks.0.mlp.W_out"], atol=1e-6)
    assert not torch.allclose(optimised["blocks.0.mlp.W_out"], edit_facts(
        mixed, TASK, [subject], contexts=4, tries=1, value="closed").deltas["blocks.0.mlp.W_out"], atol=1e-3)


def test_on_a_one_layer_model_with_room_for_every_answer_auto_is_the_closed_form(tiny, monkeypatch):
    """The tiny preset (one layer, d = 32 >= R * D = 16): auto never optimises, and writes what
    the closed form writes, at the heads and at the MLP."""
    model, task = tiny
    calls = counted(monkeypatch)
    edits = [FactEdit(3, 1, other_answer(task, 3, 1), "both", 0)]
    auto, closed = (edit_facts(model, task, edits, 4, value=v) for v in ("auto", "closed"))
    assert calls == [] and auto.boosts == closed.boosts and set(auto.deltas) == set(closed.deltas) == {
        "blocks.0.attn.W_O", "blocks.0.mlp.W_out"}
    assert all(torch.equal(auto.deltas[k], closed.deltas[k]) for k in auto.deltas)


def test_rome_s_value_is_found_once_per_model_it_is_keyed_on_across_doublings(tiny, monkeypatch):
    """An optimised write made too weak (v* / 50) is doubled until it wins. The head's write is
    keyed on the unedited model on every try: its v* is found once. The MLP's is keyed on the
    model the head's write left, which changes with each doubling: found once per try. Each
    write is the one a first try at the final margins makes from nothing."""
    model, task = tiny
    edits = [FactEdit(3, 1, other_answer(task, 3, 1), "both", 0)]
    calls = counted(monkeypatch, 0.02)
    edited = edit_facts(model, task, edits, 4, value="optimise", tries=8)
    tries = 1 + round(torch.log2(torch.tensor(edited.boosts[0])).item())
    assert tries >= 3 and len(calls) == 1 + tries
    checked = editing.checked_edits(model, task, edits)
    _, fresh = editing._written(model, task, checked, 4, 0, 2.0 * torch.tensor(edited.boosts), "exact",
                                editing.edit_keys.RIDGE, "optimise", 2.0, {})
    assert all(torch.allclose(edited.deltas[k], fresh[k], atol=1e-5 * float(fresh[k].abs().max())) for k in fresh)
