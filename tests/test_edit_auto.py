"""The editor's default value, `auto` (probe/editing.py): the closed form where it (doubled up
to `tries` times) wins, ROME's v* for the facts where it does not; and ROME's v*, found once per
model it is keyed on, not again on each doubling."""
import pytest
import torch

from models import build_bridge, load
from models.recall.constructions import CONSTRUCTION_TASK
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for
from probe import edit_values, editing
from probe.editing import FactEdit, edit_facts

TASK = CONSTRUCTION_TASK.build()


@pytest.fixture(scope="module")
def mixed():
    """The two-layer construction: facts in block 0's heads, block 1's MLP, or enriched at block
    0's MLP at the subject's position; the closed form is exact at every store."""
    return build_bridge(DEPTH_MODEL.checkpoint_section(TASK), build_depth(TASK, DEPTH_MODEL, plan_for("mixed", TASK)),
                        task=TASK)


@pytest.fixture(scope="module")
def tiny(tiny_ckpt):
    return load(tiny_ckpt, device="cpu")


def other_answer(task, s: int, r: int) -> int:
    block = task.relation_answers(r)
    return block[(int(task.facts[s, r]) - block.start + 1) % len(block)]


def counted(monkeypatch, scale: float = 1.0) -> list:
    """Count (and scale) every optimised value the editor asks for; each call records its layer."""
    calls, optimise = [], edit_values.optimised_value

    def value(*args):
        calls.append(args[-1])
        return scale * optimise(*args)
    monkeypatch.setattr(edit_values, "optimised_value", value)
    return calls


def test_where_the_closed_form_wins_auto_writes_it_and_optimises_nothing(mixed, monkeypatch):
    """On the construction one batch, block 1's MLP at the last position and block 0's MLP at the
    subject's: the closed form wins both, so auto writes exactly what `closed` writes (ROME's v*
    would not: optimised, block 0's write differs)."""
    edits = [FactEdit(1, 0, other_answer(TASK, 1, 0), "mlp"),
             FactEdit(0, 1, other_answer(TASK, 0, 1), "mlp", position="subject")]
    calls = counted(monkeypatch)
    auto = edit_facts(mixed, TASK, edits, contexts=4)
    assert calls == [] and auto.optimised == (False, False) and auto.boosts == (1.0, 1.0)
    closed = edit_facts(mixed, TASK, edits, contexts=4, value="closed")
    assert set(auto.deltas) == set(closed.deltas) == {"blocks.0.mlp.W_out", "blocks.1.mlp.W_out"}
    assert all(torch.equal(auto.deltas[k], closed.deltas[k]) for k in auto.deltas) and closed.optimised == (False,) * 2
    optimised = edit_facts(mixed, TASK, edits[1:], contexts=4, tries=1, value="optimise")
    assert optimised.optimised == (True,) and calls == [0]
    assert not torch.allclose(optimised.deltas["blocks.0.mlp.W_out"], closed.deltas["blocks.0.mlp.W_out"], atol=1e-3)


def test_where_the_closed_form_s_first_write_loses_auto_takes_rome_s_value_for_that_fact_only(tiny, monkeypatch):
    """The tiny preset, one try: fact 2:2 at head 2 (the MLP reads the head's write; the closed
    form's first try loses, tests/test_edit_values.py) and fact 3:1 at the MLP (it wins) in one
    batch: auto optimises 2:2's value alone, and writes what `optimise` writes for 2:2 alone."""
    model, task = tiny
    head, mlp = FactEdit(2, 2, task.relation_answers(2)[0], "ov", 2), FactEdit(3, 1, other_answer(task, 3, 1), "mlp")
    calls = counted(monkeypatch)
    auto = edit_facts(model, task, [head, mlp], 8, tries=1)
    assert auto.optimised == (True, False) and calls == [0]
    alone = edit_facts(model, task, [head], 8, tries=1, value="optimise")
    assert torch.allclose(auto.deltas["blocks.0.attn.W_O"], alone.deltas["blocks.0.attn.W_O"], atol=1e-6)
    assert edit_facts(model, task, [head], 8, tries=1, value="closed").optimised == (False,)


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
                                editing.edit_keys.RIDGE, torch.ones(1, dtype=torch.bool), 2.0, {})
    assert all(torch.allclose(edited.deltas[k], fresh[k], atol=1e-5 * float(fresh[k].abs().max())) for k in fresh)
