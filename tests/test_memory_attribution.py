"""The associative-memory probes, the logit attribution and the ablations, pinned to values computed by hand."""
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from models import build_bridge
from models.cli import override
from models.recall.config import TaskConfig
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build
from probe import columns
from probe.ablation import ablation_hooks, ablations, n_ablation_runs
from probe.attribution import above_chance, direct_logit_attribution
from probe.hooks import HOOK_MLP_OUT, CleanRun
from probe.memory import idealised_residual, recall_probes
from probe.prompts import FactPrompts
from probe.stats import ratio_with_interval, share_with_interval, with_interval
from tasks.factual_recall import Batch

TASK = CONSTRUCTION_TASK.build()
# subject, relation, EOS: no noise token at all
NOISELESS = TaskConfig(n_subjects=8, n_relations=4, answers_per_relation=4, n_noise=0, seq_len=3).build()
SMALL = TaskConfig(n_subjects=3, n_relations=2, answers_per_relation=2, n_noise=0, seq_len=3).build()


def bridge(task, kind="mlp", cfg=CONSTRUCTION_MODEL):
    return build_bridge(cfg.checkpoint_section(task), build(kind, task, cfg))


# --- associative-memory probes -------------------------------------------------------------


def test_idealised_residual_without_noise_tokens_puts_the_noise_at_its_position_only():
    """With no noise token, attention on "noise" reads only the mean position of the first
    T-1 slots: residual = EOS embedding + EOS position + sum_h W_pos[:-1].mean W_V^h W_O^h
    (the construction has no b_V, b_O)."""
    model = bridge(NOISELESS)
    F, H = NOISELESS.n_facts, model.cfg.n_heads
    alpha = {k: torch.zeros(F, H) for k in ("subject", "relation", "eos")} | {"noise": torch.ones(F, H)}
    with torch.no_grad():
        position = model.W_pos[:-1].mean(0)
        expected = model.W_E[NOISELESS.eos] + model.W_pos[-1] \
            + sum(position @ model.W_V[0, h] @ model.W_O[0, h] for h in range(H))
        got = idealised_residual(model, NOISELESS, alpha)
    assert torch.allclose(got, expected.expand(F, -1), atol=1e-5)


def test_the_mlp_probe_recalls_every_fact_without_noise_tokens():
    """The Theorem 4 MLP stores every fact: with no noise tokens the MLP probe, fed the
    idealised residual, ranks a* first for all of them."""
    probes = recall_probes(bridge(NOISELESS), NOISELESS, contexts=2)
    assert (probes[columns.MLP_PROBE] == 1.0).all()


# --- direct logit attribution on a hand-written clean run ----------------------------------

C = 16  # contexts per fact
SEED = 3
# per fact of SMALL (6 facts) and context: what head0, head1, the MLP and the direct path
# write onto a* (nothing onto the other answer of A_r, so each write is its margin); fact 0
# varies over contexts, the others are constant: margin, attention, MLP
# 1: (0, 1, -1), 2: (0.5, 0.5, -0.25), 3: (1, 0, -1), 4: (2, -1, 0), 5: (2.5, -1, 0.5)
VARYING = torch.arange(C, dtype=torch.float)
CONSTANT = {"head0": [1, 0.5, 0, -1, -1], "head1": [0, 0, 0, 0, 0], "mlp": [-1, -0.25, -1, 0, 0.5],
            "direct": [0, 0.25, 2, 3, 3]}
WRITES = {k: torch.cat([fact0[None], torch.tensor(v, dtype=torch.float)[:, None].expand(-1, C)])
          for (k, v), fact0 in zip(CONSTANT.items(), (VARYING % 5 - 1.5, VARYING % 3 - 0.5, VARYING % 7 - 2,
                                                      (VARYING % 4) / 4))}


def hand_prompts():
    """FactPrompts of SMALL whose clean run is WRITES, with the identity as unembedding."""
    subjects, relations, answers = (t.repeat_interleave(C) for t in SMALL.all_facts())
    n, O = len(answers), SMALL.n_relations * SMALL.answers_per_relation
    w = {k: v.reshape(n) for k, v in WRITES.items()}
    onto_answer = torch.nn.functional.one_hot(answers, O).float()  # [n, O]
    heads = torch.stack([w["head0"][:, None] * onto_answer, w["head1"][:, None] * onto_answer], 1)  # [n, 2, O]
    mlp, direct = w["mlp"][:, None] * onto_answer, w["direct"][:, None] * onto_answer
    zeros = torch.zeros(n, SMALL.seq_len, dtype=torch.long)
    batch = Batch(zeros, subjects, relations, answers, zeros[:, 0], zeros[:, 0] + 1)
    run = CleanRun(zeros, heads.sum(1) + mlp + direct, heads, mlp, heads.sum(1), None, None, None)
    facts = pd.MultiIndex.from_arrays([t.numpy() for t in SMALL.all_facts()], names=columns.FACT)
    return SimpleNamespace(W_U=torch.eye(O)), FactPrompts(batch, run, facts, C, SEED)


def hand_margins():
    """Each component's margin [F, C], from WRITES."""
    m = dict(WRITES)
    m["attention"] = m["head0"] + m["head1"]
    m["total"] = m["attention"] + m["mlp"] + m["direct"]
    return m


def test_logit_attribution_columns_are_the_documented_ones():
    """margin, X_margin and X_top for head0, head1, attention, mlp, direct (each with its
    interval), the stores' own margin (interval), top_chance, top_z and share (interval)."""
    model, prompts = hand_prompts()
    got = direct_logit_attribution(model, SMALL, prompts=prompts)
    expected = set(columns.interval(columns.MARGIN))
    for name in ("head0", "head1", "attention", "mlp", "direct"):
        expected |= set(columns.interval(columns.margin(name))) | set(columns.interval(columns.top(name)))
    for store in columns.STORES:
        expected |= set(columns.interval(columns.own_margin(store))) | set(columns.interval(columns.share(store)))
        expected |= {columns.top_chance(store), columns.top_z(store)}
    assert set(got.columns) == expected
    assert "direct_margin" in got.columns and "attention_own_margin" in got.columns


def test_logit_attribution_terms_add_up_to_the_margin():
    """Each term is its write's mean over contexts, the direct path included (logits minus
    attention minus MLP), and head0 + head1 + MLP + direct = margin."""
    model, prompts = hand_prompts()
    got = direct_logit_attribution(model, SMALL, prompts=prompts)
    m = hand_margins()
    for name in ("head0", "head1", "attention", "mlp", "direct"):
        assert got[columns.margin(name)].to_numpy() == pytest.approx(m[name].mean(1).numpy()), name
    parts = got[[columns.margin(k) for k in ("head0", "head1", "mlp", "direct")]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(got[columns.MARGIN].to_numpy())
    assert got[columns.MARGIN].to_numpy() == pytest.approx(m["total"].mean(1).numpy())


def test_logit_attribution_intervals_use_the_prompts_seed():
    """Every interval is with_interval (ratio_with_interval for shares of the margin,
    share_with_interval for the top-answer rates) of the per-context values, seeded with the
    prompts' seed (3), not the default."""
    model, prompts = hand_prompts()
    got = direct_logit_attribution(model, SMALL, prompts=prompts)
    m = hand_margins()
    expected = with_interval(columns.MARGIN, m["total"], SEED)
    for name in ("head0", "attention", "mlp", "direct"):
        expected |= with_interval(columns.margin(name), m[name], SEED)
        expected |= share_with_interval(columns.top(name), (m[name] > 0).float())  # a* against 0: a share
    for store in columns.STORES:
        expected |= with_interval(columns.own_margin(store), m[store], SEED)
    for name, values in expected.items():
        assert got[name].to_numpy() == pytest.approx(values.numpy()), name
    unseeded = with_interval(columns.MARGIN, m["total"])[columns.MARGIN + "_low"]
    assert got[columns.MARGIN + "_low"].iloc[0] != pytest.approx(float(unseeded[0]))  # the seed shows
    for store in columns.STORES:
        share = ratio_with_interval(columns.share(store), m[store], m["total"], SEED)
        for name, values in share.items():
            assert got[name].iloc[0] == pytest.approx(float(values[0])), name


def test_logit_attribution_shares_are_nan_exactly_where_they_mean_nothing():
    """Shares are NaN where the margin is not positive (fact 1: exactly 0, attention 1 and
    MLP -1) or both stores' margins are negative, and finite at the boundaries: a margin of
    0.5 (fact 2), an attention margin of exactly 0 or 0.5 (facts 3, 2) or an MLP margin of
    exactly 0 or 0.5 (facts 4, 5) beside a negative other store."""
    model, prompts = hand_prompts()
    got = direct_logit_attribution(model, SMALL, prompts=prompts)
    for store in columns.STORES:
        share = got[columns.share(store)].to_numpy()
        assert pd.isna(share[1]), store
        assert not pd.isna(share[[0, 2, 3, 4, 5]]).any(), store
    m = hand_margins()
    assert got["attention_share"].iloc[2] == pytest.approx(float(m["attention"][2].mean() / m["total"][2].mean()))


def test_above_chance_counts_every_pick_and_uses_the_binomial_error():
    """Relation 0: picks 0, 0, 1 over answers 0, 0, 1; relation 1: one prompt picking its
    answer. chance = (2/3 * 2 + 1/3 * 1 + 1 * 1) / 4 = 2/3; with top = 3/4 over F = 4 facts,
    z = (3/4 - 2/3) / sqrt(2/3 * 1/3 / 4) = 1 / (2 sqrt 2)."""
    relations = torch.tensor([0, 0, 0, 1])
    picks, targets = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 1])
    D = SMALL.answers_per_relation
    logits = torch.nn.functional.one_hot(relations * D + picks, SMALL.n_relations * D).float()
    batch = SimpleNamespace(relations=relations, answers=relations * D + targets)
    chance, z = above_chance(logits, SMALL, batch, torch.tensor([1.0, 1.0, 0.0, 1.0]))
    assert chance == pytest.approx(2 / 3)
    assert z == pytest.approx(1 / (2 * 2 ** 0.5))


# --- ablations ------------------------------------------------------------------------------


def test_mlp_ablation_hooks_write_zero_or_the_mean_at_the_last_position():
    """zero_ablate_mlp sets hook_mlp_out at EOS to 0, mean_ablate_mlp to the clean run's
    mean MLP output; earlier positions are untouched."""
    model = bridge(TASK)
    prompts = FactPrompts.build(model, TASK, contexts=1)
    hooks = ablation_hooks(model, TASK, prompts=prompts)
    x = torch.randn(3, TASK.seq_len, model.cfg.d_model)
    for kind, value in (("zero", torch.zeros(model.cfg.d_model)), ("mean", prompts.run.mlp_out.mean(0))):
        [(name, hook)] = hooks[columns.ablation(kind, "mlp")]
        out = hook(x, hook=None)
        assert name == HOOK_MLP_OUT
        assert torch.equal(out[:, :-1], x[:, :-1])
        assert torch.allclose(out[:, -1], value.expand(3, -1)), kind


@pytest.mark.parametrize("attn_only, runs", [(False, 2 * (4 + 1 + 1) + 1), (True, 2 * (4 + 1) + 1)])
def test_n_ablation_runs_counts_the_runs_ablations_makes(attn_only, runs):
    """H = 4: zero and mean ablation of all heads, each head and the MLP (when there is
    one), plus the MLP path: 13 runs, 11 without an MLP; progress is called once per run."""
    cfg = override(CONSTRUCTION_MODEL, {"attn_only": attn_only})
    model = bridge(TASK, "attention", cfg)
    calls = []
    ablations(model, TASK, contexts=1, progress=lambda: calls.append(1))
    assert n_ablation_runs(model) == len(calls) == runs


def test_the_attention_path_is_the_mean_ablated_mlp_accuracy():
    """The Theorem 4 model stores every fact in the MLP: the plain accuracy is 1, and the
    attention path is the MLP mean-ablated, which loses facts."""
    model = bridge(TASK)
    got = ablations(model, TASK, contexts=2)
    path = got[columns.path_accuracy("attention")]
    assert path.equals(got[columns.ablated_accuracy("mean", "mlp")].rename(path.name))
    assert path.mean() < 1.0
