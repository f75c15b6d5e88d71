"""Activation patching, the hallucination phases and their detection, pinned to values computed by hand."""
import re

import pytest
import torch

from models import build_bridge
from models.recall.config import ModelConfig
from models.recall.constructions import build, build_storage, head_groups
from probe.patching import activation_patching, corrupted_prompts
from probe.phases import Phase, PhaseRule, hallucination_phase, in_phase
from probe.prompts import FactPrompts, fact_batch
from probe.stats import with_interval
from tasks.factual_recall import FactualRecallTask

# S = 4, R = 3, D = 2. Relation 0: subjects 0, 2 -> 0, subjects 1, 3 -> 1; relation 1:
# subjects 0, 3 -> 2, subjects 1, 2 -> 3; relation 2: every subject -> 4 (no subject swap
# changes the answer).
FACTS = [[0, 2, 4], [1, 3, 4], [0, 3, 4], [1, 2, 4]]
TASK = FactualRecallTask(4, 3, 2, 4, 5, facts=FACTS)


def _swaps(s: int, r: int) -> set[int]:
    """The subjects whose swap into (s, r) changes the answer."""
    return {t for t in range(TASK.n_subjects) if t != s and FACTS[t][r] != FACTS[s][r]}


def test_subject_corruption_swaps_in_a_subject_with_another_answer():
    """Each prompt's subject token becomes one of the subjects with another answer (each
    of them drawn over the contexts), the other tokens stay, the rival answer is that
    subject's, and -1 where no swap changes the answer (relation 2)."""
    batch = fact_batch(TASK, 64, seed=0)
    tokens, answer = corrupted_prompts(TASK, batch, "subject", torch.Generator().manual_seed(0))
    rows = torch.arange(len(batch))
    swapped = tokens[rows, batch.subject_pos]
    assert torch.equal(tokens.index_put((rows, batch.subject_pos), batch.subjects), batch.tokens)
    drawn: dict[tuple[int, int], set[int]] = {}
    for i in range(len(batch)):
        s, r = int(batch.subjects[i]), int(batch.relations[i])
        if r == 2:
            assert answer[i] == -1
            continue
        t = int(swapped[i])
        assert t in _swaps(s, r) and answer[i] == FACTS[t][r]
        drawn.setdefault((s, r), set()).add(t)
    assert all(drawn[s, r] == _swaps(s, r) for s in range(4) for r in range(2))


def test_relation_corruption_swaps_in_another_relation_token():
    """The relation token becomes another relation's token (id S + r'), every other
    relation drawn over the contexts; the rival answer is a*(s, r')."""
    batch = fact_batch(TASK, 32, seed=0)
    tokens, answer = corrupted_prompts(TASK, batch, "relation", torch.Generator().manual_seed(0))
    rows = torch.arange(len(batch))
    other = tokens[rows, batch.relation_pos] - TASK.n_subjects
    assert torch.equal(tokens.index_put((rows, batch.relation_pos), TASK.n_subjects + batch.relations), batch.tokens)
    assert ((other >= 0) & (other < 3) & (other != batch.relations)).all()
    assert torch.equal(answer, TASK.facts[batch.subjects, other])
    for s in range(4):
        for r in range(3):
            mine = (batch.subjects == s) & (batch.relations == r)
            assert set(other[mine].tolist()) == set(range(3)) - {r}


def test_corruption_must_be_subject_or_relation():
    batch = fact_batch(TASK, 1, seed=0)
    with pytest.raises(ValueError, match=re.escape("corrupt must be 'subject' or 'relation', got 'answer'.")):
        corrupted_prompts(TASK, batch, "answer", torch.Generator())


# Theorem 3 on TASK: subject heads {0, 2} and {1, 3}, one relation head; each token's OV
# row writes 10 onto its answers, the MLP writes nothing. One-hot embeddings: the logits
# are exact.
CFG = ModelConfig(d_model=18, n_heads=3, d_head=4, d_mlp=8, embedding="onehot")


@pytest.fixture(scope="module")
def theorem3():
    return build_bridge(CFG.checkpoint_section(TASK), build("attention", TASK, CFG))


def test_patching_restores_the_subject_head_share_by_hand(theorem3):
    """Clean: a* gets 10 (subject) + 10 (relation), the rival a' 10: diff 10. Corrupted:
    -10. Patching the subject's head restores all (1) when the swapped-in subject shares
    it, else half (0.5: a* and a' both at 20); the swapped-in subject's head restores the
    other half; the relation head and the MLP nothing. NaN where no swap exists; the
    intervals are bootstrapped with the prompts' seed."""
    assert head_groups(TASK, 3) == [[0, 2], [1, 3], [4, 5, 6]]
    prompts = FactPrompts.build(theorem3, TASK, contexts=8, seed=3)
    frame = activation_patching(theorem3, TASK, prompts=prompts)  # corrupt="subject" by default
    names = [f"patch_subject_{c}" for c in ("head0", "head1", "head2", "mlp")]
    assert list(frame.columns) == [n + tail for n in names for tail in ("", "_low", "_high")]
    tokens, _ = corrupted_prompts(TASK, prompts.batch, "subject", torch.Generator().manual_seed(3 + 1))
    swapped = tokens[torch.arange(len(prompts.batch)), prompts.batch.subject_pos]
    same = (swapped % 2 == prompts.batch.subjects % 2).float()  # same subject head
    head_of = [prompts.batch.subjects % 2 == h for h in range(2)]
    expected = {"head0": torch.where(head_of[0], 0.5 + 0.5 * same, 0.5 - 0.5 * same),
                "head1": torch.where(head_of[1], 0.5 + 0.5 * same, 0.5 - 0.5 * same),
                "head2": torch.zeros(len(swapped)), "mlp": torch.zeros(len(swapped))}
    invalid = prompts.per_fact(prompts.batch.relations == 2)[:, 0]
    assert invalid.sum() == 4
    for component, values in expected.items():
        name = f"patch_subject_{component}"
        want = with_interval(name, prompts.per_fact(values), seed=3)
        for column, value in want.items():
            got = torch.tensor(frame[column].to_numpy())
            assert got[invalid].isnan().all(), column
            assert torch.allclose(got[~invalid], value[~invalid], atol=1e-6), column
    assert frame["patch_subject_head0_high"].gt(frame["patch_subject_head0_low"]).any()  # the seed matters


def test_patching_scales_from_a_gap_of_exactly_1e_6():
    """Subject writes of g / 2 and no relation writes: clean diff g / 2, corrupted -g / 2.
    At a gap g of exactly float32(1e-6) the shares are scaled (the relation head restores
    0), one float below it there is nothing to restore (NaN)."""
    gap = torch.tensor(1e-6, dtype=torch.float32)
    plan = [["attention"] * TASK.n_relations for _ in range(TASK.n_subjects)]
    for write, scaled in ((gap / 2, True), (torch.nextafter(gap / 2, torch.tensor(0.0)), False)):
        weights = build_storage(TASK, CFG, plan, attention_logit=float(write), relation_logit=0.0)
        frame = activation_patching(build_bridge(CFG.checkpoint_section(TASK), weights), TASK, "subject", contexts=2)
        valid = frame.index.get_level_values("relation") != 2
        head2 = frame.loc[valid, "patch_subject_head2"]
        assert (head2 == 0.0).all() if scaled else head2.isna().all()


# ------------------------------------------------------------------ phases
# level 2: in the phase when |loss - 2| <= 0.5, relation-only <= 0.5, subject-only >= 1
RULE = PhaseRule(level_tolerance=0.25, relation_only_max=0.5, subject_only_min=1.0, min_snapshots=3, min_octaves=1.0)
OUT = (3.5, 1.4, 2.1)  # a snapshot outside the phase (loss above the band)


def test_in_phase_holds_exactly_at_each_threshold():
    assert in_phase(2.5, 0.5, 1.0, 2.0, RULE) and in_phase(1.5, 0.5, 1.0, 2.0, RULE)
    assert not in_phase(2.5001, 0.5, 1.0, 2.0, RULE)
    assert not in_phase(2.0, 0.5001, 1.0, 2.0, RULE)
    assert not in_phase(2.0, 0.5, 0.9999, 2.0, RULE)


def _curves(rows):
    loss, relation_only, subject_only = (list(x) for x in zip(*rows))
    return loss, relation_only, subject_only


def test_phase_fields_by_hand():
    """Phase at steps 1..9 (indices 1..3): medians are the middle of three values, the
    exit is the last snapshot, log2(10 / 2) = 2.3219 octaves rounded to 3 decimals."""
    steps = [0, 1, 4, 9, 17]
    rows = [OUT, (2.4, 0.5, 1.0), (1.8, 0.0, 3.0), (2.1, 0.25, 2.0), (0.01, 0.0, 0.0)]
    phase = hallucination_phase(steps, *_curves(rows), 2.0, RULE)
    assert phase.to_dict() == {
        "start_step": 1, "end_step": 9, "exit_step": 17, "plateau_loss": 2.1, "relation_only_loss": 0.25,
        "subject_only_loss": 2.0, "length_steps": 8, "length_octaves": 2.322, "n_snapshots": 3}
    assert isinstance(phase, Phase)


def test_phase_at_the_minimum_length_and_the_longest_in_octaves():
    """Two lasting runs of 3 snapshots: steps 1..7 (log2(8 / 2) = 2 octaves) beats the
    later 100..400 (log2(401 / 101) = 1.99); with min_octaves = 2 exactly, 1..7 alone lasts."""
    rule = PhaseRule(level_tolerance=0.25, relation_only_max=0.5, subject_only_min=1.0, min_snapshots=3,
                     min_octaves=1.98)
    steps = [1, 3, 7, 50, 100, 200, 400, 800]
    inside = (2.0, 0.0, 2.0)
    rows = [inside, inside, inside, OUT, inside, inside, inside, OUT]
    phase = hallucination_phase(steps, *_curves(rows), 2.0, rule)
    assert (phase.start_step, phase.end_step, phase.exit_step, phase.n_snapshots) == (1, 7, 50, 3)
    exact = PhaseRule(level_tolerance=0.25, relation_only_max=0.5, subject_only_min=1.0, min_snapshots=3,
                      min_octaves=2.0)
    phase = hallucination_phase(steps, *_curves(rows), 2.0, exact)
    assert (phase.start_step, phase.end_step, phase.length_octaves) == (1, 7, 2.0)


def test_a_phase_needs_both_snapshots_and_octaves():
    """A run of 2 snapshots over 1.5 octaves and a run of 3 snapshots over 0.26 octaves:
    neither lasts, so no phase."""
    steps = [0, 10, 30, 40, 100, 110, 120, 500]
    inside = (2.0, 0.0, 2.0)
    rows = [OUT, inside, inside, OUT, inside, inside, inside, OUT]
    assert hallucination_phase(steps, *_curves(rows), 2.0, RULE) is None
    # the same 2-snapshot run is a phase when 2 snapshots are enough
    two = PhaseRule(level_tolerance=0.25, relation_only_max=0.5, subject_only_min=1.0, min_snapshots=2,
                    min_octaves=1.0)
    phase = hallucination_phase(steps, *_curves(rows), 2.0, two)
    assert (phase.start_step, phase.end_step, phase.n_snapshots) == (10, 30, 2)


def test_steps_must_increase_strictly():
    same = r"^steps must be strictly increasing\.$"
    for steps in ([0, 0, 1], [0, 2, 1, 3]):
        with pytest.raises(ValueError, match=same):
            hallucination_phase(steps, [2.0] * len(steps), [0.0] * len(steps), [2.0] * len(steps), 2.0)
    with pytest.raises(ValueError, match=r"^steps and the three loss curves must have the same length\.$"):
        hallucination_phase([0, 1], [1.0, 1.0], [1.0], [1.0, 1.0], 1.0)


def test_phase_rule_accepts_zero_and_names_the_flag():
    rule = PhaseRule(level_tolerance=0, relation_only_max=0, subject_only_min=0, min_snapshots=1, min_octaves=0)
    assert (rule.level_tolerance, rule.min_snapshots, rule.min_octaves) == (0, 1, 0)
    for name in ("level_tolerance", "relation_only_max", "subject_only_min", "min_octaves"):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(ValueError, match=re.escape(f"{flag} must be >= 0, got -0.5.")):
            PhaseRule(**{name: -0.5})
    with pytest.raises(ValueError, match=re.escape("--min-snapshots must be >= 1, got 0.")):
        PhaseRule(min_snapshots=0)
