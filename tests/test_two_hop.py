"""Two-hop recall (tasks/two_hop.py, --hops 2 of models.train) and the bridge probe (probe/bridge.py):
the prompts' answers, the held-out compositions, the refusals, one hop unchanged, and the probe
on residuals that hold the bridge by construction."""
import json
from dataclasses import replace

import pandas as pd
import pytest
import torch

from models.recall.config import (
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    TwoHopTaskConfig,
    run_record,
    with_hops,
)
from models.recall.trainer import train
from models.recall.training_data import TrainingData
from probe.bridge import (
    bridge_readout,
    lens_ranks,
    probe_accuracy,
    readout_table,
    resolution_by_outcome,
    shortcuts,
    split,
)
from tasks import TASKS, TwoHopTask, task_from_config
from tests.conftest import run_main

S, R, N, T = 8, 3, 8, 8


def decode(task: TwoHopTask, tokens: torch.Tensor):
    """(entities, first-set relations, second-set relations) found in each prompt [B, T]: lists of ids."""
    S, R = task.n_subjects, task.n_relations
    return ([row[row < S].tolist() for row in tokens],
            [(row[(row >= S) & (row < S + R)] - S).tolist() for row in tokens],
            [(row[(row >= S + R) & (row < S + 2 * R)] - S - R).tolist() for row in tokens])


def test_a_two_hop_prompt_asks_for_r2_of_r1_of_s():
    """Every prompt holds one entity and EOS last; a two-hop prompt one relation of each set
    (r1 first set, r2 second), its answer r2(r1(s)) through the bridge r1(s); a one-hop prompt one
    relation token of either set, its answer r(s); noise everywhere else."""
    task = TwoHopTask(S, R, N, T)
    batch = task.sample_counter(600, torch.tensor([3]), 7)
    tokens, hops = batch.tokens[0], batch.hops[0]
    entities, first, second = decode(task, tokens)
    facts = task.facts
    seen_second_alone = 0
    for i in range(600):
        assert tokens[i, -1] == task.eos and len(entities[i]) == 1
        s = entities[i][0]
        if hops[i] == 2:
            assert len(first[i]) == 1 and len(second[i]) == 1
            bridge = facts[s, first[i][0]]
            assert batch.bridges[0, i] == bridge and batch.answers[0, i] == facts[bridge, second[i][0]]
        else:
            assert len(first[i]) + len(second[i]) == 1 and batch.bridges[0, i] == -1
            assert batch.answers[0, i] == facts[s, (first[i] + second[i])[0]]
            seen_second_alone += len(second[i])
        noise = (tokens[i, :-1] >= task.n_subjects + 2 * task.n_relations).sum()
        assert noise == T - 1 - (1 + hops[i])
    assert 0 < seen_second_alone < (hops == 1).sum()  # one-hop prompts use both sets
    assert task.d_vocab == S + 2 * R + N + 1 and task.d_vocab_out == S


@pytest.mark.parametrize("share", [0.5, 0.25])
def test_the_one_hop_share_is_drawn(share):
    n = 40000
    task = TwoHopTask(S, R, N, T, one_hop_share=share)
    drawn = (task.sample_counter(n, torch.tensor([0]), 0).hops == 1).float().mean().item()
    assert abs(drawn - share) < 5 * (share * (1 - share) / n) ** 0.5


@pytest.mark.parametrize("sampler", ["counter", "generator"])
def test_held_out_compositions_are_never_trained_while_their_one_hop_facts_are(sampler):
    """Over the training batches: no held-out (s, r1, r2) as a two-hop prompt; every trained one
    appears; the one-hop facts of every held-out composition, (s, r1) and (r1(s), r2), appear
    as one-hop prompts (r1 by its first-set token, r2 by its second-set token)."""
    task = TwoHopTask(S, R, N, T, held_out_fraction=0.25)
    assert len(task.held_out) == round(0.25 * S * R * R) and len(task.trained) == S * R * R - len(task.held_out)
    data = TrainingData(task, [(1e-2, 0)], 512, torch.device("cpu"), sampler)
    twos, ones = set(), set()
    for step in range(20):
        tokens, answers = data.batch(step)
        entities, first, second = decode(task, tokens[0])
        for e, f, g in zip(entities, first, second):
            if f and g:
                twos.add((e[0], f[0], g[0]))
            else:
                ones.add((e[0], *(("first", f[0]) if f else ("second", g[0]))))
    held = {tuple(t) for t in task.to_config()["held_out"]}
    assert len(held) == len(task.held_out) and not twos & held
    assert len(twos) == len(task.trained)
    for s, r1, r2 in held:
        assert (s, "first", r1) in ones and (int(task.facts[s, r1]), "second", r2) in ones


def test_the_held_out_prompts_are_the_held_out_compositions():
    task = TwoHopTask(S, R, N, T)
    held = {tuple(t) for t in task.to_config()["held_out"]}
    sets = task.eval_sets(300)
    assert set(sets) == {"one_hop", "two_hop", "held_out"}
    for name, batch in sets.items():
        triples = {(int(s), int(a), int(b)) for s, (a, b) in zip(batch.subjects, batch.relations)}
        assert (batch.hops == (1 if name == "one_hop" else 2)).all()
        if name != "one_hop":
            assert (triples <= held) == (name == "held_out") and not (triples & held and name == "two_hop")
    assert "held_out" not in TwoHopTask(S, R, N, T, held_out_fraction=0).eval_sets(8)


def test_the_config_records_hops_and_the_held_out_set():
    task = TwoHopTask(S, R, N, T, fact_seed=5)
    config = json.loads(json.dumps(task.to_config()))
    assert config["kind"] == "two_hop" and config["hops"] == 2 and TASKS["two_hop"] is TwoHopTask
    again = task_from_config(config)
    assert torch.equal(again.facts, task.facts) and torch.equal(again.held_out, task.held_out)
    assert torch.equal(again.sample_counter(64, torch.tensor([1]), 2).tokens,
                       task.sample_counter(64, torch.tensor([1]), 2).tokens)
    with pytest.raises(ValueError, match="hops 2"):
        TwoHopTask.from_config({**config, "hops": 3})


@pytest.mark.parametrize("argv, said", [
    (["--hops", "3"], "hops must be 1 or 2, got 3"),
    (["--hops", "2"], "two-hop prompts need --n-layers 2 or more"),
    (["--hops", "2", "--n-layers", "2", "--held-out-compositions", "1"],
     "held_out_fraction must be a number in [0, 1)"),
    (["--held-out-compositions", "0.1"], "--held-out-compositions is an option of --hops 2"),
    (["--hops", "2", "--n-layers", "2", "--facts", "structured"], "drop --subject-zipf, --relation-zipf and --facts"),
])
def test_models_train_refuses_bad_hops_in_one_line(argv, said, tmp_path, capsys):
    from models.train import main

    code, _, err = run_main(main, [*argv, "--out", tmp_path / "ckpt", "--device", "cpu"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and said in err, err
    assert not (tmp_path / "ckpt").exists()


def test_one_hop_runs_are_recorded_as_before():
    """Without --hops (or with --hops 1) the task config is the one-hop one, recorded without a hops field."""
    from models.recall.train import parser, run_config

    for argv in ([], ["--hops", "1"]):
        run = run_config(parser().parse_args(argv))
        assert type(run.task) is TaskConfig and "hops" not in run_record(run)["task"]
    one = TaskConfig(n_subjects=9)
    assert with_hops(one, {}) is one and with_hops(one, {"hops": 1}) is one
    two = run_config(parser().parse_args(["--hops", "2", "--n-layers", "2"]))
    assert type(two.task) is TwoHopTaskConfig and run_record(two)["task"]["hops"] == 2
    assert two.task.d_vocab == two.task.build().d_vocab and two.task.d_vocab_out == two.task.build().d_vocab_out


@pytest.fixture(scope="module")
def two_hop_ckpt(tmp_path_factory):
    run = RunConfig(TwoHopTaskConfig(n_subjects=S, n_relations=R, n_noise=N, seq_len=T),
                    replace(ModelConfig(), n_layers=2),
                    TrainConfig(steps=6, eval_every=3, eval_size=64, batch_size=64, device="cpu", target_accuracy=2))
    result = train(run, progress=False)
    return result, result.save(tmp_path_factory.mktemp("two_hop") / "ckpt")


def test_training_records_each_prompt_sets_accuracy(two_hop_ckpt):
    result, ckpt = two_hop_ckpt
    assert [row["step"] for row in result.metrics] == [0, 3, 6]
    for row in result.metrics:
        for name in ("one_hop", "two_hop", "held_out"):
            assert 0 <= row[name] <= 1 and row[name] == row["models"][0][name]
    written = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    assert written[-1]["held_out"] == result.metrics[-1]["held_out"]
    config = json.loads((ckpt / "config.json").read_text())
    assert config["task"]["hops"] == 2 and len(config["task"]["held_out"]) == round(0.2 * S * R * R)


def test_the_study_writes_its_files_and_refuses_a_one_hop_checkpoint(two_hop_ckpt, tiny_ckpt, tmp_path, capsys):
    from analyses.two_hop import main

    _, ckpt = two_hop_ckpt
    code, out, err = run_main(main, [ckpt, "--device", "cpu", "--prompts", "64", "--quiet"], capsys)
    assert code == 0, err
    folder = ckpt / "analysis" / "two_hop"
    layers = pd.read_csv(folder / "bridge_layers.csv")
    assert sorted(set(layers["prompts"])) == ["held_out", "two_hop"] and sorted(set(layers["layer"])) == [0, 1, 2]
    assert len(pd.read_csv(folder / "training.csv")) == 3 and (folder / "two_hop.png").is_file()
    code, _, err = run_main(main, [tiny_ckpt, "--device", "cpu", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "not a two-hop task" in err and err.count("\n") == 1


def hand_built(n: int = 400, d: int = 24, classes: int = 6, seed: int = 0):
    """Residuals [3, n, d] whose layer 1 holds the bridge's unembedding direction and layer 2 the
    answer's (layer 0 is noise), with the unembedding W_U [d, classes]."""
    g = torch.Generator().manual_seed(seed)
    W_U = torch.linalg.qr(torch.randn(d, d, generator=g))[0][:, :classes]  # orthonormal columns
    bridges, answers = torch.randint(0, classes, (n,), generator=g), torch.randint(0, classes, (n,), generator=g)
    noise = 0.05 * torch.randn(3, n, d, generator=g)
    resid = noise + torch.stack([torch.randn(n, d, generator=g), W_U.T[bridges], W_U.T[answers]])
    return resid, W_U, bridges, answers


def test_the_probe_finds_the_bridge_where_it_was_put():
    resid, W_U, bridges, answers = hand_built()
    groups = torch.arange(len(bridges)) % 10
    fit = split(groups, 0)
    assert set(groups[fit].tolist()).isdisjoint(groups[~fit].tolist()) and len(set(groups[fit].tolist())) == 5
    table = readout_table(resid, W_U, torch.zeros(W_U.shape[1]), bridges, answers, fit)
    assert list(table.index) == [0, 1, 2] and table.index.name == "layer"
    assert table.loc[1, "bridge_top1"] == 1 and table.loc[1, "bridge_rank"] == 0 and table.loc[0, "bridge_top1"] < 0.5
    assert table.loc[2, "answer_top1"] == 1 and table.loc[2, "answer_rank"] == 0 and table.loc[1, "answer_top1"] < 0.5
    assert table.loc[0, "answer_rank"] > 1 and (table["chance"] == 1 / 6).all()
    assert table.loc[1, "probe_accuracy"] == 1 and table.loc[0, "probe_accuracy"] < 0.5
    assert table.loc[2, "probe_accuracy"] < 0.5  # layer 2 holds the answer, independent of the bridge


def test_a_rank_counts_the_strictly_larger_logits():
    resid = torch.tensor([[[1.0, 3.0, 2.0, 3.0]]])  # [1, 1, 4]: logits through the identity
    ranks = [int(lens_ranks(resid, torch.eye(4), torch.zeros(4), torch.tensor([t]))[0, 0]) for t in range(4)]
    assert ranks == [3, 0, 2, 0]
    shifted = lens_ranks(resid, torch.eye(4), torch.tensor([3.0, 0, 0, 0]), torch.tensor([0]))
    assert int(shifted[0, 0]) == 0


def test_a_probe_of_a_constant_residual_reads_the_commonest_bridge_only():
    targets = torch.tensor([0, 0, 0, 1] * 50)
    fit = split(torch.arange(len(targets)) % 7, 1)
    accuracy = probe_accuracy(torch.ones(1, len(targets), 4), targets, 2, fit)
    assert accuracy.item() == (targets[~fit] == 0).float().mean().item()


def test_the_lens_at_the_last_layer_is_the_models_own_answer(two_hop_ckpt):
    from models import load

    _, ckpt = two_hop_ckpt
    model, task = load(ckpt, "cpu", kind="two_hop")
    batch = task.eval_set(50, 3, mode="two_hop")
    layers, prompts = bridge_readout(model, batch)
    with torch.inference_mode():
        right = model(batch.tokens)[:, -1].argmax(-1) == batch.answers
    assert list(prompts["correct"]) == right.tolist() and list(layers.index) == [0, 1, 2]
    assert layers.loc[2, "answer_top1"] == pytest.approx(right.float().mean().item())
    with pytest.raises(ValueError, match="^the bridge is read on two-hop prompts only"):
        bridge_readout(model, task.eval_set(8, mode="one_hop"))


def test_resolution_by_outcome_counts_the_resolved_prompts():
    prompts = pd.DataFrame({"correct": [True, True, True, False, False], "bridge_layer": [1, 2, -1, 2, -1]})
    table = resolution_by_outcome(prompts)
    assert table.loc["correct", "prompts"] == 3 and table.loc["correct", "resolved_share"] == pytest.approx(2 / 3)
    assert table.loc["correct", "mean_bridge_layer"] == 1.5 and table.loc["wrong", "mean_bridge_layer"] == 2
    unresolved = resolution_by_outcome(pd.DataFrame({"correct": [True, True], "bridge_layer": [-1, -1]}))
    assert unresolved.loc["correct", "resolved_share"] == 0 and pd.isna(unresolved.loc["correct", "mean_bridge_layer"])
    assert unresolved.loc["wrong", "prompts"] == 0 and pd.isna(unresolved.loc["wrong", "resolved_share"])


def test_a_wrong_answer_is_read_as_the_bridge_a_skipped_or_a_swapped_hop():
    facts = torch.tensor([[1, 2], [2, 0], [0, 1]])  # [S=3, R=2]: r(s) = facts[s, r]
    # (s, r1, r2) = (0, 0, 1): bridge 1, answer facts[1, 1] = 0, r2(s) = 2, r1(r2(s)) = facts[2, 0] = 0 (= the answer)
    prompts = pd.DataFrame({"subject": [0, 0, 0, 0], "r1": [0, 0, 0, 0], "r2": [1, 1, 1, 1], "predicted": [0, 1, 2, 2]})
    found = shortcuts(prompts, facts)
    assert found == {"wrong": 3, "bridge": 1 / 3, "first_hop_skipped": 2 / 3, "hops_swapped": 0.0}
    assert shortcuts(prompts.iloc[:1], facts)["bridge"] is None


def test_the_baselines_need_no_composition():
    """Relation 1's outputs (2, 0, 0) have one commonest (0); relation 0's (1, 2, 0) tie three ways."""
    from analyses.two_hop import baselines

    task = TwoHopTask(3, 2, 4, 6, facts=[[1, 2], [2, 0], [0, 0]], held_out=[[0, 0, 1], [1, 1, 0]])
    # (0, 0, 1): bridge 1, answer facts[1, 1] = 0 = relation 1's commonest; (1, 1, 0): bridge 0, answer 1, a 1/3 guess
    found = baselines(task)
    assert found["r2_commonest"] == pytest.approx(2 / 3, abs=1e-12)
    assert found["first_hop_skipped"] == 0 and found["bridge"] == 0
    assert baselines(TwoHopTask(3, 2, 4, 6, held_out_fraction=0)) == {}


def test_each_prompts_row_is_its_prompt_and_its_first_intermediate_layer(two_hop_ckpt):
    """bridge_readout's per-prompt table against the model's own cache: the prompt's fields, the
    model's answer, and bridge_layer = the first of layers 1..L-1 whose residual at the last
    position puts the bridge on top through the unembedding (-1: none)."""
    from models import load

    _, ckpt = two_hop_ckpt
    model, task = load(ckpt, "cpu", kind="two_hop")
    batch = task.eval_set(200, 5, mode="held_out")
    layers, prompts = bridge_readout(model, batch)
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.tokens)
    for column, field in (("subject", batch.subjects), ("answer", batch.answers), ("bridge", batch.bridges),
                          ("r1", batch.relations[:, 0]), ("r2", batch.relations[:, 1])):
        assert prompts[column].tolist() == field.tolist(), column
    assert prompts["predicted"].tolist() == logits[:, -1].argmax(-1).tolist()
    with torch.no_grad():
        top = (cache["blocks.0.hook_resid_post"][:, -1] @ model.W_U + model.b_U).argmax(-1)  # layer 1 of L = 2
        embedding_top = (cache["blocks.0.hook_resid_pre"][:, -1] @ model.W_U + model.b_U).argmax(-1)
    assert prompts["bridge_layer"].tolist() == torch.where(top == batch.bridges, 1, -1).tolist()
    assert layers.loc[0, "bridge_top1"] == pytest.approx((embedding_top == batch.bridges).float().mean().item())
    assert layers.loc[1, "bridge_top1"] == pytest.approx((top == batch.bridges).float().mean().item())


def test_the_probes_split_is_fixed_by_its_seed_and_keeps_groups_whole():
    groups = torch.arange(300) % 30
    assert torch.equal(split(groups, 4), split(groups, 4)) and not torch.equal(split(groups, 4), split(groups, 5))
    for seed in range(3):
        fit = split(groups, seed)
        assert len(set(groups[fit].tolist())) == 15 and set(groups[fit].tolist()).isdisjoint(groups[~fit].tolist())


def test_a_probe_reads_the_same_at_any_scale_of_the_residual():
    """The ridge is relative to the residuals' mean square: scaling them changes nothing."""
    resid, W_U, bridges, _ = hand_built(n=300, d=8, classes=6, seed=2)
    resid = resid + 0.8 * torch.randn(resid.shape, generator=torch.Generator().manual_seed(3))  # not separable
    fit = split(torch.arange(300) % 12, 0)
    base = probe_accuracy(resid, bridges, 6, fit)
    assert 0.3 < base[1] < 1
    for factor in (1e-3, 1e3):
        assert torch.equal(probe_accuracy(resid * factor, bridges, 6, fit), base)


def test_tokens_and_answers_are_named_by_their_side():
    task = TwoHopTask(S, R, N, T)  # entities 0..7, first relations 8..10, second 11..13, noise 14..21, EOS 22
    assert [task.token_label(t) for t in (0, 7, 8, 10, 11, 13, 14, 21, 22)] == \
        ["S0", "S7", "R0", "R2", "R0'", "R2'", "n0", "n7", "EOS"]
    assert task.eos == 22 and task.relation_token(2) == 10 and task.relation_token(2, hop=2) == 13
    assert task.answer_label(7) == "E7" and task.n_facts == S * R
    for outside in (-1, S):
        with pytest.raises(ValueError, match="outside the task's answers 0..7"):
            task.answer_label(outside)
    assert repr(task) == "TwoHopTask(S=8, R=3, N=8, T=8, held out 14 of 72 compositions)"


@pytest.mark.parametrize("kwargs, said", [
    ({"n_subjects": 1}, "n_subjects must be an integer >= 2"),
    ({"n_relations": 0}, "n_relations must be an integer >= 1"),
    ({"n_noise": 0}, "n_noise must be an integer >= 1"),
    ({"seq_len": 3}, "seq_len must be an integer >= 4"),
    ({"n_subjects": 2.0}, "n_subjects must be an integer"),
    ({"one_hop_share": 1.0}, r"one_hop_share must be a number in \[0, 1\)"),
    ({"held_out_fraction": -0.1}, r"held_out_fraction must be a number in \[0, 1\)"),
    ({"held_out_fraction": True}, "held_out_fraction must be a number"),
    ({"facts": "structured"}, "two-hop facts must be 'random' or an S x R table"),
    ({"facts": [[0, 1, 2]] * 7}, "facts must be an S x R = 8 x 3 table of entity ids 0..7"),
    ({"facts": [[0, 1, 8]] * 8}, "facts must be an S x R = 8 x 3 table"),
    ({"facts": [[0, 1, -1]] * 8}, "facts must be an S x R = 8 x 3 table"),
    ({"facts": [[0.0, 1.0, 2.0]] * 8}, "facts must be an S x R = 8 x 3 table"),
    ({"held_out": [[8, 0, 0]]}, r"held-out compositions must be \(s, r1, r2\) with s < 8, r < 3"),
    ({"held_out": [[0, 3, 0]]}, "held-out compositions must be"),
    ({"held_out": [[0, 0, -1]]}, "held-out compositions must be"),
    ({"held_out": [[s, a, b] for s in range(S) for a in range(R) for b in range(R)]}, "every composition is held out"),
])
def test_a_bad_two_hop_task_is_refused(kwargs, said):
    sizes = {"n_subjects": S, "n_relations": R, "n_noise": N, "seq_len": T, **kwargs}
    with pytest.raises(ValueError, match=said):
        TwoHopTask(**sizes)


def test_a_task_section_lacking_its_tables_is_refused_and_no_held_out_prompt_is_drawn_from_none():
    config = TwoHopTask(S, R, N, T).to_config()
    for key in ("facts", "held_out", "n_noise"):
        with pytest.raises(ValueError, match=f"task section lacks {key}"):
            TwoHopTask.from_config({k: v for k, v in config.items() if k != key})
    again = TwoHopTask.from_config({**config, "one_hop_share": 0.25, "held_out": [[1, 2, 0]]})
    assert again.one_hop_share == 0.25 and again.held_out.tolist() == [1 * R * R + 2 * R + 0]
    assert TwoHopTask.from_config({k: v for k, v in config.items() if k != "hops"}).hops == 2
    with pytest.raises(ValueError, match="holds out no composition"):
        TwoHopTask(S, R, N, T, held_out_fraction=0).eval_set(4, mode="held_out")


def test_a_two_hop_run_reads_back_its_settings_for_resume(tmp_path, capsys):
    from models.recall.train import read_run
    from models.train import main

    argv = ["--hops", "2", "--n-layers", "2", "--held-out-compositions", "0.5", "--n-subjects", "6",
            "--n-relations", "2", "--steps", "2", "--eval-every", "1", "--eval-size", "16", "--batch-size", "16",
            "--device", "cpu", "--quiet", "--out", tmp_path / "run"]
    code, out, err = run_main(main, argv, capsys)
    assert code == 0, err
    assert "two-hop   one-hop facts" in out and "held-out compositions" in out
    run, _ = read_run(tmp_path / "run")
    assert run.task == TwoHopTaskConfig(n_subjects=6, n_relations=2, held_out_compositions=0.5)
    assert len(json.loads((tmp_path / "run" / "config.json").read_text())["task"]["held_out"]) == 12


def test_a_seed_fixes_the_facts_the_held_out_set_and_the_prompts():
    task, again, other = (TwoHopTask(S, R, N, T, fact_seed=seed) for seed in (3, 3, 4))
    assert torch.equal(task.facts, again.facts) and torch.equal(task.held_out, again.held_out)
    assert not torch.equal(task.facts, other.facts) and not torch.equal(task.held_out, other.held_out)
    assert torch.equal(task.eval_set(32, 7).tokens, again.eval_set(32, 7).tokens)
    assert not torch.equal(task.eval_set(32, 7).tokens, task.eval_set(32, 8).tokens)
    assert set(TwoHopTask(S, 8, N, T).facts.flatten().tolist()) == set(range(S))  # every entity an answer
    assert TwoHopTask(2, 1, 1, 4).d_vocab == 2 + 2 + 1 + 1  # the smallest task


def test_the_config_and_the_batches_have_their_documented_fields():
    task = TwoHopTask(S, R, N, T)
    config = task.to_config()
    assert set(config) == {"kind", "hops", "n_subjects", "n_relations", "n_noise", "seq_len", "one_hop_share",
                           "held_out_fraction", "facts", "held_out"}
    assert config["held_out_fraction"] == 14 / 72 and config["one_hop_share"] == 0.5
    assert TwoHopTask.from_config({k: v for k, v in config.items() if k != "one_hop_share"}).one_hop_share == 0.5
    assert task.answer_label(0) == "E0"
    batch = task.sample_counter(20, torch.tensor([1, 2]), 0)  # [K=2, B=20, ...]
    assert batch.relations.shape == (2, 20, 2) and batch.positions.shape == (2, 20, 3) and len(batch) == 20
    second = batch.relations[..., 1]
    assert (second[batch.hops == 1] == -1).all() and (second[batch.hops == 2] >= 0).all()
    with pytest.raises(ValueError, match="^every composition is held out"):
        TwoHopTask(2, 1, 1, 4, held_out=[[0, 0, 0], [1, 0, 0]])
    with pytest.raises(ValueError, match="^the task holds out no composition"):
        TwoHopTask(S, R, N, T, held_out_fraction=0).eval_set(4, mode="held_out")
    with pytest.raises(ValueError, match="^one_hop_share must be a number"):
        TwoHopTask(S, R, N, T, one_hop_share="half")
