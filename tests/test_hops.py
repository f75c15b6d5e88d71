"""Where each hop of two-hop recall lives (probe/hops.py, analyses/hops.py): the prompts put each
role where they say, the path split adds up to the logits on two-hop prompts, causal tracing names
the roles right, a composition reuses a one-hop store only when a store keeps both, and the
command refuses a one-hop checkpoint in one line."""
from dataclasses import replace

import pandas as pd
import pytest
import torch

from models import build_bridge
from models.recall.config import ModelConfig
from models.section import shapes
from probe import columns
from probe.causal_tracing import role_order
from probe.hops import (
    REUSES,
    ROLES,
    composition_prompts,
    located,
    one_hop_prompts,
    resample,
    reuse,
    roles,
    trace_compositions,
)
from probe.paths import path_logits
from tasks import TwoHopTask
from tests.conftest import run_main

TASK = TwoHopTask(6, 3, 6, 8, fact_seed=1)
S, R, T = TASK.n_subjects, TASK.n_relations, TASK.seq_len
FLOAT = 1e-5  # probabilities and logits of float32 runs agree to this


def random_model(seed: int = 0):
    """Two blocks of random weights whose P(answer) moves smoothly with the embeddings."""
    section = replace(ModelConfig(), n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32).checkpoint_section(TASK)
    generator = torch.Generator().manual_seed(seed)
    weights = {k: 0.3 * torch.randn(shape, generator=generator) for k, shape in shapes(section).items()}
    weights["unembed.W_U"] *= 0.1
    return build_bridge(section, weights)


def test_a_two_hop_prompt_holds_s_r1_and_r2_where_its_positions_say_and_noise_elsewhere():
    triples = torch.tensor([0, 5, 17, 40, 53])  # s R^2 + r1 R + r2
    batch, index = composition_prompts(TASK, triples, contexts=3, seed=2)
    s, r1, r2, bridge, answer = TASK.composition(triples)
    assert list(index) == list(zip(s.tolist(), r1.tolist(), r2.tolist(), answer.tolist()))
    assert torch.equal(batch.answers, answer.repeat_interleave(3)) and torch.equal(batch.bridges,
                                                                                   bridge.repeat_interleave(3))
    rows = torch.arange(len(batch))
    tokens, at = batch.tokens, batch.positions
    assert torch.equal(tokens[rows, at[:, 0]], s.repeat_interleave(3))
    assert torch.equal(tokens[rows, at[:, 1]], TASK.relation_token(r1, 1).repeat_interleave(3))
    assert torch.equal(tokens[rows, at[:, 2]], TASK.relation_token(r2, 2).repeat_interleave(3))
    labels = [[TASK.token_label(int(t)) for t in row] for row in tokens]
    for i, row in enumerate(labels):
        others = [label for p, label in enumerate(row[:-1]) if p not in at[i].tolist()]
        assert row[-1] == "EOS" and all(label.startswith("n") for label in others)
    assert len({tuple(p) for p in at.tolist()}) > 1  # the positions are drawn, not fixed
    assert list(index.names) == ["subject", "r1", "r2", "answer"]
    many, _ = composition_prompts(TASK, torch.arange(S * R * R), contexts=4, seed=0)
    assert set(many.positions.flatten().tolist()) == set(range(T - 1))  # any position before the last
    noise = many.tokens[:, :-1][many.tokens[:, :-1] >= S + 2 * R]
    assert set(noise.tolist()) == set(range(S + 2 * R, S + 2 * R + TASK.n_noise))  # every noise token


def test_the_roles_run_subject_r1_r2_the_noise_then_last():
    batch, _ = composition_prompts(TASK, torch.arange(4), contexts=2, seed=0)
    order = role_order(batch, T, roles(batch))
    for i in range(len(batch)):
        s, a, b = batch.positions[i].tolist()
        assert order[i].tolist() == [s, a, b, *[p for p in range(T - 1) if p not in (s, a, b)], T - 1]


def test_a_prompt_without_noise_is_traced_at_its_three_roles_and_the_last():
    """seq_len 4: s, r1, r2 and EOS fill the prompt; tracing still reads the last position."""
    task = TwoHopTask(6, 3, 6, 4, fact_seed=1)
    section = replace(ModelConfig(), n_layers=2, d_model=8, n_heads=1, d_head=8, d_mlp=8).checkpoint_section(task)
    weights = {k: 0.3 * torch.randn(shape, generator=torch.Generator().manual_seed(0))
               for k, shape in shapes(section).items()}
    effects = trace_compositions(build_bridge(section, weights), task, torch.tensor([7]), torch.Generator(),
                                 contexts=1, draws=1)
    assert list(dict.fromkeys(effects["position"])) == [*ROLES, "last"]


def test_every_one_hop_fact_is_asked_with_either_of_its_relation_s_tokens():
    batch, index = one_hop_prompts(TASK, contexts=2, seed=0)
    assert list(index.names) == ["subject", "relation", "token_set", "answer"]
    assert sorted(index.droplevel("answer")) == [(s, r, k) for s in range(S) for r in range(R) for k in (1, 2)]
    rows = torch.arange(len(batch))
    for i, (s, r, token_set, answer) in enumerate(index):
        for j in (2 * i, 2 * i + 1):
            assert int(batch.tokens[j, batch.positions[j, 0]]) == s
            assert int(batch.tokens[j, batch.positions[j, 1]]) == TASK.relation_token(r, token_set)
            assert int(batch.answers[j]) == answer == int(TASK.facts[s, r]) and int(batch.hops[j]) == 1
    relation_tokens = (batch.tokens >= S) & (batch.tokens < S + 2 * R)
    assert (relation_tokens.sum(-1) == 1).all() and torch.equal(batch.tokens[rows, batch.positions[:, 2]] >= S + 2 * R,
                                                                torch.ones(len(batch), dtype=torch.bool))


def test_the_paths_add_up_to_the_model_s_logits_on_two_hop_prompts():
    model = random_model()
    batch, _ = composition_prompts(TASK, torch.arange(S * R * R), contexts=2, seed=0)
    from tasks.batch import Batch

    writes = path_logits(model, Batch(batch.tokens, batch.subjects, batch.relations[:, 0], batch.answers,
                                      batch.positions[:, 0], batch.positions[:, 1]))
    with torch.inference_mode():
        logits = model(batch.tokens)[:, -1]  # [n, S]
    assert (writes.logits - logits).abs().max() < FLOAT
    assert (writes.direct + sum(writes.stores.values()) - logits).abs().max() < FLOAT
    assert sorted(store.name for store in writes.stores) == sorted(
        ["attention0", "attention0_via_attention1", "mlp0", "mlp0_via_attention1", "attention1", "mlp1"])


def test_the_rule_reads_one_block_of_every_entity_and_the_accuracy_of_each_composition():
    model = random_model()
    batch, index = composition_prompts(TASK, torch.arange(S * R * R), contexts=4, seed=0)
    facts, stores = located(model, TASK, batch, index, 4)
    with torch.inference_mode():
        hits = (model(batch.tokens)[:, -1].argmax(-1) == batch.answers).float().view(-1, 4).mean(1)
    assert torch.allclose(torch.tensor(facts[columns.ACCURACY].to_numpy(), dtype=torch.float), hits)
    assert len(facts) == S * R * R and {columns.LABEL, columns.STORE_LIST} <= set(facts.columns)
    top = facts[columns.top("mlp1")]  # a share of contexts in which mlp1's write ranks the answer first of all S
    assert top.between(0, 1).all() and top.max() > 0


def one_hop_frame(stores: dict) -> pd.DataFrame:
    index = pd.MultiIndex.from_tuples([(s, r, k, int(TASK.facts[s, r])) for s in range(S) for r in range(R)
                                       for k in (1, 2)], names=["subject", "relation", "token_set", "answer"])
    return pd.DataFrame({columns.STORE_LIST: [stores.get((s, r, k), "mlp1") for s, r, k, _ in index]}, index=index)


def test_a_composition_reuses_the_store_of_the_one_hop_fact_b_r2_by_r2_s_second_set_token():
    s, r1, r2 = 2, 1, 0
    b = int(TASK.facts[s, r1])
    triple = s * R * R + r1 * R + r2
    index = pd.MultiIndex.from_tuples([(s, r1, r2, int(TASK.facts[b, r2]))], names=["subject", "r1", "r2", "answer"])
    two = pd.DataFrame({columns.STORE_LIST: ["mlp0_via_attention1;mlp1"]}, index=index)
    found = reuse(TASK, one_hop_frame({(b, r2, 2): "mlp1"}), two)
    assert found[REUSES].tolist() == [True] and found["bridge"].tolist() == [b]
    assert found["held_out"].tolist() == [triple in TASK.held_out.tolist()]
    # the first-set token's store is not the one a two-hop prompt's r2 token reads
    assert reuse(TASK, one_hop_frame({(b, r2, 2): "mlp0", (b, r2, 1): "mlp1"}), two)[REUSES].tolist() == [False]
    assert found["shortcut"].tolist() == [""]  # r2(b) = 0: neither r2(s) = 5 nor b = 5
    nothing = two.assign(**{columns.STORE_LIST: [""]})
    assert reuse(TASK, one_hop_frame({(b, r2, 2): ""}), nothing)[REUSES].tolist() == [False]


def test_a_composition_whose_answer_is_also_r2_of_s_or_b_is_one_a_shortcut_answers():
    index = pd.MultiIndex.from_tuples([(0, 2, 0, 1), (0, 0, 1, 1), (0, 0, 0, 2)],
                                      names=["subject", "r1", "r2", "answer"])
    found = reuse(TASK, one_hop_frame({}), pd.DataFrame({columns.STORE_LIST: ["", "", ""]}, index=index))
    assert found["shortcut"].tolist() == ["first_hop_skipped", "bridge", ""]  # r2(s) = 1 = r2(b); b = 1 = r2(b)
    assert found["bridge"].tolist() == [0, 1, 1]


@pytest.mark.parametrize("corrupt", ROLES)
def test_resampling_swaps_the_role_s_token_for_another_of_its_kind_that_changes_the_answer(corrupt):
    batch, _ = composition_prompts(TASK, torch.arange(S * R * R), contexts=2, seed=0)
    tokens = resample(TASK, corrupt)(batch, torch.Generator().manual_seed(0))
    column = ROLES.index(corrupt)
    changed = tokens != batch.tokens
    rows = torch.arange(len(batch))
    assert changed.sum(-1).max() == 1  # one token at most, the role's own
    assert (changed.any(-1) == changed[rows, batch.positions[:, column]]).all()
    new = tokens[rows, batch.positions[:, column]]
    low = {"subject": 0, "r1": S, "r2": S + R}[corrupt]
    assert ((new >= low) & (new < low + (S if corrupt == "subject" else R))).all()
    s, r1, r2 = batch.subjects, batch.relations[:, 0], batch.relations[:, 1]
    s, r1, r2 = {"subject": (new, r1, r2), "r1": (s, new - S, r2), "r2": (s, r1, new - S - R)}[corrupt]
    moved = changed.any(-1)
    assert moved.float().mean() > 0.8  # a swap exists for most prompts; where one does the answer changes
    assert (TASK.facts[TASK.facts[s, r1], r2][moved] != batch.answers[moved]).all()


@pytest.mark.parametrize("corrupt, noise", [("subject", "gaussian"), ("r1", "gaussian"), ("r2", "gaussian"),
                                            ("r1", "resample")])
def test_restoring_the_corrupted_role_s_embedding_or_the_last_hidden_state_restores_the_clean_probability(
        corrupt, noise):
    effects = trace_compositions(random_model(), TASK, torch.tensor([3, 20, 41]), torch.Generator().manual_seed(0),
                                 contexts=1, corrupt=corrupt, noise=noise, draws=1)
    assert set(effects["position"]) == {*ROLES, "noise", "last"}
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert lost.abs().max() > 1e-3  # the corruption moves the answer's probability

    def at(component, layer, position):
        rows = effects[(effects["component"] == component) & (effects["layer"] == layer)
                       & (effects["position"] == position)]
        return rows.set_index("fact")["indirect_effect"]
    assert (at("resid", 0, corrupt) - lost).abs().max() < FLOAT
    assert (at("resid", 2, "last") - lost).abs().max() < FLOAT
    for other in {*ROLES, "noise"} - {corrupt}:
        assert at("resid", 0, other).abs().max() < FLOAT  # a clean token restores nothing
    assert list(per_fact.index) == ["0:1:0", "2:0:2", "4:1:2"]


def test_the_command_refuses_a_one_hop_checkpoint_in_one_line(tiny_ckpt, tmp_path, capsys):
    from analyses.hops import main

    code, _, err = run_main(main, [tiny_ckpt, "--device", "cpu", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "not a two-hop task" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
    code, _, err = run_main(main, [tiny_ckpt, "--draws", "0"], capsys)
    assert code == 2 and err.count("\n") == 1 and "draws" in err


@pytest.mark.slow
def test_the_command_writes_each_hop_s_files_on_a_trained_two_hop_model(tmp_path, capsys):
    """A two-hop model trained a few steps: every one-hop fact and composition gets a row, tracing a
    row per set, role, noise, composition, layer, position and component; a rerun of the same
    settings is its own result, one of other settings into that folder is refused."""
    from analyses.hops import main
    from models.recall.config import RunConfig, TrainConfig, TwoHopTaskConfig
    from models.recall.trainer import train

    run = RunConfig(TwoHopTaskConfig(n_subjects=S, n_relations=R, n_noise=6, seq_len=T),
                    replace(ModelConfig(), n_layers=2),
                    TrainConfig(steps=4, eval_every=2, eval_size=32, batch_size=32, device="cpu", target_accuracy=2))
    ckpt = train(run, progress=False).save(tmp_path / "ckpt")
    argv = [ckpt, "--device", "cpu", "--contexts", "2", "--trace-compositions", "2", "--trace-contexts", "1",
            "--draws", "1", "--quiet", "--out", tmp_path / "out"]
    code, out, err = run_main(main, argv, capsys)
    assert code == 0, err
    folder = tmp_path / "out"
    assert len(pd.read_csv(folder / "one_hop_facts.csv")) == 2 * S * R
    compositions = pd.read_csv(folder / "compositions.csv")
    assert len(compositions) == S * R * R and compositions["held_out"].sum() == round(0.2 * S * R * R)
    tracing = pd.read_csv(folder / "tracing.csv")
    points = 3 + 2 + 2 + 3 + 3  # resid 0..2, mlp 1..2, attn 1..2, and the two severed hidden states
    assert len(tracing) == 2 * len(ROLES) * 2 * 2 * points * 5  # sets, roles, noises, compositions, positions
    assert (folder / "hops.png").is_file() and "reusing the one-hop store" in out
    assert run_main(main, argv, capsys)[0] == 0
    code, _, err = run_main(main, [*argv[:-2], "--draws", "2", "--out", folder], capsys)
    assert code == 2 and err.count("\n") == 1 and "other hops results" in err


def test_the_summary_counts_each_set_and_outcome_s_stores_and_reuse():
    from analyses.hops_summary import one_hop_numbers, store_counts, two_hop_numbers

    index = pd.MultiIndex.from_tuples([(0, 0, 0, 1), (0, 0, 1, 2), (0, 1, 0, 3), (1, 0, 0, 4), (1, 1, 1, 5)],
                                      names=["subject", "r1", "r2", "answer"])
    two = pd.DataFrame({columns.STORE_LIST: ["mlp1", "mlp0;mlp1", "", "mlp0_via_attention1", ""],
                        columns.LABEL: ["mlp", "mlp", "distributed", "mlp", "not_stored"],
                        columns.ACCURACY: [1.0, 0.75, 0.5, 1.0, 0.25], "held_out": [False, False, False, True, True],
                        "right": [True, True, True, True, False], REUSES: [True, False, False, True, False],
                        "shortcut": ["", "", "", "bridge", ""]}, index=index)
    assert store_counts(two) == {"mlp1": 2, "mlp0": 1, "mlp0_via_attention1": 1}
    found = two_hop_numbers(two)
    assert sorted(found) == ["held_out/right", "held_out/wrong", "trained/right"]
    trained = found["trained/right"]
    assert (trained["compositions"], trained["with_a_store"], trained["reusing"]) == (3, 2, 1)
    assert trained["reuse_share"] == 0.5 and trained["accuracy"] == 0.75
    assert (trained["without_shortcut"], trained["with_a_store_without_shortcut"],
            trained["reusing_without_shortcut"]) == (3, 2, 1)
    assert found["held_out/right"]["without_shortcut"] == 0 and found["held_out/right"]["stores"] == {
        "mlp0_via_attention1": 1}
    assert trained["labels"] == {"mlp": 2, "distributed": 1}
    assert found["held_out/wrong"]["reuse_share"] is None and found["held_out/right"]["reuse_share"] == 1.0
    one = pd.DataFrame({columns.STORE_LIST: ["mlp1", "mlp1;mlp0", "attention1"],
                        columns.LABEL: ["mlp", "mlp", "attention"], columns.ACCURACY: [1.0, 1.0, 0.5]},
                       index=pd.MultiIndex.from_tuples([(0, 0, 1, 2), (0, 0, 2, 2), (1, 0, 2, 3)], names=[
                           "subject", "relation", "token_set", "answer"]))
    numbers = one_hop_numbers(one)
    assert numbers["facts"] == 3 and numbers["stores"] == {"mlp1": 2, "mlp0": 1, "attention1": 1}
    assert numbers["accuracy"] == pytest.approx(2.5 / 3) and numbers["labels"] == {"mlp": 2, "attention": 1}
    assert numbers["token_set_1"]["stores"] == {"mlp1": 1} and numbers["token_set_2"]["labels"] == {"mlp": 1,
                                                                                                 "attention": 1}


def test_the_tracing_summary_finds_the_largest_effect_overall_at_the_corrupted_token_and_at_the_last():
    from analyses.hops_summary import tracing_numbers

    rows = []
    for fact, scale in (("0:0:0", 1.0), ("0:1:2", 0.5)):
        for component, layer, position, effect in (("mlp", 1, "subject", 0.3), ("mlp", 2, "last", 0.6),
                                                   ("attn", 2, "last", 0.1), ("attn", 1, "r1", 0.8),
                                                   ("resid", 0, "subject", 0.9)):
            rows.append({"set": "trained", "corrupt": "subject", "noise": "gaussian", "fact": fact, "layer": layer,
                         "position": position, "component": component, "indirect_effect": effect * scale,
                         "clean_probability": 0.9 * scale, "corrupted_probability": 0.1})
    two = pd.DataFrame({"right": [True, True]}, index=pd.MultiIndex.from_tuples(
        [(0, 0, 0, 3), (0, 1, 2, 4)], names=["subject", "r1", "r2", "answer"]))
    found = tracing_numbers(pd.DataFrame(rows), two)["trained/right/subject/gaussian"]
    assert found["compositions"] == 2 and abs(found["clean_probability"] - 0.675) < 1e-9
    assert found["corrupted_probability"] == pytest.approx(0.1)
    # the hidden state (resid) is no output: its 0.9 is not the peak
    assert found["peak"] == {"component": "attn", "layer": 1, "position": "r1", "effect": pytest.approx(0.6)}
    assert found["at_last"] == {"component": "mlp", "layer": 2, "position": "last", "effect": pytest.approx(0.45)}
    split = tracing_numbers(pd.DataFrame(rows), two.assign(right=[True, False]))
    assert sorted(split) == ["trained/right/subject/gaussian", "trained/wrong/subject/gaussian"]
    assert split["trained/wrong/subject/gaussian"]["clean_probability"] == pytest.approx(0.45)
    assert found["at_corrupted_token"] == {"component": "mlp", "layer": 1, "position": "subject",
                                         "effect": pytest.approx(0.225)}
    assert found["peaks"] == {"attention 1 r1": 2}
    assert tracing_numbers(pd.DataFrame(rows).iloc[:0], two) == {}
    from analyses.hops_summary import summarise, two_hop_numbers

    one = pd.DataFrame({columns.STORE_LIST: ["mlp1"], columns.LABEL: ["mlp"], columns.ACCURACY: [1.0]},
                       index=pd.MultiIndex.from_tuples([(0, 0, 1, 2)], names=["subject", "relation", "token_set",
                                                                              "answer"]))
    compositions = two.assign(**{columns.STORE_LIST: ["mlp1", ""], columns.LABEL: ["mlp", "distributed"],
                                 columns.ACCURACY: [1.0, 0.5], "held_out": [False, True], REUSES: [True, False],
                                 "shortcut": ["", ""]})
    numbers = summarise(one, compositions, pd.DataFrame(rows))
    assert numbers["one_hop"]["stores"] == {"mlp1": 1} and numbers["two_hop"] == two_hop_numbers(compositions)
    assert numbers["tracing"]["trained/right/subject/gaussian"] == found


def test_the_noise_of_each_role_is_read_from_its_own_kind_s_embeddings():
    from probe.hops import role_tokens

    assert role_tokens(TASK, "subject") == list(range(S))
    assert role_tokens(TASK, "r1") == [S, S + 1, S + 2] and role_tokens(TASK, "r2") == [S + R, S + R + 1, S + R + 2]


def test_the_prompts_and_the_swaps_are_fixed_by_their_seed_and_generator_alone():
    torch.manual_seed(1)
    first, _ = composition_prompts(TASK, torch.arange(8), contexts=2, seed=4)
    one, _ = one_hop_prompts(TASK, contexts=2, seed=4)
    swapped = resample(TASK, "subject")(first, torch.Generator().manual_seed(2))
    torch.manual_seed(2)  # the global generator plays no part
    again, _ = composition_prompts(TASK, torch.arange(8), contexts=2, seed=4)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(one.tokens, one_hop_prompts(TASK, 2, 4)[0].tokens)
    assert torch.equal(swapped, resample(TASK, "subject")(again, torch.Generator().manual_seed(2)))
    assert not torch.equal(first.tokens, composition_prompts(TASK, torch.arange(8), contexts=2, seed=5)[0].tokens)
    assert (first.hops == 2).all() and torch.equal(first.subjects, torch.arange(8).repeat_interleave(2) // (R * R))
    assert (one.hops == 1).all() and torch.equal(one.subjects, torch.arange(S).repeat_interleave(2 * R * 2))
    assert (one.relations[:, 1] == -1).all() and (one.bridges == -1).all()


def test_tracing_runs_on_the_seed_s_prompts_and_reports_each_draw():
    model = random_model()
    triples = torch.tensor([3, 20])
    calls = []
    effects = trace_compositions(model, TASK, triples, torch.Generator().manual_seed(0), contexts=1, seed=7,
                                 draws=2, progress=lambda: calls.append(1))
    batch, _ = composition_prompts(TASK, triples, contexts=1, seed=7)
    with torch.inference_mode():
        clean = model(batch.tokens)[:, -1].softmax(-1).gather(-1, batch.answers[:, None])[:, 0]
    traced = effects.drop_duplicates("fact")["clean_probability"].to_numpy()
    assert abs(traced - clean.numpy()).max() < FLOAT and len(calls) == 2  # one chunk, two draws
    with pytest.raises(ValueError, match="corrupt must be one of subject, r1, r2"):
        trace_compositions(model, TASK, triples, torch.Generator(), corrupt="relation")


def test_a_composition_reuses_a_store_among_several_of_the_one_hop_fact_s():
    s, r1, r2 = 2, 1, 0
    b = int(TASK.facts[s, r1])
    index = pd.MultiIndex.from_tuples([(s, r1, r2, int(TASK.facts[b, r2]))], names=["subject", "r1", "r2", "answer"])
    found = reuse(TASK, one_hop_frame({(b, r2, 2): "mlp0;mlp1"}), pd.DataFrame({columns.STORE_LIST: ["mlp1"]},
                                                                                 index=index))
    assert found[REUSES].tolist() == [True] and found["one_hop_stores"].tolist() == ["mlp0;mlp1"]


def test_the_report_prints_each_hop_s_numbers():
    from analyses.hops_summary import report

    numbers = {"n_layers": 2, "seconds": 1.25,
               "one_hop": {"facts": 36, "accuracy": 0.5, "stores": {"mlp1": 30, "mlp0": 2}},
               "two_hop": {"trained/right": {"compositions": 40, "with_a_store": 30, "reuse_share": 0.75,
                                             "stores": {"mlp1": 30}},
                           "held_out/wrong": {"compositions": 14, "with_a_store": 0, "reuse_share": None,
                                              "stores": {}}},
               "tracing": {"trained/right/subject/gaussian": {"clean_probability": 0.9, "corrupted_probability": 0.125,
                                                              "peak": {"component": "mlp", "layer": 2,
                                                                       "position": "last", "effect": 0.5}},
                           "held_out/wrong/r1/resample": {"clean_probability": 0.0, "corrupted_probability": 0.0,
                                                          "peak": None}}}
    assert report(numbers, "ck", "out").splitlines() == [
        "ck: L = 2; one-hop facts 36, accuracy 0.500, stores mlp1 30, mlp0 2",
        "compositions trained/right: 40, with a store 30, reusing the one-hop store 0.75; stores mlp1 30",
        "compositions held_out/wrong: 14, with a store 0, reusing the one-hop store none; stores none",
        "tracing trained/right/subject/gaussian: P clean 0.900, corrupted 0.125; peak mlp 2 last 0.500",
        "tracing held_out/wrong/r1/resample: P clean 0.000, corrupted 0.000; peak none",
        "wrote out/ (one_hop_facts.csv, compositions.csv, tracing.csv, summary.json, hops.png) in 1.2 s"]


def test_the_figure_shows_the_hidden_state_s_mean_effect_per_layer_and_role_under_gaussian_noise():
    from analyses.hops_summary import figure

    rows = [{"set": name, "corrupt": corrupt, "noise": noise, "fact": fact, "layer": layer, "position": position,
             "component": component, "indirect_effect": value}
            for name in ("trained", "held_out") for corrupt in ROLES for noise in ("gaussian", "resample")
            for fact, scale in (("0:0:0", 1.0), ("0:1:1", 3.0)) for layer in (0, 1)
            for position in (*ROLES, "noise", "last") for component, value in (
                ("resid", scale * (layer + 1) * (position == corrupt) * (1 if noise == "gaussian" else 9)),
                ("mlp", 7.0))]
    fig = figure(pd.DataFrame(rows))
    axes = [ax for ax in fig.axes if ax.images]
    assert len(axes) == 2 * len(ROLES)
    for ax, (corrupt, name) in zip(axes, [(c, n) for c in ROLES for n in ("trained", "held_out")]):
        shown = ax.images[0].get_array()
        expected = [[2.0 * (layer + 1) * (p == corrupt) for p in (*ROLES, "noise", "last")] for layer in (0, 1)]
        assert shown.tolist() == expected and ax.get_title() == f"{corrupt} corrupted, {name.replace('_', '-')}"
        assert [t.get_text() for t in ax.get_xticklabels()] == [*ROLES, "noise", "last"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["layer 0", "layer 1"]


def test_held_out_is_each_composition_s_place_in_the_task_s_held_out_set():
    s, r1, r2, _, answer = TASK.composition(torch.arange(S * R * R))
    index = pd.MultiIndex.from_arrays([s.numpy(), r1.numpy(), r2.numpy(), answer.numpy()],
                                      names=["subject", "r1", "r2", "answer"])
    found = reuse(TASK, one_hop_frame({}), pd.DataFrame({columns.STORE_LIST: [""] * len(index)}, index=index))
    held = TASK.composition(TASK.held_out)
    expected = set(zip(held[0].tolist(), held[1].tolist(), held[2].tolist()))
    assert {key[:3] for key, flag in found["held_out"].items() if flag} == expected and len(expected) > 5


@pytest.mark.parametrize("corrupt, noise", [("subject", "gaussian"), ("r2", "gaussian"), ("r1", "resample")])
def test_one_draw_of_the_corruption_by_hand(corrupt, noise):
    """The corrupted probability is P(answer) with N(0, (3 sigma)^2) added to the role's embedding, sigma the
    std of its kind's W_E rows (every entity, or every relation token of its set), or with the resampled token."""
    model = random_model()
    with torch.no_grad():
        model.W_E[S + R:S + 2 * R] *= 4  # the second set's embeddings spread wider: a std of the wrong rows shows
    triples = torch.tensor([3, 20, 41])
    kwargs = {} if noise == "gaussian" else {"noise": noise}
    effects = trace_compositions(model, TASK, triples, torch.Generator().manual_seed(5), contexts=1, seed=2,
                                 corrupt=corrupt, draws=1, **kwargs)
    batch, _ = composition_prompts(TASK, triples, contexts=1, seed=2)
    column = ROLES.index(corrupt)
    if noise == "gaussian":
        rows = list(range(S)) if corrupt == "subject" else [S + R + r for r in range(R)]
        std = 3 * float(model.W_E.detach()[rows].std())
        draw = torch.randn(len(batch), model.cfg.d_model, generator=torch.Generator().manual_seed(5)) * std

        def add(x, hook):
            x = x.clone()
            x[torch.arange(len(batch)), batch.positions[:, column]] += draw
            return x
        hooks, tokens = [("hook_embed", add)], batch.tokens
    else:
        hooks, tokens = [], resample(TASK, corrupt)(batch, torch.Generator().manual_seed(5))
    with torch.inference_mode():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)[:, -1]
    expected = logits.softmax(-1).gather(-1, batch.answers[:, None])[:, 0]
    traced = effects.drop_duplicates("fact")["corrupted_probability"].to_numpy()
    assert abs(traced - expected.numpy()).max() < FLOAT
