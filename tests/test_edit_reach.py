"""scripts/edit_reach.py: ROME's value at a block below the last, tried alone, as a rank-one
write at every position and at the key's position only, on the mixed construction at L = 2
(stores known fact by fact)."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from models.checkpoint import write_checkpoint
from models.recall.constructions import CONSTRUCTION_TASK
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for

SCRIPT = Path(__file__).parents[1] / "scripts" / "edit_reach.py"


@pytest.fixture(scope="module")
def reach():
    spec = importlib.util.spec_from_file_location("edit_reach", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """The mixed construction's checkpoint and a study.csv naming one `enriched` fact, (0, 1)."""
    task = CONSTRUCTION_TASK.build()
    assert plan_for("mixed", task)[0][1] == "enriched"
    root = tmp_path_factory.mktemp("reach")
    ckpt = write_checkpoint(root / "d2-mixed", DEPTH_MODEL.checkpoint_section(task), task, {},
                            build_depth(task, DEPTH_MODEL, plan_for("mixed", task)))
    study = root / "study.csv"
    pd.DataFrame([{"subject": 0, "relation": 1, "store": "attention L0", "head": 0}]).to_csv(study, index=False)
    return ckpt, study


@pytest.mark.slow  # 5-7 s: 20 Adam steps and every held-out prompt of the task
def test_roms_key_takes_and_the_last_position_of_block_0_is_refused(reach, mixed, tmp_path):
    """An enriched fact is kept in block 0's MLP at the subject's position: v* there takes on every
    held-out prompt, alone and as the rank-one write; block 0's MLP never fires at the last position,
    so that write is refused (no key), not counted."""
    ckpt, study = mixed
    out = tmp_path / "reach.csv"
    assert reach.main([str(ckpt), str(study), "--layer", "0", "--stores", "mlp:subject,mlp:last",
                       "--out", str(out)]) == 0
    rows = pd.read_csv(out).set_index("position")
    subject, last = rows.loc["subject"], rows.loc["last"]
    assert (subject["delta"], subject["write"], subject["write_at_key"], subject["n"]) == (8, 8, 8, 8)
    assert last["refused"] == "no key" and pd.isna(last["delta"])


@pytest.mark.parametrize("argv, said", [
    (["--stores", "ov:subject"], "--stores takes"),
    (["--stores", "mlp:last", "--study", "missing.csv"], "no study.csv"),
    (["--stores", "mlp:last", "--ckpt", "missing"], "not a checkpoint directory"),
])
def test_bad_input_is_one_line_and_writes_nothing(reach, tmp_path, capsys, argv, said):
    """Refused before any model is loaded or edited (cheap: no checkpoint is built)."""
    study = tmp_path / "study.csv"
    pd.DataFrame([{"subject": 0, "relation": 1, "store": "attention L0", "head": 0}]).to_csv(study, index=False)
    named = dict(zip(argv[::2], argv[1::2]))
    ckpt = tmp_path / named.pop("--ckpt", "missing")
    study = tmp_path / named.pop("--study", "study.csv")
    out = tmp_path / "reach.csv"
    assert reach.main([str(ckpt), str(study), *(x for kv in named.items() for x in kv), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and err.count("\n") == 1 and not out.exists()


def test_a_file_already_at_out_is_kept(reach, tmp_path, capsys):
    study, out = tmp_path / "study.csv", tmp_path / "reach.csv"
    pd.DataFrame([{"subject": 0, "relation": 1, "store": "attention L0", "head": 0}]).to_csv(study, index=False)
    out.write_text("mine")
    assert reach.main([str(tmp_path / "missing"), str(study), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "mine"


@pytest.mark.slow  # builds the construction's checkpoint
def test_a_file_inside_the_checkpoint_but_outside_its_analysis_is_refused(reach, mixed, capsys):
    ckpt, study = mixed
    out = ckpt / "reach.csv"
    assert reach.main([str(ckpt), str(study), "--out", str(out)]) == 2
    assert "inside the checkpoint" in capsys.readouterr().err and not out.exists()
