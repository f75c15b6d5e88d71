"""Each instrument pinned on a hand-built model where a wrong reading shows: the EOS
attention mass, the OV recall probe's relation term, per-head ablations, the attention path's
mean-ablated MLP, and which head tops the denoising scores."""
import pytest
import torch

from analyses.locate_facts import locate
from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, build_storage, head_groups
from models.section import ATTN, MLP
from probe.ablation import ablations
from probe.denoising import denoising_scores
from probe.memory import recall_probes

SMALL = dict(contexts=4, patch_contexts=1, progress=False)
TASK = CONSTRUCTION_TASK.build()
ATTN_ONLY = override(CONSTRUCTION_MODEL, {"attn_only": True})


@pytest.fixture(scope="module")
def theorem3():
    """The attention construction: three subject heads, one relation head (H = 4)."""
    return build_bridge(ATTN_ONLY.checkpoint_section(TASK), build("attention", TASK, ATTN_ONLY))


def group_of(token: int) -> tuple[int, int]:
    """(head, slot) of the construction head that reads `token`."""
    return next((h, g.index(token)) for h, g in enumerate(head_groups(TASK, CONSTRUCTION_MODEL.n_heads))
                if token in g)


def relation_head() -> int:
    return group_of(TASK.relation_token(0))[0]


def test_eos_mass_is_the_query_s_attention_to_itself(theorem3):
    """The relation head gives EOS nothing (its relation is in every prompt); a subject
    head whose subject is absent attends uniformly, EOS included."""
    scores = denoising_scores(theorem3, TASK, contexts=8).set_index("head")
    T = TASK.seq_len
    assert scores.loc[relation_head(), "eos_mass"] < 0.01
    subject_heads = scores.drop(index=relation_head())
    uniform_when_absent = (1 - subject_heads["subject_mass"]) / (T - 1)
    assert subject_heads["eos_mass"].to_numpy() == pytest.approx(uniform_when_absent.to_numpy(), abs=0.005)


def test_the_top_head_by_denoising_score_is_the_relation_head(theorem3):
    """Subject heads score about 0.3 on the subject and below 0 on the relation; the
    relation head about 1 on the relation and below 0 on the subject: a head's score is its
    better one, so the relation head comes first and every subject head scores above 0.2."""
    scores = denoising_scores(theorem3, TASK, contexts=8).sort_values("denoising_score", ascending=False)
    assert scores["head"].iloc[0] == relation_head() and scores["denoising_score"].iloc[0] > 0.99
    assert (scores["denoising_score"].iloc[1:] > 0.2).all()


def test_per_head_ablation_removes_that_head_s_subjects_only(theorem3):
    """Zero-ablating subject head h makes a* tie with the rest of A_r (right about 1/D of
    the time) for the facts whose subject h reads; mean-ablating it (its mean write favours
    its subjects' answers) loses some of them; every other fact keeps accuracy 1."""
    facts = ablations(theorem3, TASK, contexts=4).reset_index()  # frames are indexed by the fact
    groups = head_groups(TASK, CONSTRUCTION_MODEL.n_heads)
    for h in range(CONSTRUCTION_MODEL.n_heads):
        if h == relation_head():
            continue
        own = facts["subject"].isin(groups[h])
        for kind, most in (("zero", 0.5), ("mean", 0.9)):
            accuracy = facts[f"{kind}_ablate_head{h}_accuracy"]
            assert accuracy[~own].min() == 1.0 and accuracy[own].mean() < most, (kind, h)


def test_the_ov_probe_reads_the_relation_s_write():
    """The Theorem 4 model (no answer written by OV), plus each relation's OV row writing one
    answer a_r of A_r: the OV probe ranks a* first exactly for the facts whose a* is a_r,
    and only through the relation head."""
    weights = build("mlp", TASK, CONSTRUCTION_MODEL)
    writer = torch.linalg.pinv(weights["unembed.W_U"])  # [O, d]
    picked = TASK.facts[0]  # [R] a_r: subject 0's answers
    for r in range(TASK.n_relations):
        h, slot = group_of(TASK.relation_token(r))
        weights[ATTN + "W_O"][h, slot] += 10.0 * writer[picked[r]]
    probes = recall_probes(build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), weights), TASK,
                           contexts=4).reset_index()  # frames are indexed by the fact
    expected = (probes["answer"] == picked[probes["relation"]].numpy()).astype(float)
    assert expected.sum() >= TASK.n_relations
    assert (probes["ov_probe"] == expected).all()
    assert (probes[f"ov_probe_head{relation_head()}"] == expected).all()


def test_the_attention_path_keeps_the_mlp_s_mean_write():
    """Attention keeps every fact; the MLP writes a constant -K onto one answer that the
    unembedding bias lifts by +K: the attention path must keep that mean write
    (mean-ablation), or the lifted answer wins."""
    plan = [["attention"] * TASK.n_relations for _ in range(TASK.n_subjects)]
    weights = build_storage(TASK, CONSTRUCTION_MODEL, plan)
    decoy, K = 3, 100.0
    weights[MLP + "b_out"] = -K * torch.linalg.pinv(weights["unembed.W_U"])[decoy]
    weights["unembed.b_U"][decoy] = K
    facts = locate(build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), weights), TASK, **SMALL).facts
    assert facts["accuracy"].min() == 1.0
    assert facts["attention_path_accuracy"].min() == 1.0
    assert (facts["label"] == "attention").all()
