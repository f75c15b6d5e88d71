"""Rank-one writes to an associative memory (probe/editing.py): exact on the hand-built
models whose storage is known, the original model untouched, the bridge's forward changed."""
import pytest
import torch

from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, head_groups
from probe import edit_keys
from probe.edit_effects import edit_effects, fact_groups
from probe.editing import W_O, W_OUT, FactEdit, add_to, carrying_head, edit_facts
from probe.hooks import HOOK_MLP_POST, HOOK_Z
from probe.stats import wilson_interval

TASK = CONSTRUCTION_TASK.build()


def construction(kind: str):
    """The Theorem 4 (`mlp`) or Theorem 3 (`attention`) model on TASK."""
    cfg = override(CONSTRUCTION_MODEL, {"attn_only": kind == "attention"})
    return build_bridge(cfg.checkpoint_section(TASK), build(kind, TASK, cfg), task=TASK)


def other_answer(s: int, r: int, step: int = 1) -> int:
    block = TASK.relation_answers(r)
    return block[(int(TASK.facts[s, r]) - block.start + step) % len(block)]


def subject_head(s: int) -> int:
    return next(h for h, group in enumerate(head_groups(TASK, CONSTRUCTION_MODEL.n_heads)) if s in group)


def effects(model, edited, edits):
    return edit_effects(model, edited.model, TASK, [(e.subject, e.relation, old, e.answer)
                                                    for e, old in zip(edited.edits, edited.old_answers)])


def test_an_mlp_edit_on_theorem_4_is_exact():
    model = construction("mlp")
    edited = edit_facts(model, TASK, [FactEdit(3, 1, other_answer(3, 1))])
    table, specificity = effects(model, edited, edited.edits)
    assert table["efficacy"].tolist() == [1.0] and table["old_rank"].tolist() == [2.0]
    low, _ = wilson_interval(torch.tensor(1.0), 8)  # 8 held-out contexts, all won
    assert abs(table["efficacy_low"][0] - low.item()) < 1e-6
    assert abs(table["new_margin"][0] - 2.0) < 0.05  # the margin asked for, on held-out contexts too
    assert {g: s["share"] for g, s in specificity.items()} == dict.fromkeys(specificity, 1.0)
    assert specificity["same_subject"]["facts"] == TASK.n_relations - 1
    assert abs(table["leak"][0]) < 0.01  # the fact's own unit: the subject's other facts' prompts see nothing
    assert edited.boosts == (1.0,)  # the closed form alone
    assert set(edited.deltas) == {W_OUT}
    assert (edited.deltas[W_OUT].abs().amax(1) > 1e-3).sum() == 1  # one unit's row: the fact's own


def test_mlp_edits_of_many_facts_at_once_are_exact():
    model = construction("mlp")
    chosen = [(0, 0), (3, 1), (5, 2), (7, 3), (3, 2)]
    edits = [FactEdit(s, r, other_answer(s, r, 1 + i % 3)) for i, (s, r) in enumerate(chosen)]
    edited = edit_facts(model, TASK, edits)
    table, specificity = effects(model, edited, edits)
    assert table["efficacy"].tolist() == [1.0] * len(chosen)
    assert specificity["all"]["share"] == 1.0 and specificity["all"]["facts"] == TASK.n_facts - len(chosen)


def test_an_ov_edit_on_theorem_3_reaches_every_prompt_of_the_subject():
    """The head's key is the subject's value alone: the write cannot tell the subject's relations
    apart, so the new answer's whole gain reaches the subject's other facts' prompts (leak 1);
    they keep their answers while it stays below their own logit (2 x 10), and lose them past it."""
    model = construction("attention")
    edit = FactEdit(3, 1, other_answer(3, 1), "ov", subject_head(3))
    for margin, kept in ((2.0, 1.0), (40.0, 0.0)):
        edited = edit_facts(model, TASK, [edit], margin=margin)
        table, specificity = effects(model, edited, [edit])
        assert table["efficacy"].tolist() == [1.0] and abs(table["leak"][0] - 1) < 0.01
        assert specificity["same_subject"]["share"] == kept
        assert specificity["same_relation"]["share"] == specificity["other"]["share"] == 1.0
        assert set(edited.deltas) == {W_O} and (edited.deltas[W_O].abs().amax((1, 2)) > 0).tolist() == \
            [h == edit.head for h in range(CONSTRUCTION_MODEL.n_heads)]


def test_the_original_model_is_untouched():
    model = construction("mlp")
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    edited = edit_facts(model, TASK, [FactEdit(3, 1, other_answer(3, 1))])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(edited.model.W_out, model.W_out)


def test_a_write_changes_the_bridge_s_forward_where_the_layout_says():
    model = construction("mlp")
    tokens = TASK.eval_set(16, seed=3).tokens
    _, cache = model.run_with_cache(tokens)
    torch.manual_seed(1)
    d_mlp, H, dh, d = model.cfg.d_mlp, model.cfg.n_heads, model.cfg.d_head, model.cfg.d_model
    head_2 = torch.zeros(H, dh, d)
    head_2[2] = torch.randn(dh, d)
    for key, delta in ((W_OUT, torch.randn(d_mlp, d)), (W_O, head_2)):
        edited = construction("mlp")
        add_to(edited, key, delta)
        _, after = edited.run_with_cache(tokens)
        if key == W_OUT:  # mlp_out = post @ W_out + b_out
            expected = cache["blocks.0.hook_mlp_out"] + cache[HOOK_MLP_POST] @ delta
            assert torch.allclose(after["blocks.0.hook_mlp_out"], expected, atol=1e-4)
        else:  # attn_out = sum_h z_h @ W_O[h] + b_O: head 2's z only
            expected = cache["blocks.0.hook_attn_out"] + cache[HOOK_Z][:, :, 2] @ delta[2]
            assert torch.allclose(after["blocks.0.hook_attn_out"], expected, atol=1e-4)


def test_the_write_maps_each_key_to_its_value_and_spares_keys_orthogonal_in_c():
    torch.manual_seed(0)
    n, d_key, d = 3, 6, 5
    A = torch.randn(d_key, d_key)
    C = A @ A.T + 0.1 * torch.eye(d_key)
    keys, values = torch.randn(n, d_key), torch.randn(n, d)
    dW = edit_keys.write(C, keys, values)  # [d_key, d]
    assert torch.allclose(keys @ dW, values, atol=1e-4)
    # a key k with k^T C^-1 k_i = 0 for every edited key is left alone (the C^-1 of ROME's write)
    basis = torch.linalg.svd(torch.linalg.solve(C, keys.T).T).Vh[n:]  # [d_key - n, d_key]
    assert (basis @ dW).abs().max() < 1e-4
    memit = edit_keys.write(C, keys, values, "memit")  # trades each write against C's keys: reaches part of it
    assert (keys @ memit).norm() < values.norm()
    assert torch.allclose(memit, torch.linalg.solve(C + keys.T @ keys, keys.T @ values))


def test_the_logit_change_puts_the_new_answer_margin_above_every_other():
    logits = torch.tensor([[[1.0, 5.0, 3.0, 0.0], [2.0, 4.0, 3.5, 0.0]]])  # [F=1, contexts=2, O=4]
    change = edit_keys.logit_change(logits, old=torch.tensor([1]), new=torch.tensor([0]), margin=2.0)
    assert change.tolist() == [[4.0, -4.0, 0.0, 0.0]]  # t = max(3, 4; 2, 3.5): the third answer binds
    after = logits + change[:, None]
    assert ((after[0, :, 0] - after[0, :, 1:].amax(-1)) >= 2.0 - 1e-6).all()
    W_U = torch.randn(6, 4)  # d_model >= O: the dual basis moves these logits exactly
    assert torch.allclose(edit_keys.residual_change(W_U, change) @ W_U, change, atol=1e-4)


def test_the_other_facts_are_grouped_by_what_they_share_with_the_edits():
    groups = fact_groups(TASK, [(3, 1)])
    R = TASK.n_relations
    assert groups[3 * R + 1] is None and groups[3 * R + 2] == "same_subject" and groups[5 * R + 1] == "same_relation"
    assert groups.count("other") == (TASK.n_subjects - 1) * (R - 1)


def test_the_old_answer_s_bound_and_each_fact_s_own_change():
    logits = torch.tensor([[[1.0, 5.0, 0.0]], [[4.0, 1.0, 0.0]]])  # [F=2, contexts=1, O=3]
    change = edit_keys.logit_change(logits, old=torch.tensor([1, 1]), new=torch.tensor([0, 0]), margin=2.0)
    # fact 0: t = (5 - 1 + 2) / 2 = 3 binds; fact 1 already wins by 3 > 2: no change
    assert change.tolist() == [[3.0, -3.0, 0.0], [0.0, 0.0, 0.0]]
    try:
        edit_keys.write(torch.eye(2), torch.ones(1, 2), torch.ones(1, 3), "rome")
    except ValueError as e:
        assert "form must be 'exact' or 'memit'" in str(e)
    else:
        raise AssertionError("an unknown form was taken")


def test_the_keys_and_their_second_moment():
    model = construction("mlp")
    tokens = TASK.eval_set(300, seed=2).tokens  # more prompts than one run takes
    _, cache = model.run_with_cache(tokens)
    keys = edit_keys.store_keys(model, tokens, "mlp")
    assert torch.allclose(keys, cache[HOOK_MLP_POST][:, -1])
    assert torch.allclose(edit_keys.store_keys(model, tokens, "ov", 2), cache[HOOK_Z][:, -1, 2])
    small = 0.1 * keys[:, :4]  # mean eigenvalue below 1
    C = edit_keys.second_moment(small, ridge=0.5)
    mean = small.T @ small / len(small)
    assert torch.allclose(C, mean + 0.5 * mean.diagonal().mean() * torch.eye(4), atol=1e-7)


def test_a_key_that_carries_nothing_is_refused_not_blown_up():
    """On Theorem 4 head 1 never attends to subject 3 (its key for fact 3:1 is float noise,
    ~1e-7): the write would divide by it (a weight change of ~1e8). It is refused in one line
    naming the fact, the head and the key's norm against the keys' typical norm; the subject's
    own head (0) takes the same edit with a change of the Theorem 3 write's size."""
    model = construction("mlp")
    new = other_answer(3, 1)
    with pytest.raises(edit_keys.EmptyKey) as refused:
        edit_facts(model, TASK, [FactEdit(3, 1, new, "ov", 1)])
    said = str(refused.value)
    assert "\n" not in said and said.startswith("fact 3:1 has no key at head 1 of layer 0: its norm ")
    norm, typical = (float(said.split(word)[1].split()[0]) for word in ("its norm ", "typical norm "))
    assert norm < 1e-5 and abs(typical - 0.375 ** 0.5) < 1e-3  # head 1 attends to subjects 1, 4, 7: 3/8 of prompts
    edited = edit_facts(model, TASK, [FactEdit(3, 1, new, "ov", 0)])
    assert float(edited.deltas[W_O].norm()) < 20 and edited.boosts == (1.0,)


def test_the_floor_is_relative_to_the_keys_typical_norm():
    keys = torch.tensor([[3.0, 4.0], [0.0, 0.0]])  # typical norm sqrt((25 + 0) / 2)
    typical = (25 / 2) ** 0.5
    k_star = torch.tensor([[0.0, 0.0], [1.01e-3 * typical, 0.0], [0.99e-3 * typical, 0.0]])
    empty, norms, measured = edit_keys.empty_keys(k_star, keys)
    assert empty.tolist() == [True, False, True] and abs(measured - typical) < 1e-6
    assert edit_keys.empty_keys(k_star, 1000 * keys)[0].tolist() == [True, True, True]  # scale is the keys'
    assert edit_keys.empty_keys(k_star[:1], torch.zeros(4, 2))[0].tolist() == [True]  # a store that never fires


def test_the_carrying_head_is_not_decided_by_float_noise():
    # Theorem 4, fact 4:1: heads 0 and 1 restore 0.5 each (float noise apart); head 0's key is empty
    assert carrying_head([0.5000008, 0.4999987, -2e-7, 0.0], [1e-7, 1.0, 1e-7, 1.0]) == 1
    assert carrying_head([0.4999987, 0.5000008, 0.0, 0.0], [1.0, 1.0000004, 0.0, 1.0]) == 0  # both ties: lowest
    assert carrying_head([0.2, 0.6, 0.595, 0.0], [1.0, 0.5, 2.0, 1.0]) == 2  # within TIE: the larger key
    assert carrying_head([0.2, 0.6, 0.58, 0.0], [1.0, 0.5, 2.0, 1.0]) == 1  # a lead past TIE is kept


def test_the_effects_are_read_on_held_out_prompts_each_context_s_margin_apart():
    """On two random models (logits that vary with the context), an edit's margin and old rank
    are each held-out context's (seed + HELD_OUT, seed 0 by default), then their mean."""
    from models.recall.weights import init_weights
    from probe.edit_effects import HELD_OUT
    from probe.prompts import fact_batch

    original, edited = (build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK),
                                     init_weights(CONSTRUCTION_MODEL, TASK, seed), task=TASK) for seed in (1, 2))
    s, r, R, contexts = 3, 1, TASK.n_relations, 4
    old, new = int(TASK.facts[s, r]), other_answer(s, r)
    for seed, given in ((0, {}), (5, {"seed": 5})):
        tokens = fact_batch(TASK, contexts, seed + HELD_OUT).tokens[(s * R + r) * contexts:(s * R + r + 1) * contexts]
        with torch.no_grad():
            logits = edited(tokens)[:, -1].float()  # [contexts, O]
        others = logits.clone()
        others[:, new] = -torch.inf
        margins = logits[:, new] - others.amax(-1)  # [contexts]
        assert margins.std() > 0.01  # the contexts differ
        row = edit_effects(original, edited, TASK, [(s, r, old, new)], contexts, **given)[0].iloc[0]
        assert row["new_margin"] == pytest.approx(margins.mean().item(), abs=1e-5)
        assert row["old_rank"] == pytest.approx(1 + (logits > logits[:, old:old + 1]).sum(-1).float().mean().item())
