"""Editing at depth (probe/editing.py with a layer): on the two-layer constructions whose
store is known fact by fact, each write keyed where the model reads the fact is exact, and
a store that does not read the fact is refused, not blown up."""
from pathlib import Path

import pytest
import torch

from models import build_bridge
from models.checkpoint import write_checkpoint
from models.recall.constructions import CONSTRUCTION_TASK
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for
from probe import edit_keys
from probe.edit_effects import edit_effects
from probe.editing import FactEdit, checked_edits, edit_facts

TASK = CONSTRUCTION_TASK.build()
PLAN = plan_for("mixed", TASK)  # fact (s, r): attention, mlp, enriched by (s + 2 r) mod 3


def deep(kind: str):
    plan = plan_for(kind, TASK)
    return build_bridge(DEPTH_MODEL.checkpoint_section(TASK), build_depth(TASK, DEPTH_MODEL, plan), task=TASK)


@pytest.fixture(scope="module")
def mixed():
    return deep("mixed")


def other_answer(s: int, r: int) -> int:
    block = TASK.relation_answers(r)
    return block[(int(TASK.facts[s, r]) - block.start + 1) % len(block)]


def measured(model, edit: FactEdit):
    edited = edit_facts(model, TASK, [edit], contexts=4, value="closed")  # the closed form, exact on a construction
    table, specificity = edit_effects(model, edited.model, TASK, [(edit.subject, edit.relation,
                                                                   edited.old_answers[0], edit.answer)], contexts=4)
    return edited, table.iloc[0], specificity


def test_an_enriched_fact_is_edited_at_block_0_s_mlp_keyed_at_the_subject(mixed):
    """ROME's key: block 0's MLP at the subject's position, one unit per subject; the value
    goes through block 1's heads, which carry it to the last position (edit_keys.output_map)."""
    s, r = 0, 1
    assert PLAN[s][r] == "enriched"
    edited, row, specificity = measured(mixed, FactEdit(s, r, other_answer(s, r), "mlp", position="subject"))
    assert edited.edits[0].layer == 0 and row["efficacy"] == 1.0 and edited.boosts == (1.0,)
    assert abs(row["new_margin"] - 2.0) < 0.05  # the margin asked, through the later block, to first order exact
    assert specificity["all"]["share"] == 1.0
    assert set(edited.deltas) == {"blocks.0.mlp.W_out"}
    assert (edited.deltas["blocks.0.mlp.W_out"].abs().amax(1) > 1e-3).sum() == 1  # the subject's own unit


def test_a_last_mlp_fact_is_edited_at_the_last_block_by_default(mixed):
    s, r = 0, 2
    assert PLAN[s][r] == "mlp"
    edited, row, specificity = measured(mixed, FactEdit(s, r, other_answer(s, r)))
    assert edited.edits[0].layer == 1 and set(edited.deltas) == {"blocks.1.mlp.W_out"}
    assert row["efficacy"] == 1.0 and abs(row["leak"]) < 0.01 and specificity["all"]["share"] == 1.0
    assert torch.equal(edited.model.W_out[0], mixed.W_out[0])  # block 0 untouched


def test_a_store_that_does_not_read_the_fact_is_refused(mixed):
    s, r = 0, 0
    assert PLAN[s][r] == "attention"  # the last MLP has no unit for it: its key there is 0
    with pytest.raises(edit_keys.EmptyKey, match="fact 0:0 has no key at layer 1's MLP at the last position"):
        edit_facts(mixed, TASK, [FactEdit(s, r, other_answer(s, r))], contexts=4)
    with pytest.raises(edit_keys.EmptyKey, match=r"layer 0's MLP at the subject position: its norm 0 .* typical "
                                                 r"norm 0 "):  # the last-mlp construction enriches nothing
        edit_facts(deep("last-mlp"), TASK, [FactEdit(0, 2, other_answer(0, 2), "mlp", position="subject")],
                   contexts=4)


@pytest.mark.parametrize("edit, said", [
    (FactEdit(0, 1, 5, "mlp", layer=2), "layer 2 is outside the model (layers 0..1)"),
    (FactEdit(0, 1, 5, "mlp", layer=-1), "layer -1 is outside the model"),
    (FactEdit(0, 1, 5, "mlp", layer=1, position="subject"), "layer 1 is the model's last (use 0)"),
    (FactEdit(0, 1, 5, "ov", head=0, position="subject"), "a key at the subject's position is an MLP's"),
    (FactEdit(0, 1, 5, "mlp", position="first"), "a key is read at one of last, subject"),
])
def test_an_edit_the_model_cannot_take_is_refused_in_one_line(mixed, edit, said):
    with pytest.raises(ValueError) as refused:
        checked_edits(mixed, TASK, [edit])
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_output_map_is_the_unembedding_after_the_last_block_and_the_readers_before_it(mixed):
    """edit_keys.output_map: the last block's MLP output at the last position reaches the
    logits through W_U alone; block 0's MLP output at the subject's position reaches them
    through block 1's heads, which decode the enrichment code: code_a -> e_a."""
    from models.recall.deep_constructions import fresh_directions
    from models.recall.weights import init_weights
    from probe.prompts import fact_batch

    batch = fact_batch(TASK, 2, seed=0)
    tokens, last = batch.tokens[:16], torch.full((16,), batch.tokens.shape[1] - 1)
    J = edit_keys.output_map(mixed, tokens, 1, last)  # [d, O]
    assert torch.allclose(J, mixed.W_U.detach(), atol=1e-5)
    S, R, O = TASK.n_subjects, TASK.n_relations, TASK.d_vocab_out
    code = fresh_directions(init_weights(DEPTH_MODEL, TASK, 0), S + R + O)[:, S + R:]  # [d, O]
    decoded = code.T @ edit_keys.output_map(mixed, tokens, 0, batch.subject_pos[:16])  # [O, O]
    assert torch.allclose(decoded, torch.eye(O), atol=1e-3)


def test_the_depth_study_script_keeps_to_the_one_out_rule(tmp_path):
    """scripts/edit_depth.py refuses a folder holding a user's file (kept) and the working
    directory, before any edit, in one line with exit 2."""
    import importlib.util

    from models.recall.constructions import CONSTRUCTION_MODEL, build
    spec = importlib.util.spec_from_file_location("edit_depth", Path(__file__).parents[1] / "scripts" / "edit_depth.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    task = CONSTRUCTION_TASK.build()
    ckpt = write_checkpoint(tmp_path / "thm4", CONSTRUCTION_MODEL.checkpoint_section(task), task, {},
                            build("mlp", task, CONSTRUCTION_MODEL))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    for out in (tmp_path / "mine", Path(".")):
        with pytest.raises(SystemExit) as refused:
            script.main([str(ckpt), "--out", str(out)])
        assert refused.value.code == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep" and not list(Path(".").glob("edits_margin*"))
