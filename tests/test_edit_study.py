"""python -m analyses.edit_study (and `edit_facts study`): what localization is worth, on the
hand-built models whose storage is known; its files; bad input refused in one line."""
import importlib.util
import json
import time
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
    assert code == 0 and err == "", err  # --quiet: no progress bar
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
    mlp = study[study["store"] == "mlp"]
    assert mlp["head"].isna().all() and (mlp["boost"] == 1).all()  # an exact write: the closed form alone
    assert (study.loc[study["efficacy"] == 1.0, "old_rank"] >= 2).all()  # the new answer first on every prompt
    summary = json.loads((folder / "summary.json").read_text())
    where = summary["overall"]["by_where"]
    assert where["where_it_lives"]["kept_all"] == where["elsewhere"]["kept_all"] == 1.0
    mass = pd.read_csv(folder / "mass.csv")
    assert sorted(set(mass["facts_edited"])) == [1, TASK.n_facts // 2]  # capped: others remain to keep
    assert (mass.loc[mass["store"] == "mlp", "kept"] == 1.0).all()  # exact writes to distinct units
    record = summary["edit_study"][str(theorem4)]
    assert record["held"] == TASK.n_facts and record["capacity"] > 0
    assert "where the fact lives" in out


SIZES = "--sizes must be a comma list of distinct whole numbers > 0, got"


@pytest.mark.parametrize("args, said", [
    (["--sizes", "0,4"], f"{SIZES} '0,4'."),
    (["--sizes", "4,4"], f"{SIZES} '4,4'."),
    (["--sizes", "1,x"], f"{SIZES} '1,x'."),
    (["--per-label", "0"], "--per-label must be >= 1, got 0."),
    (["--draws", "0"], "--draws must be >= 1, got 0."),
    (["--contexts", "0"], "--contexts must be >= 1, got 0."),
    (["--margin", "0"], "--margin must be > 0, got 0.0."),
    (["--margin", "-1"], "--margin must be > 0, got -1.0."),
    (["SECOND"], "2 checkpoints: give --out DIR for the study's files."),
])
def test_bad_input_is_refused_in_one_line(theorem4, args, said, capsys):
    before = sorted(theorem4.rglob("*"))
    argv = [theorem4, *[theorem4 if a == "SECOND" else a for a in args], "--quiet"]
    code, _, err = run_main(main, argv, capsys)
    assert code == 2 and err == f"error: {said}\n", err
    assert sorted(theorem4.rglob("*")) == before


def test_the_least_settings_are_taken_and_sizes_may_be_spaced():
    """One fact a label, one draw, one context and any margin above 0 are a study; the sizes
    are read with spaces around the commas, in the order given."""
    from analyses.edit_study import StudySettings

    settings = StudySettings(per_label=1, sizes=" 64, 1 ,4", draws=1, contexts=1, margin=0.01)
    assert settings.size_list() == (64, 1, 4) and StudySettings().size_list() == (1, 4, 16, 64)


def test_the_help_names_the_command_its_default_folder_and_what_the_seed_draws():
    from analyses.edit_study import parser

    said = " ".join(parser().format_help().split())
    assert "python -m analyses.edit_study CKPT [CKPT ...] (also: python -m analyses.edit_facts study CKPT ...) " \
           "What localization is worth: per checkpoint," in said  # the module's docstring
    assert said.startswith("usage: python -m analyses.edit_study [-h] [--out OUT] [--device DEVICE] [--seed SEED] "
                           "[--quiet] [--per-label PER_LABEL] [--sizes SIZES] [--draws DRAWS] [--contexts CONTEXTS] "
                           "[--margin MARGIN] [--value {auto,closed,optimise}] ckpt [ckpt ...] ")
    for line in ("ckpt checkpoint directory (docs/checkpoint_format.md); one or more",
                 "--out OUT output directory (default CKPT/analysis/edit_study, one checkpoint only)",
                 "--device DEVICE auto (CUDA when present) | cpu | cuda | cuda:N",
                 "--seed SEED seed of the facts sampled, their new answers and the keys' noise contexts (default 0)",
                 "--quiet no progress bars", "the study: --per-label PER_LABEL facts edited per storage label"):
        assert line in said, line
    args = parser().parse_args(["a"])
    assert (args.ckpt, args.out, args.device, args.seed, args.quiet) == (["a"], None, "auto", 0, False)


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
    start = time.perf_counter()
    code, out, err = run_main(main, argv, capsys)
    took = time.perf_counter() - start
    assert code == 0, err
    assert out.splitlines()[-1] == f"wrote {tmp_path}/ (study.csv, mass.csv, summary.json, study.png)"
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
    assert "lives" not in mlp and "refused" not in mlp  # one layer, every write made: the cells as they were
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
    assert (mass["others"] == facts - mass["facts_edited"]).all() and (mass["weight_change"] > 0).all()
    assert (study["checkpoint"] == str(theorem4)).all() and (mass["checkpoint"] == str(theorem4)).all()
    assert (study["value"] == "closed").all() and (mass["optimised"] == 0).all()  # the closed form wins on Theorem 4
    cells = {(c["facts_edited"], c["store"]): c for c in record["mass"]}  # each batch size's counts, added
    assert (cells[4, "mlp"]["efficacy_n"], cells[4, "mlp"]["won_n"], cells[4, "mlp"]["kept_n"]) == (
        4 * contexts, 4, (facts - 4) * contexts)
    assert mass[["facts_edited", "draw", "store"]].values.tolist() == [[1, 0, "mlp"], [1, 0, "lives"], [4, 0, "mlp"],
                                                                      [4, 0, "lives"]]
    attention, mlp_parameters = 4 * 4 * 4 * 48, 2 * 32 * 48  # H = 4, d_h = 4, d = 48, m = 32
    assert abs(record["capacity"] - 0.15 * (attention + mlp_parameters)) < 1e-9
    assert abs(record["fill"] - facts / record["capacity"]) < 1e-12 and (mass["fill"] == record["fill"]).all()
    assert abs(record["spare_capacity"] - (record["capacity"] - facts)) < 1e-9
    assert (record["shape"], record["facts"], record["held"], record["labels"]) == (
        {"d": 48, "H": 4, "d_h": 4, "m": 32}, facts, facts, {"mlp": facts})  # one layer: no L
    assert summary["settings"] == {"per_label": 2, "sizes": "1,4", "draws": 1, "contexts": contexts, "margin": 2.0,
                                   "value": "auto", "seed": 0}
    assert summary["overall"] == {k: record[k] for k in ("by_label_store", "by_where", "mass")}  # one checkpoint
    assert 0 < summary["seconds"] <= took + 0.01 and summary["seconds"] == round(summary["seconds"], 2)
    assert "where the fact lives  : 2 edits, efficacy 1.000 [0.676, 1.000] 8/8," in out  # share [interval] k/n


def test_on_theorem_3_a_write_where_the_mlp_has_no_key_is_counted_as_refused(tmp_path, capsys):
    """Theorem 3 keeps every fact in the heads and its MLP never fires: an mlp (or both) write has no
    key for any fact. Those writes are counted as refused, apart from the shares, not as failures."""
    ckpt = write_checkpoint(tmp_path / "attention", CONSTRUCTION_MODEL.checkpoint_section(TASK), TASK, {},
                            build("attention", TASK, CONSTRUCTION_MODEL))
    argv = [ckpt, "--per-label", "1", "--sizes", "1", "--draws", "1", "--contexts", "2", "--out", tmp_path / "study",
            "--quiet", "--device", "cpu"]
    code, out, err = run_main(main, argv, capsys)
    assert code == 0, err
    study = pd.read_csv(tmp_path / "study" / "study.csv").set_index("store")
    assert study["refused"].isna()["ov"] and study.loc[["mlp", "both"], "refused"].str.contains("has no key").all()
    assert study.loc["ov", "efficacy"] == 1.0 and study.loc[["mlp", "both"], "efficacy_n"].isna().all()
    where = json.loads((tmp_path / "study" / "summary.json").read_text())["overall"]["by_where"]
    assert (where["elsewhere"]["rows"], where["elsewhere"]["refused"], where["elsewhere"]["efficacy_n"]) == (2, 2, 0)
    assert where["where_it_lives"]["refused"] == 0
    assert "edited elsewhere             : 2 edits, efficacy —, other facts kept —, 2 refused (no key)" in out
    mass = pd.read_csv(tmp_path / "study" / "mass.csv").set_index("store")
    assert mass.loc["mlp", "refused"].startswith("fact") and mass.loc["lives", "kept"] == 1.0


def test_a_folder_is_the_study_s_own_when_it_holds_only_its_files_and_its_summary(tmp_path):
    """--out may be a folder of this study's earlier results (written over), with subfolders;
    not one holding another tool's summary.json, an unreadable one, or other files (all named)."""
    from analyses.edit_study import _own

    (tmp_path / "study.csv").write_text("x\n")
    (tmp_path / "plots").mkdir()
    _own(tmp_path)  # no summary.json yet: a study's files alone
    (tmp_path / "summary.json").write_text(json.dumps({"edit_study": {}}))
    _own(tmp_path)
    for text in (json.dumps({"studies": {}}), "{not json"):
        (tmp_path / "summary.json").write_text(text)
        with pytest.raises(ValueError, match=r"not edit_study results \(summary.json\); choose another --out"):
            _own(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"edit_study": {}}))
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "a.txt").write_text("")
    with pytest.raises(ValueError, match=r"not edit_study results \(a.txt, b.txt\); choose another --out"):
        _own(tmp_path)


PLAN = [["none" if (s + r) % 4 == 3 else "both" for r in range(TASK.n_relations)] for s in range(TASK.n_subjects)]


@pytest.fixture(scope="module")
def half_known():
    """A construction that does not know a quarter of its facts (`none`), and its facts located."""
    from analyses.edit_study import facts_located
    from models import build_bridge
    from models.recall.constructions import build_storage

    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), build_storage(TASK, CONSTRUCTION_MODEL, PLAN),
                         task=TASK)
    return model, facts_located(model, TASK, 2, 0)


def test_the_facts_sampled_are_held_each_edited_at_every_store_and_the_same_for_a_seed(half_known, monkeypatch):
    """Each label's sample is of the facts the model holds (never one it does not know), each
    fact written at mlp, ov and both (ov at the head that reads its subject); mass editing draws
    batches of held facts, capped at half of them, written at the MLP and where each lives. With
    every write refused (a stub), each row is counted as refused; a seed gives the same sample."""
    from analyses import edit_study

    model, located = half_known
    assert located["held"].tolist() == [PLAN[s][r] != "none" for s, r in located.index]
    written = []

    def refuse(model, task, edits, settings, seed):
        written.append(list(edits))
        return (None, None), "no key (stub)"

    monkeypatch.setattr(edit_study, "tried", refuse)
    settings = edit_study.StudySettings(per_label=3, sizes="1,64", draws=2, contexts=2)
    single = edit_study.single_edits(model, TASK, located, settings, 0)
    held = int(located["held"].sum())
    assert held == 24 and set(single["label"]) <= set(located.loc[located["held"], "label"])
    for label, part in single.groupby("label"):
        facts = list(dict.fromkeys(zip(part["subject"], part["relation"])))
        assert len(facts) == min(3, int((located["held"] & (located["label"] == label)).sum()))
        assert all(located.loc[f, "held"] for f in facts) and len(part) == 3 * len(facts)
    assert [w[0].at for w in written] == ["mlp", "ov", "both"] * (len(single) // 3)
    assert all(w[0].head == subject_head(w[0].subject) for w in written if w[0].at != "mlp")
    assert (single["refused"] == "no key (stub)").all() and "efficacy" not in single  # counted apart, no shares
    assert single.equals(edit_study.single_edits(model, TASK, located, settings, 0))
    other = edit_study.single_edits(model, TASK, located, settings, 1)
    assert set(zip(other["subject"], other["relation"])) != set(zip(single["subject"], single["relation"]))
    written.clear()
    mass = edit_study.mass_edits(model, TASK, located, settings, 0)
    first, written[:] = list(written), []
    assert mass.equals(edit_study.mass_edits(model, TASK, located, settings, 0)) and written == first
    assert mass[["facts_edited", "store"]].values.tolist() == [[n, s] for n in (1, 12) for _ in range(2)
                                                               for s in ("mlp", "lives")]
    assert (mass["refused"] == "no key (stub)").all() and [len(w) for w in written] == [1, 1, 1, 1, 12, 12, 12, 12]
    for batch, store in zip(written, ["mlp", "lives"] * 4):
        assert all(located.loc[(e.subject, e.relation), "held"] for e in batch)
        assert len({(e.subject, e.relation) for e in batch}) == len(batch)
        lives = {"distributed": "both", "both": "both", "mlp": "mlp", "attention": "ov"}
        assert [e.at for e in batch] == [store if store == "mlp" else lives[located.loc[(e.subject, e.relation),
                                                                                      "label"]] for e in batch]


def test_an_attention_only_model_s_capacity_counts_its_heads_alone():
    """The law's parameters: 4*H*d_h*d of attention and 2*m*d of MLP per block; none of MLP without one."""
    from analyses.edit_study import parameters
    from models import build_bridge
    from models.recall.config import ModelConfig
    from models.recall.weights import init_weights

    cfg = ModelConfig(d_model=48, n_heads=4, d_head=4, attn_only=True)
    model = build_bridge(cfg.checkpoint_section(TASK), init_weights(cfg, TASK, 0), task=TASK)
    got = parameters(model, TASK.n_facts)
    assert (got["attention"], got["mlp"]) == (4 * 4 * 4 * 48, 0)
    assert abs(got["capacity"] - 0.15 * 4 * 4 * 4 * 48) < 1e-9
    assert abs(got["spare_capacity"] - (got["capacity"] - 32)) < 1e-9 and abs(got["fill"] * got["capacity"] - 32) < 1e-9


def test_a_model_without_an_mlp_is_written_at_its_heads_only(monkeypatch):
    """No MLP: each fact is written at ov alone, and mass editing where each lives (its head) alone."""
    from analyses import edit_study
    from models import build_bridge
    from models.recall.config import ModelConfig
    from models.recall.weights import init_weights

    cfg = ModelConfig(d_model=48, n_heads=4, d_head=4, attn_only=True)
    model = build_bridge(cfg.checkpoint_section(TASK), init_weights(cfg, TASK, 0), task=TASK)
    facts = pd.MultiIndex.from_tuples([(s, r) for s in range(TASK.n_subjects) for r in range(TASK.n_relations)])
    located = pd.DataFrame({"label": "attention", "head": 2, "held": True}, index=facts)
    written = []
    monkeypatch.setattr(edit_study, "tried", lambda model, task, edits, settings, seed: (
        written.append(list(edits)), ((None, None), "no key (stub)"))[1])
    settings = edit_study.StudySettings(per_label=2, sizes="4", draws=1, contexts=2)
    single = edit_study.single_edits(model, TASK, located, settings, 0)
    assert single["store"].tolist() == ["ov", "ov"] and single["lives"].all() and (single["head"] == 2).all()
    written.clear()
    mass = edit_study.mass_edits(model, TASK, located, settings, 0)
    assert mass["store"].tolist() == ["lives"] and [[(e.at, e.head) for e in w] for w in written] == [[("ov", 2)] * 4]
    # subject 0's facts not held: never edited; subject 1's held but stored nowhere: edited one at a
    # time (living nowhere), never drawn for a batch written where each fact lives
    located.loc[0, "held"], located.loc[1, "label"] = False, "not_stored"
    settings = edit_study.StudySettings(per_label=32, sizes="1,64", draws=1, contexts=2)
    single = edit_study.single_edits(model, TASK, located, settings, 0)
    assert sorted(zip(single["subject"], single["relation"])) == [f for f in facts if f[0] >= 1]
    assert single["lives"].tolist() == (single["subject"] >= 2).tolist()
    written.clear()
    mass = edit_study.mass_edits(model, TASK, located, settings, 0)
    assert mass["facts_edited"].tolist() == [1, 12] and [len(w) for w in written] == [1, 12]
    assert all(e.subject >= 2 for w in written for e in w)


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
    assert (refused["efficacy_n"] == "").all() and (refused["kept_all_n"] == "").all()  # nothing counted
    ov = study[study["store"] == "ov"]
    assert (ov["refused"] == "").all()
    assert (ov["efficacy_k"].astype(float) == 4).all() and (ov["efficacy_n"].astype(float) == 4).all()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    cells = {c["store"]: c for c in summary["overall"]["by_label_store"]}
    assert cells["mlp"]["rows"] == 2 and cells["mlp"]["efficacy_n"] == 0 and cells["ov"]["efficacy_k"] == 8
    mass = pd.read_csv(tmp_path / "out" / "mass.csv", keep_default_na=False).set_index("store")
    assert "has no key" in mass.loc["mlp", "refused"] and mass.loc["mlp", "kept_n"] == ""
    assert mass.loc["lives", "refused"] == "" and float(mass.loc["lives", "kept_n"]) == (TASK.n_facts - 4) * 4
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


def test_the_figure_shows_each_pooled_share_with_its_wilson_interval_and_the_mean_kept_per_batch_size():
    """Left: per label @ store, efficacy and the other facts kept, their counts added over the
    rows, as bars side by side with Wilson 95% error bars; right: per checkpoint and store, the
    share kept against the facts edited at once (the mean over draws, on a log axis), named
    with the checkpoint's fill."""
    from analyses.edit_counts import counted
    from analyses.edit_study import figure

    single = pd.DataFrame({"label": ["attention", "attention", "mlp"], "store": ["ov", "ov", "mlp"],
                           "efficacy_k": [1, 2, 3], "efficacy_n": [4, 4, 4],
                           "kept_all_k": [6, 8, 5], "kept_all_n": [8, 8, 8]})
    mass = pd.DataFrame({"checkpoint": ["runs/a"] * 4 + ["runs/b"] * 2, "store": ["mlp"] * 6,
                         "facts_edited": [1, 1, 4, 4, 1, 4], "kept": [1.0, 0.5, 0.25, 0.75, 1.0, 0.0],
                         "fill": [0.25] * 4 + [0.5] * 2})
    left, right = figure(single, mass).axes
    cells = {"efficacy": [counted("e", 3, 8), counted("e", 3, 4)], "other facts kept": [counted("e", 14, 16),
                                                                                       counted("e", 5, 8)]}
    assert [t.get_text() for t in left.get_xticklabels()] == ["attention\n@ov", "mlp\n@mlp"]
    assert [t.get_text() for t in left.get_legend().get_texts()] == list(cells)
    for bars, (name, counts), shift in zip(left.containers[1::2], cells.items(), (-0.2, 0.2)):
        assert bars.get_label() == name
        assert [b.get_height() for b in bars] == [c["e"] for c in counts]
        assert [round(b.get_x() + b.get_width() / 2, 6) for b in bars] == [shift, 1 + shift]
        assert all(round(b.get_width(), 6) <= 0.4 for b in bars)  # side by side: a cell's two bars do not overlap
    for errors, counts in zip(left.containers[::2], cells.values()):  # each bar's error bar: low .. high
        segments = errors.lines[2][0].get_segments()
        assert [(round(a[1], 6), round(b[1], 6)) for a, b in segments] == [
            (round(c["e_low"], 6), round(c["e_high"], 6)) for c in counts]
    assert left.get_ylim() == right.get_ylim() == (0, 1.05) and right.get_xscale() == "log"  # set: no share is 1
    lines = {line.get_label(): line.get_xydata().tolist() for line in right.get_lines()}
    assert lines == {"a (fill 0.25) @ mlp": [[1, 0.75], [4, 0.5]], "b (fill 0.50) @ mlp": [[1, 1.0], [4, 0.0]]}
    refused = pd.DataFrame({"checkpoint": ["runs/c"], "store": ["mlp"], "facts_edited": [4], "draw": [0],
                            "fill": [0.5], "refused": ["fact 4:9 has no key at layer 0's MLP"]})
    assert figure(single, refused).axes[1].get_lines() == []  # every batch refused: nothing kept to draw


def test_the_report_gives_each_pool_its_counts_and_refusals_in_whole_lines():
    """Where the fact lives against elsewhere, then each batch size @ store: each share with its
    Wilson interval and count, refused writes said apart; at depth the table by label x store."""
    from analyses.edit_study import report

    single = pd.DataFrame({"label": ["mlp", "mlp", "attention"], "store": ["mlp", "ov", "mlp"],
                           "lives": [True, False, False], "efficacy_k": [4, 2, None], "efficacy_n": [4, 4, None],
                           "kept_all_k": [8, 6, None], "kept_all_n": [8, 8, None],
                           "refused": ["", "", "fact 1:0 has no key"]})
    mass = pd.DataFrame({"facts_edited": [1, 16, 16], "store": ["mlp", "mlp", "lives"], "efficacy_k": [4, None, 60],
                         "efficacy_n": [4, None, 64], "kept_k": [100, None, 50], "kept_n": [124, None, 64],
                         "refused": ["", "fact 0:0 has no key", ""]})
    lines = [
        "edited elsewhere             : 2 edits, efficacy 0.500 [0.150, 0.850] 2/4, other facts kept 0.750 "
        "[0.409, 0.929] 6/8, 1 refused (no key)",
        "edited where the fact lives  : 1 edits, efficacy 1.000 [0.510, 1.000] 4/4, other facts kept 1.000 "
        "[0.676, 1.000] 8/8",
        "   1 facts at once @ mlp  : efficacy 1.000 [0.510, 1.000] 4/4, other facts kept 0.806 [0.728, 0.866] 100/124",
        "  16 facts at once @ lives: efficacy 0.938 [0.850, 0.975] 60/64, other facts kept 0.781 [0.666, 0.865] 50/64",
        "  16 facts at once @ mlp  : efficacy —, other facts kept —, 1 refused (no key)"]
    wrote = "wrote out/x/ (study.csv, mass.csv, summary.json, study.png)"
    assert report(single, mass, Path("out/x")).splitlines() == [*lines, wrote]
    deep = report(single.assign(layer=0), mass.iloc[[0, 2]].drop(columns="refused"), Path("out/x")).splitlines()
    assert deep[:4] == lines[:4] and deep[-1] == wrote
    assert deep[4].startswith("| label | store edited | lives there | edits | refused | efficacy |")
    assert deep[6:9] == ["| attention | mlp | no | 1 | 1 | — | — | — | — | — |",
                         "| mlp | mlp | **yes** | 1 | — | 1.000 [0.510, 1.000] 4/4 | — | 1.000 [0.676, 1.000] 8/8 | — "
                         "| — |",
                         "| mlp | ov | no | 1 | — | 0.500 [0.150, 0.850] 2/4 | — | 0.750 [0.409, 0.929] 6/8 | — | — |"]
    assert len(deep) == 10


def test_a_fact_answered_in_exactly_the_known_share_of_its_contexts_is_held(monkeypatch):
    """held: the fact's answer is the top logit in at least StorageRule.known (half) of its
    contexts. On Theorem 4, with fact 0:0's answer pushed down in one of its 2 contexts and
    fact 0:1's in both, 0:0 is held (1 of 2) and 0:1 is not; every other fact is."""
    from analyses import edit_study
    from models import build_bridge

    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), build("mlp", TASK, CONSTRUCTION_MODEL), task=TASK)
    logits_of = edit_study.hooked_last_logits

    def missed(model, tokens, *args, **kw):  # [F * 2, V], fact-major: prompts 1, 2, 3 miss their answers
        logits = logits_of(model, tokens, *args, **kw).clone()
        for prompt, (s, r) in ((1, (0, 0)), (2, (0, 1)), (3, (0, 1))):
            logits[prompt, int(TASK.facts[s, r])] = -1e9
        return logits

    monkeypatch.setattr(edit_study, "hooked_last_logits", missed)
    held = edit_study.facts_located(model, TASK, 2, 0)["held"]
    assert held[(0, 0)] and not held[(0, 1)] and int(held.sum()) == TASK.n_facts - 1


def test_several_checkpoints_results_are_not_written_inside_one_of_them(theorem4, capsys):
    """The study of two checkpoints would pass for the first's own in its analysis/: refused."""
    before = sorted(theorem4.rglob("*"))
    out = theorem4 / "analysis" / "two"
    code, _, err = run_main(main, [theorem4, theorem4, "--out", out, "--quiet"], capsys)
    assert code == 2 and err == (f"error: --out {out} is inside a checkpoint ({theorem4}), whose results it would "
                                 "pass for; choose a folder outside it.\n"), err
    assert sorted(theorem4.rglob("*")) == before


def test_checkpoints_of_two_depths_are_refused_naming_each_depth(tmp_path, monkeypatch, capsys):
    """The stores are named by block, so one study holds checkpoints of one depth: the refusal
    names each checkpoint with its L, after loading both, before anything is written."""
    from types import SimpleNamespace

    from analyses import edit_study

    depth = {"one": 1, "two": 2}
    monkeypatch.setattr(edit_study, "load", lambda ckpt, device, kind: (
        SimpleNamespace(cfg=SimpleNamespace(n_layers=depth[Path(ckpt).name])), TASK))
    argv = [tmp_path / "one", tmp_path / "two", "--out", tmp_path / "out", "--quiet"]
    code, _, err = run_main(main, argv, capsys)
    assert code == 2 and err == ("error: the study compares checkpoints of one depth (its stores are named by block): "
                                 f"got {tmp_path / 'one'} (L = 1), {tmp_path / 'two'} (L = 2); run each depth apart.\n")
    assert sorted(tmp_path.iterdir()) == []


def test_a_checkpoint_of_another_task_is_refused_in_one_line(theorem4, tmp_path, capsys):
    """The study reads factual-recall checkpoints only: one of another kind (its config.json
    says induction) is refused before anything is read past its config or written."""
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((theorem4 / "config.json").read_text())
    config["task"]["kind"] = "induction"
    (other / "config.json").write_text(json.dumps(config))
    code, _, err = run_main(main, [other, "--out", tmp_path / "out", "--quiet"], capsys)
    assert code == 2 and err == (f"error: {other / 'config.json'}: task kind 'induction' is not a factual-recall task; "
                                 "this tool reads factual_recall checkpoints only.\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


@pytest.mark.parametrize("value", ["closed", "optimise"])
def test_each_edit_s_value_is_recorded_unless_the_run_is_the_closed_form_s(theorem4, tmp_path, capsys, value):
    """`--value optimise`: every edit's value is ROME's v* (study.csv's `value`, mass.csv's
    `optimised` = the batch's facts); `--value closed`: neither column, the files as before."""
    argv = [theorem4, "--per-label", "1", "--sizes", "2", "--draws", "1", "--contexts", "2", "--value", value,
            "--out", tmp_path, "--quiet", "--device", "cpu"]
    code, _, err = run_main(main, argv, capsys)
    assert code == 0, err
    study, mass = pd.read_csv(tmp_path / "study.csv"), pd.read_csv(tmp_path / "mass.csv")
    if value == "closed":
        assert "value" not in study and "optimised" not in mass
    else:
        made = study["refused"].isna()  # a write refused (no key) has no value
        assert made.sum() >= 2 and (study.loc[made, "value"] == "optimised").all()
        assert study.loc[~made, "value"].isna().all()
        assert (mass["optimised"] == mass["facts_edited"]).all()
