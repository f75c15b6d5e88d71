"""python -m analyses.edit_facts: its tables, the edited model saved as a checkpoint of its
own, the checkpoint read never changed, and bad input refused in one line."""
import json

import pandas as pd
import pytest

from analyses.edit_facts import main
from models import load
from models.checkpoint import write_checkpoint
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, build_storage
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for
from probe.hooks import hooked_last_logits
from probe.prompts import fact_batch
from tests.conftest import run_main

TASK = CONSTRUCTION_TASK.build()
STRUCTURED = override(CONSTRUCTION_TASK, {"facts": "structured"}).build()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Theorem 4 (mlp), Theorem 3 (attention), a model keeping each fact where a plan
    says (fact 1:0 nowhere: the model does not hold it), and two-layer depth constructions."""
    root = tmp_path_factory.mktemp("edit")
    ckpts = {}
    for kind in ("mlp", "attention"):
        cfg = override(CONSTRUCTION_MODEL, {"attn_only": kind == "attention"})
        ckpts[kind] = write_checkpoint(root / kind, cfg.checkpoint_section(TASK), TASK, {}, build(kind, TASK, cfg))
    pattern = ["attention", "mlp", "both", "mlp"]
    plan = [[pattern[(s + r) % 4] for r in range(4)] for s in range(8)]
    plan[1][0] = "none"
    weights = build_storage(STRUCTURED, CONSTRUCTION_MODEL, plan, 5.0, 5.0)
    ckpts["planned"] = write_checkpoint(root / "planned", CONSTRUCTION_MODEL.checkpoint_section(STRUCTURED),
                                        STRUCTURED, {}, weights)
    for kind in ("mixed", "last-mlp"):
        ckpts[kind] = write_checkpoint(root / kind, DEPTH_MODEL.checkpoint_section(TASK), TASK, {},
                                       build_depth(TASK, DEPTH_MODEL, plan_for(kind, TASK)))
    return ckpts


def files(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and "analysis" not in p.parts}


def test_an_edit_is_measured_and_saved_and_the_checkpoint_is_not_changed(checkpoints, tmp_path, capsys):
    ckpt = checkpoints["mlp"]
    before = files(ckpt)
    code, out, err = run_main(main, [ckpt, "--fact", "3:1", "--to", "R1:a0", "--fact", "0:2", "--to", "11",
                                     "--save", tmp_path / "edited", "--quiet", "--device", "cpu"], capsys)
    assert code == 0, err
    assert files(ckpt) == before
    folder = ckpt / "analysis" / "edit_facts" / "3-1_to_4_0-2_to_11_at-mlp"
    edits = pd.read_csv(folder / "edits.csv")
    assert edits["new_name"].tolist() == ["R1:a0", "R2:a3"] and edits["efficacy"].tolist() == [1.0, 1.0]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["specificity"]["all"]["share"] == 1.0 and summary["weight_change"]["W_out"]["norm"] > 0
    assert "S3 R1: R1:a3 -> R1:a0 at mlp" in out
    model, task = load(tmp_path / "edited", "cpu")  # the saved model answers the new answers
    tokens = fact_batch(task, 4, seed=5).tokens  # [F * 4, T] fact-major
    answers = hooked_last_logits(model, tokens).argmax(-1).reshape(-1, 4)
    assert (answers[3 * 4 + 1] == 4).all() and (answers[0 * 4 + 2] == 11).all() and (answers[0, :] == 0).all()


def test_auto_writes_each_fact_where_it_lives(checkpoints, tmp_path, capsys):
    facts = {"0:0": "ov", "0:1": "mlp", "0:2": "both"}  # the plan's attention, mlp, both
    argv = [checkpoints["planned"], "--at", "auto", "--out", tmp_path, "--quiet", "--device", "cpu"]
    for fact in facts:
        s, r = map(int, fact.split(":"))
        argv += ["--fact", fact, "--to", str((int(STRUCTURED.facts[s, r]) + 1) % 4 + 4 * r)]
    code, _, err = run_main(main, argv, capsys)
    assert code == 0, err
    edits = pd.read_csv(tmp_path / "edits.csv")
    assert edits["at"].tolist() == list(facts.values()) and (edits["efficacy"] == 1.0).all()


@pytest.mark.parametrize("kind, args, said", [
    ("planned", ["--fact", "1:0", "--to", "R0:a3"], "does not hold fact 1:0"),
    ("mlp", ["--fact", "3:1", "--to", "R2:a0"], "not one of relation R1's answers"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a3"], "already answers R1:a3"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--at", "ov"], "an ov write needs a head"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--at", "ov", "--head", "4"], "head 4 is outside the model"),
    ("attention", ["--fact", "3:1", "--to", "R1:a0"], "the model has no MLP"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--fact", "0:0"], "give one --to per --fact"),
    ("mlp", ["--fact", "3:1,0:0", "--to", "R1:a0"], "--fact takes one fact"),
    ("mlp", ["--fact", "9:1", "--to", "R1:a0"], "outside the task"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--margin", "0"], "--margin must be > 0"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--at", "ov", "--head", "1"],
     "fact 3:1 has no key at head 1 of layer 0: its norm"),
    ("mixed", ["--fact", "0:1", "--to", "5", "--layer", "2"], "layer 2 is outside the model (layers 0..1)"),
    ("mixed", ["--fact", "0:1", "--to", "5", "--layer", "1", "--position", "subject"], "layer 1 is the model's last"),
    ("mixed", ["--fact", "0:1", "--to", "5", "--at", "auto"],
     "error: {ckpt}: a model of 2 layers; edit_facts --at auto reads one-layer models only."),
    ("mixed", ["--fact", "0:0", "--to", "R0:a1"], "fact 0:0 has no key at layer 1's MLP at the last position"),
    ("last-mlp", ["--fact", "0:1", "--to", "5", "--position", "subject"],
     "fact 0:1 has no key at layer 0's MLP at the subject position"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--at", "auto", "--layer", "0"], "give --layer and --position with"),
])
def test_bad_input_is_refused_in_one_line(checkpoints, kind, args, said, capsys):
    ckpt = checkpoints[kind]
    before, results = files(ckpt), sorted(ckpt.rglob("*"))
    code, out, err = run_main(main, [ckpt, *args, "--quiet", "--device", "cpu"], capsys)
    assert code == 2 and said.format(ckpt=ckpt) in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert files(ckpt) == before and sorted(ckpt.rglob("*")) == results  # nothing written


def test_the_checkpoint_read_is_never_the_one_saved(checkpoints, capsys):
    ckpt = checkpoints["mlp"]
    before = files(ckpt)
    for save in (ckpt, ckpt / "edited"):
        code, _, err = run_main(main, [ckpt, "--fact", "3:1", "--to", "R1:a0", "--save", save, "--force",
                                       "--quiet"], capsys)
        assert code == 2 and "is the checkpoint read" in err
    assert files(ckpt) == before


def test_a_deeper_model_is_edited_at_the_layer_and_position_asked(checkpoints, tmp_path, capsys):
    """Fact 0:1 of the mixed two-layer construction lives in block 0's MLP at the subject's
    position (enriched): written there, the saved model answers the new answer."""
    ckpt = checkpoints["mixed"]
    code, out, err = run_main(main, [ckpt, "--fact", "0:1", "--to", "R1:a0", "--position", "subject", "--save",
                                     tmp_path / "edited", "--quiet", "--device", "cpu"], capsys)
    assert code == 0, err
    folder = ckpt / "analysis" / "edit_facts" / "0-1_to_4_at-mlp-subject"
    edits = pd.read_csv(folder / "edits.csv")
    assert edits[["layer", "position", "efficacy"]].values.tolist() == [[0, "subject", 1.0]]
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["weight_change"]) == {"W_out L0"} and summary["specificity"]["all"]["share"] == 1.0
    assert "layer 0 at the subject" in out
    model, task = load(tmp_path / "edited", "cpu")
    answers = hooked_last_logits(model, fact_batch(task, 4, seed=5).tokens).argmax(-1).reshape(-1, 4)
    assert (answers[0 * 4 + 1] == 4).all() and (answers[0 * 4 + 2] == int(task.facts[0, 2])).all()


def test_an_ov_write_at_the_layer_asked_is_written_there_and_named_by_it(checkpoints, capsys):
    """Construction (a) (the last block's MLP keeps each fact; block 0's head 0 reads subject 3):
    --layer 0 writes block 0's W_O, not the last block's, and the folder, table, record and
    report say so."""
    ckpt = checkpoints["last-mlp"]
    code, out, err = run_main(main, [ckpt, "--fact", "3:1", "--to", "R1:a0", "--at", "ov", "--head", "0", "--layer",
                                     "0", "--quiet", "--device", "cpu"], capsys)
    assert code == 0, err
    folder = ckpt / "analysis" / "edit_facts" / "3-1_to_4_at-ov-L0"
    edits = pd.read_csv(folder / "edits.csv")
    assert edits[["at", "head", "layer", "position", "efficacy"]].values.tolist() == [["ov", 0, 0, "last", 1.0]]
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["weight_change"]) == {"W_O L0"} and summary["settings"]["layer"] == 0
    assert " at ov (head 0), layer 0: efficacy 1.00" in out.splitlines()[1]
