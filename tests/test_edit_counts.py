"""analyses/edit_counts.py: the editing study's shares as k of n with Wilson's interval, held
to the published numbers of Wilson's and Newcombe's intervals."""
import json
import math

import pandas as pd
import pytest

from analyses.edit_counts import batch_counts, cell, counted, difference, pooled, single_counts

Z2 = 1.959963984540054 ** 2


def test_a_count_gets_wilson_s_interval():
    row = counted("kept", 63, 64)
    assert row["kept"] == 63 / 64 and (row["kept_k"], row["kept_n"]) == (63, 64)
    assert row["kept_low"] == pytest.approx(0.91666, abs=1e-4) and row["kept_high"] == pytest.approx(0.99724, abs=1e-4)
    none, every = counted("x", 0, 64), counted("x", 64, 64)
    assert none["x_low"] == 0.0 and none["x_high"] == pytest.approx(Z2 / (64 + Z2), abs=1e-6)  # 0 of 64: [0, 5.7%]
    assert every["x_high"] == 1.0 and every["x_low"] == pytest.approx(64 / (64 + Z2), abs=1e-6)
    empty = counted("x", 0, 0)
    assert (empty["x_k"], empty["x_n"]) == (0, 0) and all(math.isnan(empty[k]) for k in ("x", "x_low", "x_high"))


def test_one_edit_counts_its_prompts_and_wins_only_on_every_prompt():
    specificity = {"all": {"share": 0.5, "facts": 3}, "same_subject": {"share": None, "facts": 0}}
    row = single_counts({"efficacy": 0.75}, specificity, contexts=4)
    assert (row["efficacy_k"], row["efficacy_n"], row["won_k"], row["won_n"]) == (3, 4, 0, 1)
    assert (row["kept_all_k"], row["kept_all_n"]) == (6, 12)  # half of 3 facts' 4 prompts each
    assert row["kept_same_subject_n"] == 0 and math.isnan(row["kept_same_subject"])
    won = single_counts({"efficacy": 1.0}, specificity, contexts=4)
    assert (won["won_k"], won["won"], won["efficacy_k"]) == (1, 1.0, 4)


def test_a_batch_counts_its_facts_prompts_and_the_others():
    table = pd.DataFrame({"efficacy": [1.0, 0.5, 0.25]})
    row = batch_counts(table, {"all": {"share": 0.75, "facts": 5}}, contexts=4)
    assert (row["efficacy_k"], row["efficacy_n"]) == (7, 12) and (row["won_k"], row["won_n"]) == (1, 3)
    assert (row["kept_k"], row["kept_n"]) == (15, 20)
    every = batch_counts(table, {"all": {"share": None, "facts": 0}}, contexts=4)  # no other fact left to keep
    assert every["kept_n"] == 0 and math.isnan(every["kept"]) and every["won_n"] == 3


def test_pooled_cells_add_the_counts():
    frame = pd.DataFrame({"label": ["mlp", "mlp", "attention"], "store": ["ov", "ov", "ov"],
                          "efficacy_k": [3, 4, 0], "efficacy_n": [4, 4, 4], "won_k": [0, 1, 0], "won_n": [1, 1, 1]})
    cells = {c["label"]: c for c in pooled(frame, ["label", "store"], ("efficacy", "won", "kept"))}
    mlp = cells["mlp"]
    assert (mlp["store"], mlp["rows"], mlp["efficacy_k"], mlp["efficacy_n"], mlp["won_k"], mlp["won_n"]) == \
        ("ov", 2, 7, 8, 1, 2)
    assert mlp["efficacy"] == 7 / 8 and mlp["efficacy_low"] == pytest.approx(counted("e", 7, 8)["e_low"])
    assert "kept" not in mlp and cells["attention"]["efficacy"] == 0.0 and cells["attention"]["rows"] == 1
    single = pooled(frame, ["label"], ("efficacy",))
    assert [c["label"] for c in single] == ["attention", "mlp"] and isinstance(single[0]["label"], str)
    sizes = pooled(frame.assign(n=[4, 4, 16], lives=[True, True, False]), ["n", "lives"], ("won",))
    assert json.loads(json.dumps(sizes))[0] == {"n": 4, "lives": True, "rows": 2, **counted("won", 1, 2)}  # plain JSON


def test_the_difference_takes_newcombe_s_interval():
    """Newcombe (1998), method 10, his example 56/70 against 48/80: 0.0524 to 0.3339."""
    d = difference(counted("s", 56, 70), counted("s", 48, 80), "s")
    assert d["difference"] == pytest.approx(0.2)
    assert d["low"] == pytest.approx(0.0524, abs=1e-4) and d["high"] == pytest.approx(0.3339, abs=1e-4)


def test_a_table_cell_shows_share_interval_and_count():
    assert cell(counted("s", 63, 64), "s") == "0.984 [0.917, 0.997] 63/64"
    assert cell(counted("s", 1, 3), "s", digits=2) == "0.33 [0.06, 0.79] 1/3"
    assert cell(counted("s", 0, 0), "s") == "—" and cell({}, "s") == "—"
