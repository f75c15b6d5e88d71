"""python -m analyses.edit_study at depth: each fact edited where locate_facts puts it and at every
other store of every block, on the L = 2 mixed construction whose stores are known (config.json's
training.stores); refused writes counted apart; the stores' names and the map from locate_facts'."""
import json
from types import SimpleNamespace

import pandas as pd
import pytest

from analyses.edit_study import StudySettings, main
from analyses.edit_study_depth import REFUSED, batches, facts_at_depth, measure, pooled, refused, writes
from models import build_bridge
from models.checkpoint import write_checkpoint
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, head_groups
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for
from models.recall.deep_constructions import main as construct
from probe import columns
from probe.edit_stores import lives_in, name, stores, written_at
from probe.editing import FactEdit
from probe.storage import StorageRule
from tests.conftest import run_main

# a construction's store (config.json) -> the edit store where it lives: block 0's heads, the last MLP,
# block 0's MLP at the subject's position (moved to the last position by block 1's heads)
TRUTH = {"attention": "attention L0", "mlp": "mlp L1", "enriched": "mlp L0 at subject"}
TASK = CONSTRUCTION_TASK.build()
PLAN = plan_for("mixed", TASK)  # fact (s, r): attention, mlp, enriched by (s + 2 r) mod 3
# a construction's store -> locate_facts' name at depth and the edit store it is written at
LOCATED = {"attention": ("attention0", ("ov", 0, "last")), "mlp": ("mlp1", ("mlp", 1, "last")),
           "enriched": ("mlp0_via_attention1", ("mlp", 0, "subject"))}


@pytest.fixture(scope="module")
def mixed2(tmp_path_factory):
    out = tmp_path_factory.mktemp("depth") / "d2-mixed"
    assert construct(["--kind", "mixed", "--n-layers", "2", "--out", str(out)]) == 0
    return out


def test_the_stores_of_every_block_and_where_a_located_store_is_written():
    assert [name(s) for s in stores(2)] == ["attention L0", "mlp L0", "mlp L0 at subject", "attention L1", "mlp L1"]
    assert len(stores(3)) == 8 and [name(s) for s in stores(1)] == ["attention L0", "mlp L0"]
    assert written_at("attention1") == ("ov", 1, "last") and written_at("mlp1") == ("mlp", 1, "last")
    assert written_at("mlp0_via_attention1") == ("mlp", 0, "subject")  # ROME's key: moved by later heads
    assert written_at("mlp0_via_attention1_via_attention2") == ("mlp", 0, "subject")
    assert written_at("attention0_via_attention1") is None  # a head's write read at the subject: no key of ours
    assert lives_in("attention0;attention0_via_attention2;mlp1_via_attention2") == (("ov", 0, "last"),
                                                                                     ("mlp", 1, "subject"))
    assert lives_in("") == () and lives_in("nan") == ()
    with pytest.raises(ValueError, match="'head3' is not a store"):
        written_at("head3")


def test_refused_writes_count_as_refused_not_as_failures():
    """A refused write adds a row and a refusal to its group and nothing to its shares; where
    no write was refused (every one-layer study that ran before) nothing is added."""
    written = {"efficacy": 1.0, "efficacy_k": 4, "efficacy_n": 4}
    frame = pd.DataFrame([{"store": "mlp L1", REFUSED: "", **written},
                          {"store": "mlp L1", REFUSED: "", **written, "efficacy_k": 2},
                          {"store": "mlp L1", REFUSED: "fact 0:1 has no key"},
                          {"store": "mlp L0", REFUSED: "fact 0:1 has no key"}])
    cells = {row["store"]: row for row in pooled(frame, ["store"], ("efficacy",))}
    assert (cells["mlp L1"]["rows"], cells["mlp L1"][REFUSED]) == (3, 1)
    assert (cells["mlp L1"]["efficacy_k"], cells["mlp L1"]["efficacy_n"], cells["mlp L1"]["efficacy"]) == (6, 8, 0.75)
    assert (cells["mlp L0"]["rows"], cells["mlp L0"][REFUSED], cells["mlp L0"]["efficacy_n"]) == (1, 1, 0)
    assert REFUSED not in pooled(frame.drop(columns=REFUSED), ["store"], ("efficacy",))[0]
    before = frame.drop(columns=REFUSED).set_index("store")  # a study from before refusals were kept
    assert refused(before).to_dict() == {"mlp L1": False, "mlp L0": False} and refused(before).dtype == bool
    assert refused(frame).tolist() == [False, False, True, True]


def test_checkpoints_of_different_depths_are_refused_in_one_line(mixed2, tmp_path, capsys):
    task = CONSTRUCTION_TASK.build()
    one = write_checkpoint(tmp_path / "one", CONSTRUCTION_MODEL.checkpoint_section(task), task, {},
                           build("mlp", task, CONSTRUCTION_MODEL))
    code, _, err = run_main(main, [one, mixed2, "--out", tmp_path / "study", "--quiet", "--device", "cpu"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{one} (L = 1), {mixed2} (L = 2); run each depth apart." in err
    assert not (tmp_path / "study").exists() and not (mixed2 / "analysis").exists()


@pytest.mark.slow
def test_at_two_layers_each_fact_lives_where_the_construction_keeps_it_and_keyless_writes_are_refused(
        mixed2, tmp_path, capsys):
    """Every fact of the mixed construction, edited at the 5 stores of its 2 blocks: the one store
    where it lives is its known store; block 0's MLP at the last position never fires (every write
    there refused), the last MLP has a unit for its own facts only (refused for the others); every
    write made reaches the new answer (the closed form, margin 2, as in results/editing/README.md
    "At depth")."""
    code, out, err = run_main(main, [mixed2, "--per-label", "32", "--sizes", "1", "--draws", "1", "--contexts", "2",
                                     "--value", "closed", "--out", tmp_path, "--quiet", "--device", "cpu"], capsys)
    assert code == 0, err
    stored = json.loads((mixed2 / "config.json").read_text())["training"]["stores"]
    truth = {(d["s"], d["r"]): d["store"] for d in stored}  # the construction's plan
    study = pd.read_csv(tmp_path / "study.csv")
    study[REFUSED] = study[REFUSED].fillna("")
    assert len(study) == 32 * 5 and set(zip(study["subject"], study["relation"])) == set(truth)
    for (s, r), edits in study.groupby(["subject", "relation"]):
        assert edits.loc[edits["lives"], "store"].tolist() == [TRUTH[truth[s, r]]], (s, r)
    refused = study[study[REFUSED] != ""]
    expected = {(s, r, "mlp L0") for s, r in truth} | {(s, r, "mlp L1") for (s, r), k in truth.items() if k != "mlp"}
    assert set(zip(refused["subject"], refused["relation"], refused["store"])) == expected
    assert refused[REFUSED].str.contains("has no key").all()
    written = study[study[REFUSED] == ""]
    assert (written["efficacy_k"] == written["efficacy_n"]).all() and (written["efficacy_n"] == 2).all()
    summary = json.loads((tmp_path / "summary.json").read_text())["overall"]
    assert summary["by_where"]["where_it_lives"]["rows"] == 32 and summary["by_where"]["where_it_lives"][REFUSED] == 0
    assert summary["by_where"]["elsewhere"][REFUSED] == len(expected)
    assert sum(c[REFUSED] for c in summary["by_label_store"]) == len(expected)
    assert "elsewhere             : 128 edits, efficacy 1.000" in out and f"{len(expected)} refused (no key)" in out
    assert "| mlp | mlp L0 at subject | **yes** |" in out


def test_at_two_layers_a_small_study_edits_every_store_and_counts_every_block_s_parameters(mixed2, tmp_path, capsys):
    """One fact a label (attention, mlp) at the 5 stores of the 2 blocks: the one store where each
    lives is its known one, block 0's MLP at the last position refuses both; the capacity law
    counts both blocks' parameters; the report's table by label x store says which lives there."""
    code, out, err = run_main(main, [mixed2, "--per-label", "1", "--sizes", "1", "--draws", "1", "--contexts", "2",
                                     "--out", tmp_path, "--quiet", "--device", "cpu"], capsys)
    assert code == 0, err
    truth = {(d["s"], d["r"]): d["store"]
             for d in json.loads((mixed2 / "config.json").read_text())["training"]["stores"]}
    study = pd.read_csv(tmp_path / "study.csv")
    assert sorted(set(study["label"])) == ["attention", "mlp"] and len(study) == 2 * 5
    for (s, r), edits in study.groupby(["subject", "relation"]):
        assert edits["store"].tolist() == ["attention L0", "mlp L0", "mlp L0 at subject", "attention L1", "mlp L1"]
        assert edits.loc[edits["lives"], "store"].tolist() == [TRUTH[truth[s, r]]]
        assert edits.loc[edits["store"] == "mlp L0", REFUSED].str.contains("has no key").all()
    record = json.loads((tmp_path / "summary.json").read_text())["edit_study"][str(mixed2)]
    assert record["shape"] == {"d": 80, "H": 4, "d_h": 4, "m": 32, "L": 2}
    assert record["attention"] == 2 * 4 * 4 * 4 * 80 and record["mlp"] == 2 * 2 * 32 * 80
    cells = {(c["label"], c["store"], c["lives"]): c for c in record["by_label_store"]}
    assert cells["attention", "attention L0", True]["rows"] == 1 and cells["attention", "mlp L0", False][REFUSED] == 1
    assert "| attention | attention L0 | **yes** | 1 | — | 1.000 [0.342, 1.000] 2/2 |" in out
    assert "| attention | mlp L0 | no | 1 | 1 | — |" in out


@pytest.fixture(scope="module")
def mixed_model():
    return build_bridge(DEPTH_MODEL.checkpoint_section(TASK), build_depth(TASK, DEPTH_MODEL, PLAN), task=TASK)


@pytest.fixture(scope="module")
def located(mixed_model):
    """facts_at_depth on construction (c), its located facts as locate_facts finds them with
    four changed: (0, 0) also in block 1's MLP, with the larger part of its margin there; (0, 1)
    answered in exactly the known share; (0, 2) below it; (1, 0) in a head's write that block 1's
    heads move (no key of ours)."""
    rows = []
    for s in range(TASK.n_subjects):
        for r in range(TASK.n_relations):
            store = LOCATED[PLAN[s][r]][0]
            rows.append({columns.SUBJECT: s, columns.RELATION: r, columns.ANSWER: int(TASK.facts[s, r]),
                         columns.ACCURACY: 1.0, columns.LABEL: "attention" if store[0] == "a" else "mlp",
                         columns.STORE_LIST: store, columns.margin(store): 2.0})
    facts = pd.DataFrame(rows).set_index(list(columns.FACT))
    facts.loc[(0, 0), [columns.STORE_LIST, columns.margin("attention0"), columns.margin("mlp1")]] = \
        ["attention0;mlp1", 1.0, 3.0]
    facts.loc[(0, 1), columns.ACCURACY] = StorageRule.known
    facts.loc[(0, 2), columns.ACCURACY] = StorageRule.known - 0.25
    facts.loc[(1, 0), [columns.STORE_LIST, columns.margin("attention0_via_attention1")]] = \
        ["attention0_via_attention1", 2.0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("analyses.locate_facts.locate", lambda *args, **kwargs: SimpleNamespace(facts=facts))
        return facts_at_depth(mixed_model, TASK, 2, 0)


def test_each_fact_lives_in_its_stores_by_margin_and_each_block_s_head_is_the_one_that_reads_it(located):
    """Held at the storage rule's known share (inclusive); a fact's edit stores ranked by their
    part of its margin, a head's moved write left out; per block the head with the largest key:
    block 0's the lowest that reads the subject or the relation (key norm 1), block 1's the
    lowest that decodes an enriched answer of the subject (key norm ANSWER_LOGIT)."""
    facts = [(s, r) for s in range(TASK.n_subjects) for r in range(TASK.n_relations)]
    assert list(located.index) == facts
    assert [f for f in facts if not located.loc[f, "held"]] == [(0, 2)]
    lives = {f: (LOCATED[PLAN[f[0]][f[1]]][1],) for f in facts}
    lives.update({(0, 0): (("mlp", 1, "last"), ("ov", 0, "last")), (1, 0): ()})
    assert located["lives"].to_dict() == lives
    groups = head_groups(TASK, DEPTH_MODEL.n_heads)
    assert located["head0"].tolist() == [min(h for h, g in enumerate(groups) if s in g or TASK.relation_token(r) in g)
                                         for s, r in facts]
    assert located["head1"].tolist() == [PLAN[s].index("enriched") for s, _ in facts]


def test_each_store_of_each_block_is_written_with_its_block_s_head_and_mass_edits_where_each_lives(
        mixed_model, located):
    """writes: the 5 stores of 2 blocks for fact (0, 0) (it lives in block 1's MLP and block 0's
    heads), an ov write at its block's head, an MLP write at none; batches: the held facts with
    an edit store, written at the last MLP and at the first store where each lives."""
    h0, h1 = located.loc[(0, 0), "head0"], located.loc[(0, 0), "head1"]
    made = writes(mixed_model, located, 0, 0, 5)
    assert [row for row, _ in made] == [
        {"store": "attention L0", "layer": 0, "position": "last", "head": h0, "lives": True, REFUSED: ""},
        {"store": "mlp L0", "layer": 0, "position": "last", "head": None, "lives": False, REFUSED: ""},
        {"store": "mlp L0 at subject", "layer": 0, "position": "subject", "head": None, "lives": False, REFUSED: ""},
        {"store": "attention L1", "layer": 1, "position": "last", "head": h1, "lives": False, REFUSED: ""},
        {"store": "mlp L1", "layer": 1, "position": "last", "head": None, "lives": True, REFUSED: ""}]
    assert [edit for _, edit in made] == [FactEdit(0, 0, 5, "ov", h0, 0, "last"), FactEdit(0, 0, 5, "mlp", None, 0),
                                          FactEdit(0, 0, 5, "mlp", None, 0, "subject"),
                                          FactEdit(0, 0, 5, "ov", h1, 1), FactEdit(0, 0, 5, "mlp", None, 1)]
    pool, where, edit, first = batches(mixed_model, located)
    assert sorted(pool) == sorted(set(located.index) - {(0, 2), (1, 0)}) and first == {REFUSED: ""}
    assert where == ("mlp L1", "lives")
    assert edit(0, 0, 5, "lives") == FactEdit(0, 0, 5, "mlp", None, 1)  # its first store: block 1's MLP
    assert edit(0, 1, 6, "lives") == FactEdit(0, 1, 6, "mlp", None, 0, "subject")  # enriched: at the subject
    assert edit(0, 3, 7, "lives") == FactEdit(0, 3, 7, "ov", located.loc[(0, 3), "head0"], 0)
    assert edit(0, 3, 7, "mlp L1") == FactEdit(0, 3, 7, "mlp", None, 1)


def test_an_attention_only_model_at_depth_is_written_at_its_heads_only(located):
    """Without an MLP the study at depth writes each block's heads (an MLP write would be
    refused by the model), and a batch where each fact lives only."""
    from models.cli import override
    from models.recall.weights import init_weights

    cfg = override(DEPTH_MODEL, {"attn_only": True})
    heads = build_bridge(cfg.checkpoint_section(TASK), init_weights(cfg, TASK, 0), task=TASK)
    assert [row["store"] for row, _ in writes(heads, located, 0, 3, 7)] == ["attention L0", "attention L1"]
    assert batches(heads, located)[1] == ("lives",)


def test_the_table_by_label_and_store_has_one_cell_per_column_and_refused_writes_apart():
    """study's single edits -> the report's Markdown table: header, rule, a row per label x
    store x lives there, every line with the same 10 cells; a refused write is an edit row."""
    from analyses.edit_study_depth import table

    made = {"efficacy_k": 2, "efficacy_n": 2, "won_k": 1, "won_n": 1, **{f"kept_{g}_{x}": 8 for g in
                                                                         ("all", "same_subject", "same_relation")
                                                                         for x in "kn"}}
    single = pd.DataFrame([{"label": "mlp", "store": "mlp L1", "lives": True, REFUSED: "", **made},
                           {"label": "mlp", "store": "mlp L0", "lives": False, REFUSED: "fact 0:2 has no key"}])
    lines = table(single)
    assert lines[:2] == ["| label | store edited | lives there | edits | refused | efficacy | won | kept: all | "
                         "same subject | same relation |", "| --- " * 10 + "|"]
    assert lines[2] == "| mlp | mlp L0 | no | 1 | 1 | — | — | — | — | — |"
    assert lines[3].startswith("| mlp | mlp L1 | **yes** | 1 | — | 1.000 [0.342, 1.000] 2/2 | "
                               "1.000 [0.207, 1.000] 1/1 |")
    assert len(lines) == 4 and {line.count("|") for line in lines} == {11}


def test_an_edit_is_measured_at_the_study_s_margin_and_its_weight_change_is_the_whole_change():
    """measure on Theorem 4: a write at a head and the MLP at once reaches the study's margin (4,
    not the default 2) on held-out prompts, and its weight change is the Frobenius norm of every
    parameter's change together."""
    from probe.editing import edit_facts

    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), build("mlp", TASK, CONSTRUCTION_MODEL), task=TASK)
    s, r = 3, 1
    head = next(h for h, g in enumerate(head_groups(TASK, CONSTRUCTION_MODEL.n_heads)) if s in g)
    answer = next(a for a in TASK.relation_answers(r) if a != int(TASK.facts[s, r]))
    edits, settings = [FactEdit(s, r, answer, "both", head)], StudySettings(contexts=4, margin=4.0)
    table, specificity = measure(model, TASK, edits, settings, seed=3)
    assert table["new_margin"].iloc[0] == pytest.approx(4.0, abs=0.05) and table["efficacy"].iloc[0] == 1.0
    edited = dict(edit_facts(model, TASK, edits, 4, 3, 4.0).model.named_parameters())
    change = sum(float((edited[k] - p).detach().norm() ** 2) for k, p in model.named_parameters()) ** 0.5
    assert change > 0.1 and table["weight_change"].iloc[0] == pytest.approx(change, rel=1e-4)
    assert specificity["all"]["facts"] == TASK.n_facts - 1
