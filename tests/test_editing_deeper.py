"""The deeper write's path of probe/editing.py, on the depth constructions whose store is
known fact by fact: a write below the last block asks its value through the later blocks
(their first-order map on the fact's own prompts), a write keyed at the subject's position
is the least change over every position it reaches (C over every position), and a store
that does not read the fact is refused in one whole line. And the rules at their edges: the
head that carries a subject at an exact tie, a one-layer model's stores in block 0."""
import pytest
import torch

from models import build_bridge
from models.recall.constructions import CONSTRUCTION_TASK, head_groups
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for
from models.recall.weights import init_weights
from probe import edit_keys
from probe.edit_effects import edit_effects
from probe.editing import TIE, FactEdit, carrying_head, edit_facts, store_key
from probe.prompts import fact_batch

TASK = CONSTRUCTION_TASK.build()
R = TASK.n_relations


def deep(kind: str, weights: dict | None = None):
    weights = weights or build_depth(TASK, DEPTH_MODEL, plan_for(kind, TASK))
    return build_bridge(DEPTH_MODEL.checkpoint_section(TASK), weights, task=TASK)


def other_answer(s: int, r: int) -> int:
    block = TASK.relation_answers(r)
    return block[(int(TASK.facts[s, r]) - block.start + 1) % len(block)]


def last_mlp_units(model, s: int, r: int, contexts: int = 4) -> torch.Tensor:
    """Block 1's MLP units at EOS on fact (s, r)'s prompts [contexts, d_mlp]."""
    tokens = fact_batch(TASK, contexts, 0).tokens[(s * R + r) * contexts:(s * R + r + 1) * contexts]
    _, cache = model.run_with_cache(tokens, names_filter="blocks.1.mlp.hook_post")
    return cache["blocks.1.mlp.hook_post"][:, -1]


def test_a_head_write_below_the_last_block_asks_its_value_through_the_later_block_s_mlp():
    """Construction (a): block 1's MLP unit (s, r) fires (at 0.5) on the copies block 0's heads
    write at EOS and writes the old answer. An ov write at block 0's head that reads subject 3,
    at the last position, asks the margin through block 1 (edit_keys.output_map on the fact's
    own prompts): the least change also turns that unit down, and the margin asked is met at
    once, to first order exactly (the unit stays on its linear side)."""
    model = deep("last-mlp")
    s, r = 3, 1
    head = next(h for h, group in enumerate(head_groups(TASK, DEPTH_MODEL.n_heads)) if s in group)
    before = last_mlp_units(model, s, r)  # [contexts, d_mlp]
    unit = int(before[0].argmax())
    assert ((before[:, unit] - 0.5).abs() < 1e-4).all() and int((before > 1e-4).sum()) == 4  # the fact's unit alone
    edited = edit_facts(model, TASK, [FactEdit(s, r, other_answer(s, r), "ov", head, 0)], contexts=4,
                        value="closed")
    assert edited.edits[0].layer == 0 and set(edited.deltas) == {"blocks.0.attn.W_O"} and edited.boosts == (1.0,)
    table, specificity = edit_effects(model, edited.model, TASK, [(s, r, edited.old_answers[0], other_answer(s, r))],
                                      contexts=4)
    assert table["efficacy"][0] == 1.0 and abs(table["new_margin"][0] - 2.0) < 0.01
    assert specificity["all"]["share"] == 1.0
    after = last_mlp_units(edited.model, s, r)
    assert (after[:, unit] < 0.4).all() and (after[:, unit] > 0).all()  # turned down (0.17), still on



def test_two_enriched_facts_written_at_once_at_the_subject_are_each_exact():
    """MEMIT's batch at block 0's MLP keyed at the subject: each fact's value through block 1's
    heads on its own prompts, each key its subject's unit, each margin the one asked."""
    model = deep("mixed")
    chosen = [(0, 1), (1, 2)]  # enriched: (s + 2 r) mod 3 = 2
    edits = [FactEdit(s, r, other_answer(s, r), "mlp", position="subject") for s, r in chosen]
    edited = edit_facts(model, TASK, edits, contexts=4, value="closed")
    table, specificity = edit_effects(model, edited.model, TASK, [(s, r, old, other_answer(s, r)) for (s, r), old
                                                                  in zip(chosen, edited.old_answers)], contexts=4)
    assert edited.boosts == (1.0, 1.0) and table["efficacy"].tolist() == [1.0, 1.0]
    assert ((table["new_margin"] - 2.0).abs() < 0.05).all() and specificity["all"]["share"] == 1.0

def test_a_write_at_the_subject_is_the_least_change_over_every_position_it_reaches():
    """Construction (c) with its enriched units also firing (0.5 each) at EOS: a key at the
    subject's position reaches every position, so C is over every position. Of the writes that
    give the fact's key its value, the one made changes block 0's MLP output over every
    position of the task's prompts least: less than the writes keyed with C at the subject's
    position alone (7.0 against 0.89) or at the last position alone (0.893)."""
    weights = build_depth(TASK, DEPTH_MODEL, plan_for("mixed", TASK))
    base = init_weights(DEPTH_MODEL, TASK, 0)
    reader = torch.linalg.pinv(torch.cat([base["embed.W_E"], base["unembed.W_U"].T]))[:, :TASK.d_vocab]  # [d, V]
    weights["blocks.0.mlp.W_in"][:, :TASK.n_subjects] += reader[:, [TASK.eos]]  # unit s: subject s, and every EOS
    model = deep("mixed", weights)
    s, r = 0, 1  # enriched
    edited = edit_facts(model, TASK, [FactEdit(s, r, other_answer(s, r), "mlp", position="subject")], contexts=4,
                        value="closed")
    table, _ = edit_effects(model, edited.model, TASK, [(s, r, edited.old_answers[0], other_answer(s, r))],
                            contexts=4)
    assert edited.boosts == (1.0,) and table["efficacy"][0] == 1.0 and abs(table["new_margin"][0] - 2.0) < 0.05
    dW = edited.deltas["blocks.0.mlp.W_out"]  # [d_mlp, d_model]
    batch = fact_batch(TASK, 4, 0)
    every = edit_keys.store_keys(model, batch.tokens, "mlp", None, 0, "all")  # [F * 4 * T, d_mlp]
    k = edit_keys.fact_keys(edit_keys.store_keys(model, batch.tokens, "mlp", None, 0, batch.subject_pos),
                            4)[s * R + r]  # [d_mlp]
    assert k.nonzero().flatten().tolist() == [s]  # the subject's own unit
    value = k @ dW  # [d_model]

    def spread(delta):  # the mean square change of the MLP's output over every position
        return float((every @ delta).pow(2).sum(-1).mean())

    for positions in (batch.subject_pos, None):
        keys = edit_keys.store_keys(model, batch.tokens, "mlp", None, 0, positions)
        other = edit_keys.write(edit_keys.second_moment(keys), k[None], value[None])
        assert torch.allclose(k @ other, value, atol=1e-4)  # the same value for the fact's key
        assert spread(dW) < 0.999 * spread(other)


def test_a_store_that_does_not_read_the_fact_is_refused_in_its_whole_line():
    """Construction (c): fact 0:0 is kept in block 0's heads, so block 1's MLP has no unit for it.
    The keys' typical norm is the root mean square over every prompt: units fire (0.5) on the
    facts kept in the last MLP only, 0.5 sqrt(share of those facts)."""
    plan = plan_for("mixed", TASK)
    in_last = sum(row.count("mlp") for row in plan) / TASK.n_facts
    with pytest.raises(edit_keys.EmptyKey) as refused:
        edit_facts(deep("mixed"), TASK, [FactEdit(0, 0, other_answer(0, 0))], contexts=4)
    assert str(refused.value) == (
        f"fact 0:0 has no key at layer 1's MLP at the last position: its norm 0 is under 0.001 of the keys' "
        f"typical norm {0.5 * in_last ** 0.5:.3g} (root mean square over the task's prompts), so a write there "
        "cannot reach it; write it at another store.")


def test_the_carrying_head_s_tie_is_within_tie_inclusive_at_both_edges():
    """A head TIE below the best share ties with it, and a tied head's key TIE (relative) below
    the largest key ties too: the larger key, then the lower index, decide."""
    assert carrying_head([1.0, 1.0 - TIE], [1.0, 2.0]) == 1  # restored at the edge: tied, its key larger
    assert carrying_head([1.0, 1.0 - 2 * TIE], [1.0, 2.0]) == 0  # past the edge: the best share alone
    assert carrying_head([0.5, 0.5], [1.0 - TIE, 1.0]) == 0  # keys at the edge: tied, the lower index
    assert carrying_head([0.5, 0.5], [1.0 - 2 * TIE, 1.0]) == 1


def test_a_store_s_matrix_and_its_key_s_hook_are_block_0_s_unless_a_layer_is_given():
    assert (store_key("mlp"), store_key("ov")) == ("blocks.0.mlp.W_out", "blocks.0.attn.W_O")
    assert (store_key("mlp", 1), store_key("ov", 2)) == ("blocks.1.mlp.W_out", "blocks.2.attn.W_O")
    assert (edit_keys.hook_name("mlp"), edit_keys.hook_name("ov")) == ("blocks.0.mlp.hook_post", "blocks.0.attn.hook_z")
    assert edit_keys.hook_name("ov", 1) == "blocks.1.attn.hook_z"


def test_each_head_s_key_norm_is_one_for_the_token_it_reads_in_block_0_and_the_code_in_block_1():
    """edit_keys.head_key_norms [F, H] on construction (c): block 0's head h reads the one token
    of its group (norm 1: the subject's head and the relations' head), block 1's head h the
    enrichment code of relation h's answer, written at the subject by block 0's unit (0.5) times
    2 x ANSWER_LOGIT: norm ANSWER_LOGIT where the subject's fact of relation h is enriched, else 0."""
    from models.recall.constructions import ANSWER_LOGIT

    plan, groups = plan_for("mixed", TASK), head_groups(TASK, DEPTH_MODEL.n_heads)
    tokens = fact_batch(TASK, 4, 0).tokens
    model = deep("mixed")
    block0 = torch.tensor([[float(s in g or TASK.n_subjects + r in g) for g in groups]
                           for s in range(TASK.n_subjects) for r in range(R)])  # [F, H]
    block1 = torch.tensor([[ANSWER_LOGIT * (plan[s][h] == "enriched") for h in range(R)]
                           for s in range(TASK.n_subjects) for _ in range(R)])  # [F, H]: head h decodes A_h
    assert torch.allclose(edit_keys.head_key_norms(model, tokens, 4), block0, atol=1e-4)
    assert torch.allclose(edit_keys.head_key_norms(model, tokens, 4, layer=1), block1, atol=1e-3)
    assert block0.sum() == 2 * TASK.n_facts and block1.count_nonzero() == R * sum(row.count("enriched") for row in plan)
