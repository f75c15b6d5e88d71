"""The editor's value choice at its edges (probe/editing.py): every prompt an edit reads is drawn
with the seed given, and ROME's v* of a fact whose subject has no other facts (a one-relation
task: no prompts for the KL term)."""
import pytest
import torch

from models import build_bridge, load
from models.recall.config import TaskConfig
from models.recall.constructions import CONSTRUCTION_MODEL, build
from probe import editing
from probe.edit_effects import edit_effects
from probe.editing import FactEdit, edit_facts


@pytest.fixture(scope="module")
def tiny(tiny_ckpt):
    return load(tiny_ckpt, device="cpu")


def test_every_prompt_an_auto_edit_reads_is_drawn_with_the_seed_given(tiny, monkeypatch):
    """Fact 2:2 at head 2 (the closed form's first try loses: tests/test_edit_values.py) and 3:1
    at the MLP, seed 3: the held check, the keys and C, the closed form's logits, ROME's v* and
    the test of a win all read prompts drawn with seed 3, none with the default 0, and the
    default 8 contexts per fact."""
    model, task = tiny
    seeds, drawn = [], editing.fact_batch

    def fact_batch(task, contexts, seed, *args, **kwargs):
        seeds.append((contexts, seed))
        return drawn(task, contexts, seed, *args, **kwargs)
    monkeypatch.setattr(editing, "fact_batch", fact_batch)
    edited = edit_facts(model, task, [FactEdit(2, 2, task.relation_answers(2)[0], "ov", 2),
                                      FactEdit(3, 1, task.relation_answers(1)[0], "mlp")], seed=3, tries=1)
    assert edited.optimised == (True, False) and len(seeds) >= 4 and set(seeds) == {(8, 3)}


def test_a_subject_with_no_other_facts_is_optimised_without_the_kl_term():
    """The MLP construction on a one-relation task: subject 3's fact has no other facts of its
    subject, so ROME's v* has no prompts for the KL term; it is optimised on the NLL and the
    weight decay alone, and wins all 4 contexts at the first try, keeping the 7 other facts."""
    task = TaskConfig(n_subjects=8, n_relations=1, answers_per_relation=4, n_noise=16, seq_len=12).build()
    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(task), build("mlp", task, CONSTRUCTION_MODEL),
                         task=task)
    block = task.relation_answers(0)
    new = block[(int(task.facts[3, 0]) - block.start + 1) % len(block)]
    edited = edit_facts(model, task, [FactEdit(3, 0, new, "mlp")], 4, tries=1, value="optimise")
    table, spec = edit_effects(model, edited.model, task, [(3, 0, edited.old_answers[0], new)], 4)
    assert edited.optimised == (True,) and edited.boosts == (1.0,) and table["efficacy"][0] == 1.0
    assert spec["same_subject"]["facts"] == 0 and spec["all"]["facts"] == 7 and spec["all"]["share"] == 1.0


def other_answer(task, s: int, r: int) -> int:
    block = task.relation_answers(r)
    return block[(int(task.facts[s, r]) - block.start + 1) % len(block)]


def test_a_write_s_v_star_is_found_again_when_any_earlier_write_s_margin_changes(tiny, monkeypatch):
    """Three writes in the forward's order: head 0's half of fact 3:1 (its v* made too weak, / 50:
    doubled on each of 3 tries), head 2's write of fact 2:2 (v* whole: it wins at the first try,
    its margin never changes) and the MLP's half of 3:1. The MLP is keyed on the model both
    heads' writes left, which changes with head 0's doubling though head 2's margin does not: its
    v* is found on every try (head 0's once, head 2's on every try), 1 + 3 + 3 in all."""
    model, task = tiny
    calls, optimise = [], editing.edit_values.optimised_value

    def value(*args):  # optimised_value(model, tokens, positions, new, essence, positions, store, head, layer)
        calls.append((args[6], args[7]))
        return (1.0 if args[7] == 2 else 0.02) * optimise(*args)
    monkeypatch.setattr(editing.edit_values, "optimised_value", value)
    monkeypatch.setattr(editing.edit_values, "STEPS", 6)  # cheaper; head 2's v* still wins at once
    edits = [FactEdit(3, 1, other_answer(task, 3, 1), "both", 0), FactEdit(2, 2, task.relation_answers(2)[0], "ov", 2)]
    edited = edit_facts(model, task, edits, 4, value="optimise", tries=3)
    assert edited.boosts == (4.0, 1.0)
    assert sorted(calls) == sorted([("ov", 0)] + [("ov", 2)] * 3 + [("mlp", -1)] * 3)


def test_a_head_write_below_the_last_block_asks_its_value_through_its_own_block_s_mlp():
    """Construction (a) with block 0's MLP made linear along u = W_U[new] - W_U[old] (unit; it
    writes -0.5 (u . x) u: two units on at 10, one reading u): the MLP of the head's own block
    takes back half of the head's write along u. The closed form's map from the heads' output
    (not the MLP's) counts that in, so the margin asked is met exactly (2.00; mapped from the
    MLP's output instead, the same write misses the new answer, -0.77)."""
    from models.recall.constructions import CONSTRUCTION_TASK, head_groups
    from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for

    task, (s, r) = CONSTRUCTION_TASK.build(), (3, 1)
    new, old = other_answer(task, s, r), int(task.facts[s, r])
    w = build_depth(task, DEPTH_MODEL, plan_for("last-mlp", task))
    u = w["unembed.W_U"][:, new] - w["unembed.W_U"][:, old]
    u = u / u.norm()  # [d_model]
    d_model, d_mlp = w["blocks.0.mlp.W_in"].shape
    w["blocks.0.mlp.W_in"], w["blocks.0.mlp.b_in"] = torch.zeros(d_model, d_mlp), torch.zeros(d_mlp)
    w["blocks.0.mlp.W_in"][:, 0], w["blocks.0.mlp.b_in"][:2] = u, 10.0
    w["blocks.0.mlp.W_out"] = torch.zeros(d_mlp, d_model)
    w["blocks.0.mlp.W_out"][0], w["blocks.0.mlp.W_out"][1] = -0.5 * u, 0.5 * u  # -0.5 (u . x + 10) u + 5 u
    model = build_bridge(DEPTH_MODEL.checkpoint_section(task), w, task=task)
    head = next(h for h, group in enumerate(head_groups(task, DEPTH_MODEL.n_heads)) if s in group)
    edited = edit_facts(model, task, [FactEdit(s, r, new, "ov", head, 0)], 4, value="closed", tries=1)
    table, _ = edit_effects(model, edited.model, task, [(s, r, old, new)], 4)
    assert edited.edits[0].layer == 0 and table["efficacy"][0] == 1.0 and abs(table["new_margin"][0] - 2.0) < 0.01


def test_results_record_each_edit_s_value_as_the_one_it_took():
    """The `value` column of edits.csv and study.csv: `optimised` where the edit took ROME's v*,
    `closed` where it took the closed form, edit by edit."""
    from probe.edit_values import found_by

    assert found_by((True, False, True)) == ["optimised", "closed", "optimised"] and found_by(()) == []
