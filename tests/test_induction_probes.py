"""The induction instruments on hand-built models whose memories are known (models.induction.
construction): each probe reads its own layer and position, so a probe that reads another layer, or
the position next to the right one, fails here."""
import pytest
import torch

from models.bridge import build_bridge
from models.induction.config import InductionModelConfig, InductionTaskConfig
from models.induction.construction import TARGETS, bigram_mlp, induction_construction, memory_targets
from models.induction.trainer import scores
from models.induction.weights import init_weights
from probe.induction import clean_batch, head_scores, in_context_scores, knowledge_location, memory_recall

TASK = InductionTaskConfig(n_triggers=3, seq_len=32).build()
SECTION = InductionModelConfig(d_model=128, d_mlp=128).section(TASK)
INITIAL = init_weights(SECTION, 0)


def bridge(w):
    return build_bridge(SECTION, w, "cpu", TASK)


@pytest.fixture(scope="module")
def built():
    """The induction head and the bigram MLP, both built by hand."""
    return bridge(bigram_mlp(SECTION, induction_construction(SECTION, INITIAL, TASK), TASK))


def recall(model) -> dict:
    table = memory_recall(model, TASK)
    return dict(zip(table.probe, table.value))


def test_each_recall_probe_reads_its_own_memory():
    """One memory built at a time: its probe alone reaches 1 (a probe of the wrong layer would not)."""
    assert {k: round(v, 2) for k, v in recall(bridge(INITIAL)).items() if k != "ff1"} == {
        "wk0": pytest.approx(0.0, abs=0.1), "wk1": pytest.approx(0.33, abs=0.34), "wo1": pytest.approx(0.0, abs=0.1)}
    targets = memory_targets(SECTION, INITIAL, TASK)
    for key, probe in zip(TARGETS, ("wk0", "wk1", "wo1")):
        found = recall(bridge({**INITIAL, key: targets[key]}))
        assert found[probe] == 1.0, (key, found)
        assert all(v < 0.5 for p, v in found.items() if p not in (probe, "ff1", "wk1")), (key, found)
    # W_Q is the identity in both layers: a second layer's random W_Q must not change layer 0's probe
    scrambled = INITIAL["blocks.0.attn.W_V"]  # any random [1, d, d]
    assert recall(bridge({**INITIAL, TARGETS[0]: targets[TARGETS[0]], "blocks.1.attn.W_Q": scrambled}))["wk0"] == 1.0


def test_the_mlp_probe_is_the_kl_to_the_global_bigrams(built):
    assert recall(built)["ff1"] < 0.01  # the MLP stores pi_b exactly
    assert recall(bridge(INITIAL))["ff1"] > 1.0  # a random MLP does not
    no_mlp = InductionModelConfig(d_model=128).section(TASK)
    assert "ff1" not in recall(build_bridge(no_mlp, init_weights(no_mlp, 0), "cpu", TASK))


def test_head_scores_find_the_previous_token_head_and_the_induction_head(built):
    table = head_scores(built, TASK).set_index("layer")
    assert table.loc[0, "previous_token"] > 0.9 and table.loc[1, "previous_token"] < 0.2
    assert table.loc[1, "induction"] > 0.3 > table.loc[0, "induction"] + 0.1
    at_init = head_scores(bridge(INITIAL), TASK).set_index("layer")
    assert (at_init.previous_token < 0.2).all() and (at_init.induction < 0.2).all()


def test_in_context_scores_split_the_positions_and_agree_with_the_trainer(built):
    batch = clean_batch(built, TASK, 64)
    table = in_context_scores(built, TASK, batch)
    assert table.n.sum() == 64 * 32 and list(table.index) == ["in_context", "first_output", "bigram"]
    assert table.loc["in_context", "accuracy"] > 0.3 > table.loc["first_output", "accuracy"] + 0.2
    fast = scores({k: v[None] for k, v in built_weights().items()}, SECTION, batch)
    assert table.loc["in_context", "accuracy"] == pytest.approx(fast["in_context_accuracy"].item(), abs=1e-6)
    assert table.loc["bigram", "loss"] == pytest.approx(fast["bigram_loss"].item(), rel=1e-5)


def built_weights():
    return bigram_mlp(SECTION, induction_construction(SECTION, INITIAL, TASK), TASK)


def test_knowledge_location_moves_predictions_between_the_mlp_and_the_head(built):
    table = knowledge_location(built, TASK, n=64)
    clean, no_mlp, no_head = (table.loc[v] for v in ("clean", "mlp_ablated", "head_1.0_ablated"))
    assert no_head.in_context_accuracy < 0.05 < clean.in_context_accuracy - 0.3  # the head holds the in-context
    assert no_mlp.bigram_kl > clean.bigram_kl + 1.0  # the MLP holds the global bigrams
    assert no_mlp.in_context > clean.in_context  # without it, in-context predictions win where they differ
    assert table.loc["mlp_rank_1"].bigram_kl > table.loc["mlp_rank_16"].bigram_kl  # truncation: in between
    assert no_head["global"] > clean["global"] + 0.1  # without the head, the MLP's global bigram answers (0.26 vs 0.07)


def test_truncation_is_the_models_best_rank_r_output_matrix(built):
    """The rank-r variant equals the model whose W_out is replaced by its top-r singular directions."""
    w = built_weights()
    U, S, Vh = torch.linalg.svd(w["blocks.1.mlp.W_out"], full_matrices=False)
    low = bridge({**w, "blocks.1.mlp.W_out": (U[:, :3] * S[:3]) @ Vh[:3]})
    batch = clean_batch(built, TASK, 32)
    truncated = knowledge_location(built, TASK, batch, ranks=(3,)).loc["mlp_rank_3"]
    reference = knowledge_location(low, TASK, batch, ranks=(3,)).loc["clean"]
    assert truncated.bigram_kl == pytest.approx(reference.bigram_kl, rel=1e-4)
    assert truncated.in_context_accuracy == pytest.approx(reference.in_context_accuracy, abs=1e-6)


def test_the_ood_rows_need_held_out_outputs(built):
    split = InductionTaskConfig(n_triggers=3, seq_len=32, held_out_outputs=True).build()
    table = in_context_scores(built, split, n=16)
    assert "ood_in_context" in table.index
    with pytest.raises(ValueError, match="held_out_outputs"):
        in_context_scores(built, TASK, n=16, ood=True)


def test_the_memory_probes_refuse_a_one_layer_model():
    one = InductionModelConfig("generic", 1, 16, 1, 0).section(TASK)
    with pytest.raises(ValueError, match="two-layer model"):
        memory_recall(build_bridge(one, init_weights(one, 0), "cpu", TASK), TASK)


def test_probe_imports_neither_models_nor_analyses():
    import ast
    from pathlib import Path

    tree = ast.parse(Path("probe/induction.py").read_text())
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
            [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n and n.split(".")[0] in ("models", "analyses")]
    assert torch  # (torch is what it reads with)
