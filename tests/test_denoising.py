"""Attention-denoising scores, the head-token table and specialisation, measured on
constructions whose attention is known."""
from dataclasses import fields

import pandas as pd
import pytest

from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build
from probe.denoising import attention_masses, denoising_scores, head_token_table, specialisation
from probe.prompts import FactPrompts
from probe.stats import with_interval

TASK = CONSTRUCTION_TASK.build()
ATTN_ONLY = override(CONSTRUCTION_MODEL, {"attn_only": True})
MASSES = ("subject", "relation", "eos", "noise")


@pytest.fixture(scope="module")
def theorem3():
    """The attention construction: three subject heads, one relation head (H = 4)."""
    return build_bridge(ATTN_ONLY.checkpoint_section(TASK), build("attention", TASK, ATTN_ONLY))


def test_denoising_frame_columns_scores_and_per_head_intervals(theorem3):
    """One row per head: head, uniform_mass = 1/T, each mass with its interval drawn from
    seed + head, the scores (mass - 1/T) / (1 - 1/T) and the better of the two."""
    prompts = FactPrompts.build(theorem3, TASK, contexts=8, seed=5)
    frame = denoising_scores(theorem3, TASK, prompts=prompts)
    assert list(frame.columns) == ["head", "uniform_mass"] + [
        f"{name}_mass{end}" for name in MASSES for end in ("", "_low", "_high")] + [
        "subject_score", "relation_score", "denoising_score"]
    T = TASK.seq_len
    assert frame["head"].tolist() == list(range(ATTN_ONLY.n_heads))
    assert (frame["uniform_mass"] == 1 / T).all()
    for part in ("subject", "relation"):
        by_hand = (frame[f"{part}_mass"] - 1 / T) / (1 - 1 / T)
        assert frame[f"{part}_score"].to_numpy() == pytest.approx(by_hand.to_numpy(), abs=1e-12)
    assert (frame["denoising_score"] == frame[["subject_score", "relation_score"]].max(axis=1)).all()
    masses = attention_masses(theorem3, TASK, prompts=prompts)
    moved = False  # another seed gives another interval somewhere, so the seed is pinned
    for h in range(ATTN_ONLY.n_heads):
        for name in MASSES:
            column = f"{name}_mass"
            by_hand = with_interval(column, masses[name][:, h], 5 + h)
            for key, value in by_hand.items():
                assert frame.loc[h, key] == pytest.approx(float(value), abs=1e-7), (h, key)
            other = with_interval(column, masses[name][:, h], 5 - h)
            moved |= float(other[f"{column}_low"]) != float(by_hand[f"{column}_low"])
    assert moved


def _subset(prompts: FactPrompts, index: list[int]) -> FactPrompts:
    """`prompts` cut down to the prompts at `index` (every field of the batch and the run)."""
    def cut(x):
        return type(x)(*(getattr(x, f.name)[index] for f in fields(x)))
    return FactPrompts(cut(prompts.batch), cut(prompts.run), prompts.facts, prompts.contexts, prompts.seed)


def test_head_token_table_means_over_the_prompts_holding_each_token(theorem3):
    """Entry [h, S<i>] is the mean subject mass of head h over the prompts whose subject is
    i (0 where none is), likewise R<j>; the index is named head."""
    prompts = FactPrompts.build(theorem3, TASK, contexts=2, seed=0)
    b = prompts.batch
    once = int(((b.subjects == 0) & (b.relations == 0)).nonzero()[0])  # subject 0, relation 0: one prompt
    twice = ((b.subjects == 1) & (b.relations == 1)).nonzero()[:, 0].tolist()  # two prompts of (1, 1)
    index = [once] + twice
    table = head_token_table(theorem3, TASK, prompts=_subset(prompts, index))
    S, R, H = TASK.n_subjects, TASK.n_relations, ATTN_ONLY.n_heads
    assert list(table.columns) == [f"S{i}" for i in range(S)] + [f"R{j}" for j in range(R)]
    assert table.index.name == "head" and table.index.tolist() == list(range(H))
    pattern = prompts.run.pattern
    for h in range(H):
        subject = [float(pattern[i, h, b.subject_pos[i]]) for i in index]
        relation = [float(pattern[i, h, b.relation_pos[i]]) for i in index]
        expected = {"S0": subject[0], "S1": (subject[1] + subject[2]) / 2,
                    "R0": relation[0], "R1": (relation[1] + relation[2]) / 2}
        for column in table.columns:
            assert table.loc[h, column] == pytest.approx(expected.get(column, 0.0), abs=1e-6), (h, column)
    assert table.to_numpy().max() > 0.9  # the construction's heads do attend to these tokens


def test_specialisation_keeps_masses_at_or_above_the_threshold():
    """A head specialises in a token given at least `threshold` of its attention (exactly
    the threshold counts); the tokens are listed space-joined, subjects and relations apart."""
    table = pd.DataFrame([[0.5, 0.7, 0.49, 0.5, 0.9, 0.1], [0.0] * 6],
                         columns=["S0", "S1", "S2", "R0", "R1", "R2"], index=pd.Index([0, 1], name="head"))
    got = specialisation(table, threshold=0.5)
    expected = pd.DataFrame({"head": [0, 1], "subjects": ["S0 S1", ""], "relations": ["R0 R1", ""],
                             "n_subjects": [2, 0], "n_relations": [2, 0]})
    pd.testing.assert_frame_equal(got, expected)
