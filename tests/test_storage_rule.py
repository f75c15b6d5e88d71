"""The storage rule on hand-built models whose storage is known fact by fact: a component is
judged on its own recall, however loud the other one is, and chance is still rejected."""
import math

import pandas as pd
import pytest
import torch

from analyses.locate_facts import locate, write
from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, build_storage
from models.section import ATTN
from probe.contexts import TIE, ranks_first_in_block
from probe.storage import StorageRule

SMALL = dict(contexts=4, patch_contexts=1, progress=False)
EXPECTED = {"attention": "attention", "mlp": "mlp", "both": "both", "none": "not_stored"}
# balanced answers (each a* of two subjects per relation), so no answer dominates a mean write
TASK = override(CONSTRUCTION_TASK, {"facts": "structured"}).build()


def planned(attention_logit=5.0, mlp_logit=5.0):
    """A model keeping each fact where a fixed pattern says (attention, mlp, both, none)."""
    pattern = ["attention", "mlp", "both", "mlp", "both", "attention", "none", "both"]
    R = TASK.n_relations
    plan = [[pattern[(s * R + r) % len(pattern)] for r in range(R)] for s in range(TASK.n_subjects)]
    weights = build_storage(TASK, CONSTRUCTION_MODEL, plan, attention_logit, mlp_logit)
    return build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), weights), plan


@pytest.mark.parametrize("attention_logit, mlp_logit", [(5.0, 5.0), (5.0, 15.0), (15.0, 5.0)])
def test_every_fact_gets_its_planned_label_at_any_write_ratio(attention_logit, mlp_logit):
    model, plan = planned(attention_logit, mlp_logit)
    facts = locate(model, TASK, **SMALL).facts
    planned_labels = [EXPECTED[plan[s][r]] for s, r, _ in facts.index]
    assert facts["label"].tolist() == planned_labels
    both = facts[facts["label"] == "both"]
    assert len(both) == 12 and (both["attention_path_accuracy"] == 1).all() and (both["mlp_path_accuracy"] == 1).all()


def test_shares_are_nan_where_the_margin_is_not_positive(tmp_path):
    model, plan = planned()
    located = locate(model, TASK, **SMALL)
    facts = located.facts
    unknown = facts["label"] == "not_stored"
    assert unknown.sum() == 4 and (facts.loc[unknown, "margin"] < 0).all()
    for column in ("attention_share", "attention_share_low", "attention_share_high", "mlp_share", "mlp_share_high"):
        assert facts.loc[unknown, column].isna().all()
        assert facts.loc[~unknown, column].notna().all()
    known_both = facts[facts["label"] == "both"]
    assert ((known_both["attention_share"] - 0.5).abs() < 0.05).all()  # equal writes: half the margin each
    write(located, tmp_path)  # the tables, summary and figures take the NaN shares
    assert pd.read_csv(tmp_path / "facts.csv")["attention_share"].isna().sum() == 4
    assert (tmp_path / "margins.png").stat().st_size > 0


def with_random_ov(scale: float, seed: int):
    """The Theorem 4 model (the MLP keeps every fact) plus a random write of `scale` logits
    per answer from every OV row: a random, untrained OV circuit."""
    weights = build("mlp", CONSTRUCTION_TASK.build(), CONSTRUCTION_MODEL)
    writer = torch.linalg.pinv(weights["unembed.W_U"])  # [O, d]
    W_O = weights[ATTN + "W_O"]  # [H, d_head, d]
    g = torch.Generator().manual_seed(seed)
    W_O += scale * torch.randn(*W_O.shape[:2], writer.shape[0], generator=g) @ writer
    return build_bridge(CONSTRUCTION_MODEL.checkpoint_section(CONSTRUCTION_TASK.build()), weights)


@pytest.mark.parametrize("scale", [0.3, 1.0])
def test_a_random_ov_circuit_stores_nothing(scale):
    task = CONSTRUCTION_TASK.build()
    by_chance = 0
    for seed in range(6):
        facts = locate(with_random_ov(scale, seed), task, **SMALL).facts
        # facts whose attention path alone recalls them and whose random OV ranks a* first
        by_chance += ((facts["attention_path_accuracy"] >= 0.5) & (facts["attention_top"] >= 0.5)).sum()
        assert (facts["label"] == "mlp").mean() >= 0.95
        assert not (facts["label"] == "both").any()
    assert by_chance >= 4  # chance does pass both old tests, and the rule still rejects it


def test_the_mlp_path_keeps_attention_s_mean_write():
    """Attention writes a constant -K onto one answer that the unembedding bias lifts by +K:
    the MLP path must keep that mean write (mean-ablation), or the lifted answer wins."""
    task = CONSTRUCTION_TASK.build()
    weights = build("mlp", task, CONSTRUCTION_MODEL)
    decoy, K = 3, 100.0
    weights[ATTN + "b_O"] = -K * torch.linalg.pinv(weights["unembed.W_U"])[decoy]
    weights["unembed.b_U"][decoy] = K
    facts = locate(build_bridge(CONSTRUCTION_MODEL.checkpoint_section(task), weights), task, **SMALL).facts
    assert facts["accuracy"].min() == 1.0
    assert facts["mlp_path_accuracy"].min() == 1.0
    assert (facts["label"] == "mlp").all()


def test_denoising_tells_subject_heads_from_relation_heads():
    task = CONSTRUCTION_TASK.build()
    model_config = override(CONSTRUCTION_MODEL, {"attn_only": True})
    model = build_bridge(model_config.checkpoint_section(task), build("attention", task, model_config))
    heads = locate(model, task, **SMALL).heads.set_index("head")
    relation_heads = heads["n_relations"] > 0
    assert relation_heads.sum() == 1 and (heads["n_subjects"] > 0).sum() == CONSTRUCTION_MODEL.n_heads - 1
    T = task.seq_len
    for h, row in heads.iterrows():
        if relation_heads[h]:  # one of its relations is in every prompt
            assert row["relation_mass"] > 0.99 and row["subject_mass"] < 0.01
            assert row["relation_score"] > 0.99 and row["subject_score"] < 0
        else:  # its subject is in the prompt for len(group) / S of the facts; else it attends uniformly
            present = len(row["subjects"].split()) / task.n_subjects
            assert math.isclose(row["subject_mass"], present + (1 - present) / T, abs_tol=0.02)
            assert math.isclose(row["relation_mass"], (1 - present) / T, abs_tol=0.02)
            assert row["subject_score"] > 0.2 and row["relation_score"] < 0


def test_the_rule_s_thresholds_are_inclusive():
    """A fact exactly at `known`, and a component exactly at `sufficient` (path accuracy and
    top) and at `chance` (top_z), count; just below does not; a known fact neither
    component stores is `distributed`. One label per row, under the row's index, named label."""
    at, below = dict(path=0.5, top=0.5, z=3.0), dict(path=0.5, top=0.49, z=3.0)
    rows = {  # index: (accuracy, attention, mlp, expected label)
        10: (0.5, at, below, "attention"),
        11: (1.0, below, at, "mlp"),
        12: (1.0, at, at, "both"),
        13: (1.0, below, dict(path=0.49, top=1.0, z=9.0), "distributed"),
        14: (1.0, dict(path=1.0, top=1.0, z=2.99), below, "distributed"),
        15: (0.49, at, at, "not_stored"),
    }
    facts = pd.DataFrame({i: {"accuracy": a, **{f"{c}_{k}": v for c, part in (("attention", att), ("mlp", mlp))
                                                for k, v in (("path_accuracy", part["path"]), ("top", part["top"]),
                                                             ("top_z", part["z"]))}}
                          for i, (a, att, mlp, _) in rows.items()}).T.astype(float)
    labels = StorageRule().label(facts)
    assert labels.name == "label" and labels.index.tolist() == list(rows)
    assert labels.tolist() == [label for *_, label in rows.values()]


def test_a_margin_of_exactly_tie_is_no_pick():
    """ranks_first_in_block reads a*'s relation block only: a* first by exactly TIE is a
    tie (not first), and the margin is a*'s logit minus the best other logit of A_r."""
    D = 3
    logits = torch.tensor([[9.0, 9.0, 9.0, 0.0, 0.0, TIE],  # relation 1, a* = 5: ahead by exactly TIE
                           [2.0, 0.5, -1.0, 9.0, 9.0, 9.0],  # relation 0, a* = 0: first by 1.5
                           [9.0, 9.0, 9.0, 3.0, 1.0, 0.0]], dtype=torch.float64)  # relation 1, a* = 4: 2 behind
    relations, answers = torch.tensor([1, 0, 1]), torch.tensor([5, 0, 4])
    first, margin = ranks_first_in_block(logits, relations, answers, D)
    assert first.tolist() == [0.0, 1.0, 0.0]
    assert margin.tolist() == [TIE, 1.5, -2.0]
