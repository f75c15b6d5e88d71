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


def test_below_n_dimensions_the_bigram_memory_writes_the_least_squares_centred_log_pi_b():
    """At d = 48 < N the unembedding spans no constant direction: the MLP's write for e_k, unembedded, is
    the least-squares fit of log pi_b(.|k) centred over the vocabulary, within W_U's span."""
    section = InductionModelConfig(d_model=48, d_mlp=80).section(TASK)
    w = bigram_mlp(section, init_weights(section, 0), TASK)
    E, W_U, m = w["embed.W_E"], w["unembed.W_U"], "blocks.1.mlp."
    written = torch.relu(E @ w[m + "W_in"] + w[m + "b_in"]) @ w[m + "W_out"] @ W_U  # [N, N]
    log_pi = TASK.conditionals.clamp_min(1e-6).log()
    centred = log_pi - log_pi.mean(-1, keepdim=True)  # [N, N]
    fit = torch.linalg.lstsq(W_U.T.double(), centred.T.double()).solution.T.float() @ W_U  # [N, N]
    assert torch.allclose(written, fit, atol=2e-3), (written - fit).abs().max()


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


def test_the_early_positions_probe_reads_the_first_64_positions_only():
    """wk0_64 (the authors' test_wk0(cutoff=64)): a previous-token memory of positions 1..63 alone gives it
    1 and wk0 (every position) far less; one of the positions from 64 on gives it about 0."""
    task = InductionTaskConfig(n_triggers=3, seq_len=96).build()
    section = InductionModelConfig(d_model=64).section(task)
    w = init_weights(section, 0)
    P = w["pos_embed.W_pos"]  # [T, d]
    unit = P / P.pow(2).sum(-1, keepdim=True)

    def previous_token(first, last):  # keys t-1 for queries t in first..last-1, as the construction's
        return (80.0 * unit[first - 1:last - 1].T @ unit[first:last])[None]
    for span, early, every in (((1, 64), 1.0, (0.55, 0.8)), ((64, 96), (0.0, 0.1), (0.25, 0.45))):
        found = dict(zip(*memory_recall(build_bridge(section, {**w, TARGETS[0]: previous_token(*span)}, "cpu", task),
                                        task)[["probe", "value"]].T.values))
        assert (found["wk0_64"] == early if early == 1.0 else early[0] <= found["wk0_64"] <= early[1]), (span, found)
        assert every[0] <= found["wk0"] <= every[1], (span, found)
    assert "wk0_64" not in set(memory_recall(bridge(INITIAL), TASK).probe)  # T = 32: no early positions to single out


def test_the_construction_stores_each_association_at_its_strength():
    """W_KQ^2 of the construction: a trigger's query scores its remapped key about `strength` (10 by default)
    after the 1/sqrt(d) scale, and its own embedding 0 (the remapped keys are taken orthogonal to the
    triggers' embeddings); induction_construction passes its strength on."""
    E = INITIAL["embed.W_E"][TASK.fixed_triggers]  # [K, d]
    remapped = E @ INITIAL["blocks.0.attn.W_V"][0] @ INITIAL["blocks.0.attn.W_O"][0]  # e~_k
    for strength, w_k in ((10.0, memory_targets(SECTION, INITIAL, TASK)["blocks.1.attn.W_K"][0]),
                          (4.0, induction_construction(SECTION, INITIAL, TASK, 4.0)["blocks.1.attn.W_K"][0])):
        scores = remapped @ w_k @ E.T / 128 ** 0.5  # [key k, query j]
        assert scores.diagonal() == pytest.approx(torch.full((3,), strength), rel=0.05)
        assert (E @ w_k @ E.T).abs().max() < 1e-3 * strength  # a trigger's own earlier occurrence: nothing
    assert torch.equal(induction_construction(SECTION, INITIAL, TASK)["blocks.1.attn.W_K"],
                       memory_targets(SECTION, INITIAL, TASK, 10.0)["blocks.1.attn.W_K"])


def test_the_construction_serves_random_triggers_and_as_many_triggers_as_dimensions():
    """With random triggers every token is a key (wk1 over all 65 tokens); with K = d fixed triggers nothing
    is left once the keys are made orthogonal to the queries, so they are kept as they are."""
    task = InductionTaskConfig(n_triggers=3, seq_len=32, triggers="random").build()
    model = build_bridge(SECTION, induction_construction(SECTION, INITIAL, task), "cpu", task)
    assert dict(zip(*memory_recall(model, task)[["probe", "value"]].T.values))["wk1"] == 1.0
    square = InductionTaskConfig(n_triggers=16, seq_len=16).build()
    section = InductionModelConfig(d_model=16).section(square)
    w = init_weights(section, 0)
    model = build_bridge(section, induction_construction(section, w, square), "cpu", square)
    assert dict(zip(*memory_recall(model, square)[["probe", "value"]].T.values))["wk1"] > 0.5


def test_the_constructions_refuse_models_they_cannot_build():
    generic = InductionModelConfig("generic", 2, 128, 1, 128).section(TASK)
    with pytest.raises(ValueError, match=r"^the construction is the simplified model's \(W_Q = I, one head per "
                                         r"layer\)\.$"):
        memory_targets(generic, init_weights(generic, 0), TASK)
    narrow = InductionModelConfig(d_model=128, d_mlp=64).section(TASK)
    with pytest.raises(ValueError, match=r"^the bigram memory needs a final MLP of width >= N = 65, got 64\.$"):
        bigram_mlp(narrow, init_weights(narrow, 0), TASK)
    attention_only = InductionModelConfig(d_model=128).section(TASK)
    with pytest.raises(ValueError, match="needs a final MLP"):
        bigram_mlp(attention_only, init_weights(attention_only, 0), TASK)
    exact = InductionModelConfig(d_model=128, d_mlp=65).section(TASK)
    w = bigram_mlp(exact, init_weights(exact, 0), TASK)  # m = N: one unit per token
    assert torch.equal(w["blocks.1.mlp.b_in"], torch.full((65,), -2.0))  # -strength / 2, strength 4 by default


def test_the_output_probe_reads_the_training_outputs_of_a_task_that_holds_outputs_out():
    """With held-out outputs (the last quarter of the vocabulary is never an output in training), wo1 is the
    recall over the training outputs: a W_OV^2 storing exactly those reads 1 (over every token it would read
    48/65 = 0.74, under the 0.9 "learned" mark), one storing only the held-out quarter about 0."""
    split = InductionTaskConfig(n_triggers=3, seq_len=32, held_out_outputs=True).build()
    assert split.n_train_outputs == 48 and split.n_tokens == 65
    E, U = INITIAL["embed.W_E"], INITIAL["unembed.W_U"].T  # [N, d], [N, d]

    def unit(rows):  # a / |a|^2, as the construction's
        return rows / rows.pow(2).sum(-1, keepdim=True)

    def copying(tokens):  # W_O^2 with W_V^2 W_O^2 = sum_k u_k e_k^T over `tokens` only
        copy = 10.0 * unit(E[tokens]).T @ unit(U[tokens])  # [d, d]
        return {**INITIAL, "blocks.1.attn.W_O": torch.linalg.solve(INITIAL["blocks.1.attn.W_V"][0], copy)[None]}

    def wo1(w):
        table = memory_recall(build_bridge(SECTION, w, "cpu", split), split)
        return table.set_index("probe").value["wo1"]
    assert wo1(copying(slice(0, 48))) == 1.0
    assert wo1(copying(slice(48, 65))) < 0.1
