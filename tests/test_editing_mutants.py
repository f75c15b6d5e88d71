"""probe/editing.py held to what it documents (docs/testing.md, its mutation score): each
refusal's line, the count in the refusal of a fact not held, the doubling of a change that
does not win (2^(tries-1) at most), the half a `both` write gives the head, several heads'
writes recorded as applied, and ROME's closed form (a rank-one write of norm
|C^-1 k*| |delta| / k*^T C^-1 k*; MEMIT's form the same write scaled by q / (1 + q))."""
import copy

import pytest
import torch

from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build
from models.recall.weights import init_weights
from probe import edit_keys, editing
from probe.edit_effects import edit_effects
from probe.editing import W_O, W_OUT, FactEdit, add_to, checked_edits, edit_facts, held
from probe.prompts import fact_batch

TASK = CONSTRUCTION_TASK.build()  # 8 subjects, 4 relations of 4 answers each
R = TASK.n_relations


def construction(kind: str):
    """Theorem 4 (`mlp`: every fact in the MLP) or Theorem 3 (`attention`) on TASK, 4 heads;
    subject 3 is on head 0, subject 1 on head 1 (head_groups)."""
    cfg = override(CONSTRUCTION_MODEL, {"attn_only": kind == "attention"})
    return build_bridge(cfg.checkpoint_section(TASK), build(kind, TASK, cfg), task=TASK)


def random_model(n_heads: int, d_head: int):
    cfg = override(CONSTRUCTION_MODEL, {"n_heads": n_heads, "d_head": d_head})
    return build_bridge(cfg.checkpoint_section(TASK), init_weights(cfg, TASK, 0), task=TASK)


def other_answer(s: int, r: int) -> int:
    block = TASK.relation_answers(r)
    return block[(int(TASK.facts[s, r]) - block.start + 1) % len(block)]


def new_margin(model, s: int, r: int, new: int, contexts: int = 8) -> torch.Tensor:
    """The new answer's logit over the best other one on the fact's prompts (seed 0) [contexts]."""
    tokens = fact_batch(TASK, contexts, 0).tokens[(s * R + r) * contexts:(s * R + r + 1) * contexts]
    logits = model(tokens)[:, -1].float()  # [contexts, O]
    others = logits.clone()
    others[:, new] = -torch.inf
    return (logits[:, new] - others.amax(-1)).detach()


A31 = other_answer(3, 1)


@pytest.mark.parametrize("kind, edits, said", [
    ("mlp", [FactEdit(8, 1, 4)], "fact 8:1 is outside the task (subjects 0..7, relations 0..3)."),
    ("mlp", [FactEdit(3, 4, 4)], "fact 3:4 is outside the task (subjects 0..7, relations 0..3)."),
    ("mlp", [FactEdit(3, 1, A31), FactEdit(3, 1, A31)], "fact 3:1 is edited twice; give each fact one new answer."),
    ("mlp", [FactEdit(3, 1, 0)], "answer 0 is not one of relation R1's answers (R1:a0 .. R1:a3)."),
    ("mlp", [FactEdit(3, 1, A31, "head")], "a fact is written at one of mlp, ov, both, got 'head'."),
    ("attention", [FactEdit(3, 1, A31, "both", 0)], "the model has no MLP (attention only): write at ov."),
    ("mlp", [FactEdit(3, 1, A31, "both")], "an ov write needs a head: the model has 4 heads (--head H)."),
    ("two heads", [FactEdit(3, 1, A31, "ov")], "an ov write needs a head: the model has 2 heads (--head H)."),
    ("mlp", [FactEdit(3, 1, A31, "ov", 4)], "head 4 is outside the model (heads 0..3)."),
    ("mlp", [], "no edits given: give at least one fact and its new answer."),
    ("mlp", [FactEdit(3, 1, A31, "ov", 0, position="subject")], "a key at the subject's position is an MLP's "
     "(--at mlp): a head's key is read at the last position."),
    ("mlp", [FactEdit(3, 1, A31, position="subject")], "an MLP write at the subject's position needs a later "
     "block's heads to carry it to the last position: layer 0 is the model's last."),
    ("three layers", [FactEdit(3, 1, A31, layer=2, position="subject")], "an MLP write at the subject's position "
     "needs a later block's heads to carry it to the last position: layer 2 is the model's last (use 0..1)."),
])
def test_each_edit_the_model_or_the_task_cannot_take_is_refused_in_its_own_line(kind, edits, said):
    if kind == "three layers":
        cfg = override(CONSTRUCTION_MODEL, {"n_layers": 3})
        model = build_bridge(cfg.checkpoint_section(TASK), init_weights(cfg, TASK, 0), task=TASK)
    else:
        model = random_model(2, 8) if kind == "two heads" else construction(kind)
    with pytest.raises(ValueError) as refused:
        checked_edits(model, TASK, edits)
    assert str(refused.value) == said


def test_a_one_head_model_s_ov_write_goes_to_its_only_head():
    model = random_model(1, 16)
    edits = [FactEdit(3, 1, A31, "ov"), FactEdit(0, 2, other_answer(0, 2))]
    assert checked_edits(model, TASK, edits) == (FactEdit(3, 1, A31, "ov", 0, 0),  # and the layer: the only one
                                                 FactEdit(0, 2, other_answer(0, 2), layer=0))


def test_a_fact_is_held_when_answered_in_the_known_share_and_the_refusal_counts_the_contexts():
    model = construction("mlp")  # answers every fact in every context
    assert held(model, TASK, [FactEdit(3, 1, A31)], known=1.0).tolist() == [1.0]
    with pytest.raises(ValueError) as refused:  # a bar above every share: the count is the contexts answered
        held(model, TASK, [FactEdit(3, 1, A31)], known=1.5)
    assert str(refused.value) == ("the model does not hold fact 3:1: it answers R1:a3 in 8 of 8 contexts; "
                                  "there is nothing to edit.")


def test_a_change_that_does_not_win_is_doubled_up_to_tries_times_and_one_that_wins_is_not():
    """A write asked to leave the new answer 1 logit short never wins: doubled tries - 1 times
    (2^(tries-1)), it leaves it 8 short. MEMIT's write at head 3 (it reads every subject) falls
    short of 3:1's margin by q / (1 + q) and is doubled once; 1:2 on its own head wins at once."""
    model = construction("attention")
    edits = [FactEdit(3, 1, A31, "ov", 0), FactEdit(1, 2, other_answer(1, 2), "ov", 1)]
    short = edit_facts(model, TASK, edits, margin=-1.0, value="closed")
    assert short.boosts == (8.0, 8.0)  # 4 tries: 1, 2, 4, 8
    assert (new_margin(short.model, 3, 1, A31) + 8.0).abs().max() < 1e-3
    assert edit_facts(model, TASK, edits, margin=-1.0, tries=2, value="closed").boosts == (2.0, 2.0)
    edits = [FactEdit(3, 1, A31, "ov", 3), FactEdit(1, 2, other_answer(1, 2), "ov", 1)]
    assert edit_facts(model, TASK, edits, form="memit", tries=1, value="closed").boosts == (1.0, 1.0)
    doubled = edit_facts(model, TASK, edits, form="memit", value="closed")
    assert doubled.boosts == (2.0, 1.0)
    assert new_margin(doubled.model, 3, 1, A31).min() > 0.5  # won at twice the change (short at once: -0.43)
    chosen = [(0, 0), (3, 1), (5, 2), (7, 3), (3, 2)]  # Theorem 4: each fact's own unit, all exact at once
    mlp = construction("mlp")
    assert edit_facts(mlp, TASK, [FactEdit(s, r, other_answer(s, r)) for s, r in chosen]).boosts == (1.0,) * 5


def test_an_ov_write_gives_the_margin_asked_and_a_both_write_gives_the_head_half_of_it():
    ov = construction("attention")
    edited = edit_facts(ov, TASK, [FactEdit(3, 1, A31, "ov", 0)])
    assert (new_margin(edited.model, 3, 1, A31) - 2.0).abs().max() < 1e-3
    mlp = construction("mlp")
    edited = edit_facts(mlp, TASK, [FactEdit(3, 1, A31, "both", 0)])
    assert set(edited.deltas) == {W_O, W_OUT}
    head_only = copy.deepcopy(mlp)
    add_to(head_only, W_O, edited.deltas[W_O])
    assert (new_margin(head_only, 3, 1, A31) - 1.0).abs().max() < 1e-3  # the head: half the 2 logits asked
    assert (new_margin(edited.model, 3, 1, A31) - 2.0).abs().max() < 1e-3  # the MLP, keyed after it: the rest
    for key, weight in ((W_O, "W_O"), (W_OUT, "W_out")):  # the changes recorded are the changes made
        change = (getattr(edited.model, weight) - getattr(mlp, weight))[0].detach()
        assert torch.allclose(change, edited.deltas[key], atol=1e-6)


def test_writes_to_two_heads_are_each_recorded_and_each_win():
    model = construction("attention")
    edits = [FactEdit(3, 1, A31, "ov", 0), FactEdit(1, 2, other_answer(1, 2), "ov", 1)]
    edited = edit_facts(model, TASK, edits)
    assert (edited.deltas[W_O].abs().amax((1, 2)) > 1e-3).tolist() == [True, True, False, False]
    assert torch.allclose((edited.model.W_O - model.W_O)[0].detach(), edited.deltas[W_O], atol=1e-6)
    table, specificity = edit_effects(model, edited.model, TASK, [(e.subject, e.relation, old, e.answer) for e, old
                                                                  in zip(edited.edits, edited.old_answers)])
    assert table["efficacy"].tolist() == [1.0, 1.0]
    assert specificity["same_relation"]["share"] == specificity["other"]["share"] == 1.0


def test_rome_s_write_on_theorem_4_is_rank_one_of_its_closed_form_norm_and_memit_s_is_it_scaled():
    """dW = C^-1 k* Lambda^T, |dW| = |C^-1 k*| |delta| / q with q = k*^T C^-1 k*, delta the least
    residual change that asks t (e_new - e_old); MEMIT's (C + k* k*^T)^-1 k* = C^-1 k* / (1 + q)."""
    model = construction("mlp")
    edit = FactEdit(3, 1, A31)
    exact = edit_facts(model, TASK, [edit])
    memit = edit_facts(model, TASK, [edit], form="memit")
    assert exact.boosts == memit.boosts == (1.0,)
    dW = exact.deltas[W_OUT]  # [d_mlp, d_model]
    singular = torch.linalg.svdvals(dW)
    assert singular[1] < 1e-5 * singular[0]
    keys = edit_keys.store_keys(model, fact_batch(TASK, 8, 0).tokens, "mlp")  # [F * 8, d_mlp]
    k = keys[(3 * R + 1) * 8:(3 * R + 2) * 8].mean(0)  # k*: the fact's 8 contexts
    C_inv_k = torch.linalg.solve(edit_keys.second_moment(keys), k)
    q = k @ C_inv_k
    logits = model(fact_batch(TASK, 8, 0).tokens[(3 * R + 1) * 8:(3 * R + 2) * 8])[:, -1].float().detach()
    old = int(TASK.facts[3, 1])
    t = (logits[:, old] - logits[:, A31] + 2.0).amax() / 2  # the old answer binds: the rest are far below
    assert (logits[:, [a for a in range(TASK.d_vocab_out) if a not in (old, A31)]].amax(-1)
            <= logits[:, A31] + t - 2.0).all()
    change = torch.zeros(TASK.d_vocab_out)
    change[A31], change[old] = t, -t
    delta = change @ torch.linalg.pinv(model.W_U.detach().float())  # [d_model]
    closed = C_inv_k.norm() * delta.norm() / q
    assert abs(dW.norm() / closed - 1) < 1e-4
    assert abs(memit.deltas[W_OUT].norm() / (closed * q / (1 + q)) - 1) < 1e-4


def test_a_write_the_bridge_does_not_show_is_refused(monkeypatch):
    """add_to's check: were W_O's parameter another (a layout change), the bridge's W_O would
    not show the write, and the edit stops."""
    model = random_model(1, CONSTRUCTION_MODEL.d_model)  # W_O and W_V both [d_model, d_model]
    monkeypatch.setitem(editing.PARAMETERS, "W_O", "attn._original_component.v._original_component.weight")
    with pytest.raises(RuntimeError) as refused:
        add_to(model, W_O, torch.ones(1, model.cfg.d_head, model.cfg.d_model))
    assert str(refused.value) == ("the bridge does not hold the write to blocks.0.attn.W_O: its weight layout "
                                  "has changed.")
