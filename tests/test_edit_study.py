"""python -m analyses.edit_study (and `edit_facts study`): what localization is worth, on the
hand-built models whose storage is known; its files; bad input refused in one line."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from analyses.edit_facts import main as edit_facts_main
from analyses.edit_study import main
from models.checkpoint import write_checkpoint
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, head_groups
from tests.conftest import run_main

TASK = CONSTRUCTION_TASK.build()
SMALL = ["--per-label", "3", "--sizes", "1,64", "--draws", "1", "--contexts", "4", "--quiet", "--device", "cpu"]


def subject_head(s: int) -> int:
    return next(h for h, group in enumerate(head_groups(TASK, CONSTRUCTION_MODEL.n_heads)) if s in group)


@pytest.fixture(scope="module")
def theorem4(tmp_path_factory):
    """The Theorem 4 construction: every fact in the MLP, the heads only copy."""
    root = tmp_path_factory.mktemp("study")
    return write_checkpoint(root / "mlp", CONSTRUCTION_MODEL.checkpoint_section(TASK), TASK, {},
                            build("mlp", TASK, CONSTRUCTION_MODEL))


def test_on_theorem_4_every_store_is_written_at_a_key_that_reads_the_fact(theorem4, capsys):
    """The heads' patching shares tie on Theorem 4 (0.5 each, float noise apart): the ov write
    goes to the head whose key reads the subject (editing.carrying_head), never to one whose
    key is float noise (a write of ~1e8 that destroyed half the other facts). There, as on
    Theorem 3, the write reaches every prompt of the subject (leak 1) and at margin 2 keeps
    every other fact; the MLP's fact unit is the sharper address (leak 0)."""
    code, out, err = run_main(edit_facts_main, ["study", theorem4, *SMALL], capsys)
    assert code == 0, err
    folder = theorem4 / "analysis" / "edit_study"
    assert sorted(p.name for p in folder.iterdir()) == ["mass.csv", "study.csv", "study.png", "summary.json"]
    study = pd.read_csv(folder / "study.csv")
    assert set(study["label"]) == {"mlp"} and len(study) == 3 * 3  # 3 facts, each at mlp, ov, both
    at = study.groupby("store")[["efficacy", "kept_all"]].mean()
    assert at.loc["mlp", "efficacy"] == 1.0 and at.loc["mlp", "kept_all"] == 1.0  # exact where it lives
    assert study.loc[study["store"] == "mlp", "lives"].all() and not study.loc[study["store"] != "mlp", "lives"].any()
    ov = study[study["store"] == "ov"]
    assert ov["head"].tolist() == [subject_head(s) for s in ov["subject"]]
    assert (ov["weight_change"] < 20).all() and (ov["efficacy"] == 1.0).all() and (ov["kept_all"] == 1.0).all()
    assert (ov["leak"] > 0.99).all() and (study.loc[study["store"] == "mlp", "leak"].abs() < 0.01).all()
    summary = json.loads((folder / "summary.json").read_text())
    where = summary["overall"]["by_where"]
    assert where["where_it_lives"]["kept_all"] == where["elsewhere"]["kept_all"] == 1.0
    mass = pd.read_csv(folder / "mass.csv")
    assert sorted(set(mass["facts_edited"])) == [1, TASK.n_facts // 2]  # capped: others remain to keep
    assert (mass.loc[mass["store"] == "mlp", "kept"] == 1.0).all()  # exact writes to distinct units
    record = summary["edit_study"][str(theorem4)]
    assert record["held"] == TASK.n_facts and record["capacity"] > 0
    assert "where the fact lives" in out


@pytest.mark.parametrize("args, said", [
    (["--sizes", "0,4"], "--sizes must be a comma list"),
    (["--sizes", "4,4"], "--sizes must be a comma list"),
    (["--per-label", "0"], "--per-label must be"),
    (["--margin", "-1"], "--margin must be > 0"),
    (["SECOND"], "give --out DIR"),
])
def test_bad_input_is_refused_in_one_line(theorem4, args, said, capsys):
    before = sorted(theorem4.rglob("*"))
    argv = [theorem4, *[theorem4 if a == "SECOND" else a for a in args], "--quiet"]
    code, _, err = run_main(main, argv, capsys)
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert sorted(theorem4.rglob("*")) == before


def test_a_folder_of_other_files_is_not_written_over(theorem4, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep\n")
    code, _, err = run_main(main, [theorem4, "--out", tmp_path, "--quiet"], capsys)
    assert code == 2 and "not edit_study results (notes.txt)" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_report_s_edit_shows_the_new_answer_winning_after_the_mlp_write():
    """analyses.edit_view on Theorem 4: before the write the old answer tops the relation's
    answers, after the MLP's the new one, by about the margin asked (2 logits)."""
    from analyses.edit_view import before_after, edit_section
    from models import build_bridge

    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), build("mlp", TASK, CONSTRUCTION_MODEL), task=TASK)
    logits, effects = before_after(model, TASK, 3, 1, head=0, contexts=4)
    old, new = (next(n for n in logits.index if n.endswith(tag)) for tag in (" (old)", " (new)"))
    assert logits["before"].idxmax() == old and logits["after, at mlp"].idxmax() == new
    assert abs(logits.loc[new, "after, at mlp"] - logits.drop(index=new)["after, at mlp"].max() - 2.0) < 0.1
    assert effects.loc["mlp", "efficacy"] == 1.0 and effects.loc["mlp", "kept"] == 1.0
    facts = pd.DataFrame({"subject": [0, 3], "relation": [0, 1], "label": ["not_stored", "mlp"]})
    page = edit_section(model, TASK, facts, contexts=4)
    assert "<h3>S3 R1 (stored in: mlp) given another answer</h3>" in page and "<td>mlp</td><td>1.00</td>" in page


def test_the_report_s_edit_goes_to_the_head_that_reads_the_subject():
    """Theorem 4's fact 4:1: heads 0 and 1 restore 0.5 each when the subject is patched (float
    noise apart, head 0 ahead); only head 1 attends to subject 4, so the write goes there."""
    from analyses.edit_view import chosen_fact
    from models import build_bridge
    from probe import columns

    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), build("mlp", TASK, CONSTRUCTION_MODEL), task=TASK)
    restored = [0.5000008, 0.4999987, -2e-7, 0.0]
    facts = pd.DataFrame({columns.SUBJECT: [4], columns.RELATION: [1], columns.LABEL: ["mlp"],
                          **{columns.patch("subject", columns.head(h)): [x] for h, x in enumerate(restored)}})
    assert chosen_fact(model, TASK, facts, contexts=4, seed=0) == (4, 1, subject_head(4)) == (4, 1, 1)


def _wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval of k of n, from its formula."""
    z, p = 1.959963984540054, k / n
    centre, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def test_every_share_is_counted_with_its_wilson_interval(theorem4, tmp_path, capsys):
    """Each share of study.csv, mass.csv and summary.json is k of n held-out prompts (won: of
    n edits) with Wilson's interval of k/n; pooled cells add the counts; the spare capacity is
    the law's 0.15 facts per parameter of 4*H*d_h*d + 2*m*d."""
    contexts, facts = 4, TASK.n_facts
    argv = [theorem4, "--per-label", "2", "--sizes", "1,4", "--draws", "1", "--contexts", str(contexts),
            "--out", tmp_path, "--quiet", "--device", "cpu"]
    code, out, err = run_main(main, argv, capsys)
    assert code == 0, err
    study = pd.read_csv(tmp_path / "study.csv")
    assert (study["efficacy_n"] == contexts).all() and (study["kept_all_n"] == (facts - 1) * contexts).all()
    assert (study["kept_same_subject_n"] == (TASK.n_relations - 1) * contexts).all()
    assert (study["won_n"] == 1).all() and (study["won_k"] == (study["efficacy_k"] == contexts)).all()
    for share in ("efficacy", "kept_all", "kept_same_relation"):
        assert (study[share] == study[f"{share}_k"] / study[f"{share}_n"]).all()
        for _, row in study.iterrows():
            low, high = _wilson(row[f"{share}_k"], row[f"{share}_n"])
            assert abs(row[f"{share}_low"] - low) < 1e-5 and abs(row[f"{share}_high"] - high) < 1e-5
    # every write, at the head carrying the subject too, keeps every other fact: k = n, the interval ends at 1
    assert (study["kept_all_k"] == study["kept_all_n"]).all() and (study["kept_all_high"] == 1.0).all()
    assert (study["kept_all_low"] < 1).all()
    summary = json.loads((tmp_path / "summary.json").read_text())
    record = summary["edit_study"][str(theorem4)]
    mlp = next(c for c in record["by_label_store"] if c["store"] == "mlp")
    assert mlp["rows"] == 2 and mlp["efficacy_k"] == mlp["efficacy_n"] == 2 * contexts  # 8 of 8 prompts
    assert abs(mlp["efficacy_low"] - 8 / (8 + 1.959963984540054 ** 2)) < 1e-5 and mlp["efficacy_high"] == 1.0
    assert mlp["kept_all_k"] == mlp["kept_all_n"] == 2 * (facts - 1) * contexts
    ov = next(c for c in record["by_label_store"] if c["store"] == "ov")
    part = study[study["store"] == "ov"]
    assert ov["kept_all_k"] == part["kept_all_k"].sum() and ov["kept_all_n"] == part["kept_all_n"].sum()
    difference = record["by_where"]["difference"]["kept_all"]
    assert difference["difference"] == 0 and difference["low"] < 0 < difference["high"]  # Newcombe's: 1 - 1
    mass = pd.read_csv(tmp_path / "mass.csv")
    assert (mass["won_n"] == mass["facts_edited"]).all()
    assert (mass["kept_n"] == (facts - mass["facts_edited"]) * contexts).all()
    attention, mlp_parameters = 4 * 4 * 4 * 48, 2 * 32 * 48  # H = 4, d_h = 4, d = 48, m = 32
    assert abs(record["capacity"] - 0.15 * (attention + mlp_parameters)) < 1e-9
    assert abs(record["fill"] - facts / record["capacity"]) < 1e-12 and (mass["fill"] == record["fill"]).all()
    assert "where the fact lives  : 2 edits, efficacy 1.000 [0.676, 1.000] 8/8," in out  # share [interval] k/n


def test_a_write_whose_key_carries_nothing_is_counted_as_refused(tmp_path, capsys):
    """Theorem 3 (every fact in attention) beside an MLP that never fires: the MLP has no key
    for any fact, so every write that reaches it (mlp, both, a batch at the MLP) is refused in
    its row with nothing counted, and the head writes are still measured."""
    weights = build("attention", TASK, CONSTRUCTION_MODEL)
    weights["blocks.0.mlp.W_in"].zero_()
    weights["blocks.0.mlp.b_in"].fill_(-1.0)  # [m]: every unit off on every prompt
    ckpt = write_checkpoint(tmp_path / "dead_mlp", CONSTRUCTION_MODEL.checkpoint_section(TASK), TASK, {}, weights)
    argv = [ckpt, "--per-label", "2", "--sizes", "4", "--draws", "1", "--contexts", "4", "--quiet",
            "--device", "cpu", "--out", tmp_path / "out"]
    code, out, err = run_main(main, argv, capsys)
    assert code == 0, err
    study = pd.read_csv(tmp_path / "out" / "study.csv", keep_default_na=False)
    assert set(study["label"]) == {"attention"} and sorted(study["store"]) == ["both", "both", "mlp", "mlp", "ov", "ov"]
    refused = study[study["store"] != "ov"]
    assert refused["refused"].str.contains("has no key at layer 0's MLP").all()
    assert (refused["efficacy_n"] == 0).all() and (refused["kept_all_n"] == 0).all()
    ov = study[study["store"] == "ov"]
    assert (ov["refused"] == "").all() and (ov["efficacy_k"] == 4).all() and (ov["efficacy_n"] == 4).all()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    cells = {c["store"]: c for c in summary["overall"]["by_label_store"]}
    assert cells["mlp"]["rows"] == 2 and cells["mlp"]["efficacy_n"] == 0 and cells["ov"]["efficacy_k"] == 8
    mass = pd.read_csv(tmp_path / "out" / "mass.csv", keep_default_na=False).set_index("store")
    assert "has no key" in mass.loc["mlp", "refused"] and mass.loc["mlp", "kept_n"] == 0
    assert mass.loc["lives", "refused"] == "" and mass.loc["lives", "kept_n"] == (TASK.n_facts - 4) * 4
    script = Path(__file__).parents[1] / "scripts" / "edit_study_tables.py"
    spec = importlib.util.spec_from_file_location("tables", script)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    printed = tables.tables([tmp_path / "out"]).splitlines()  # the refused rows counted in their own column
    assert printed[4].startswith("| model | label | store | lives there | edits | refused | efficacy |")
    assert printed[6:8] == ["| dead_mlp | attention | both | no | 2 | 2 | — | — | — | — | — | — | — |",
                            "| dead_mlp | attention | mlp | no | 2 | 2 | — | — | — | — | — | — | — |"]
    assert printed[8].startswith("| dead_mlp | attention | ov | **yes** | 2 | — | 1.000")
    assert printed[13:15] == ["| dead_mlp | elsewhere | 4 | 4 | — | — | — |",
                              "| dead_mlp | *difference* |  |  | — | — | — |"]
    assert printed[19] == "| dead_mlp | 0.03 | mlp | 4 | 1 | 1 | — | — | — | — |"
