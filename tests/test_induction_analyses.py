"""python -m analyses.induction: the studies on tiny models, the circuit page offline, the location
table, --help on every command and bad input refused in one line."""
import html
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, replace

import pandas as pd
import pytest
import torch

from analyses.induction import studies
from analyses.induction.cli import main
from analyses.sweeps.cli import run_cli
from models.checkpoint import snapshot_path, weights_sha256
from models.induction.config import InductionModelConfig, InductionTaskConfig, InductionTrainConfig
from models.induction.trainer import train

TASK = InductionTaskConfig(n_triggers=2, seq_len=16)
MODEL = InductionModelConfig(d_model=16)
TRAIN = InductionTrainConfig(lr=(0.2,), batch_size=8, steps=4, eval_every=2, eval_size=8, snapshot_every=2,
                             device="cpu")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    result = train(TASK, replace(MODEL, d_mlp=32), replace(TRAIN, loss="all"), progress=False)[0]
    return result.save(tmp_path_factory.mktemp("induction") / "model")


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """Another checkpoint of the same shape: other weights (seed 1)."""
    result = train(TASK, replace(MODEL, d_mlp=32), replace(TRAIN, loss="all", seed=(1,)), progress=False)[0]
    return result.save(tmp_path_factory.mktemp("induction") / "other")


def test_one_against_two_layers_trains_the_generic_model_with_each_depth():
    curves, results = studies.one_against_two_layers(TASK, MODEL, TRAIN, progress=False)
    assert sorted(curves.layers.unique()) == [1, 2] and list(curves[curves.layers == 1].step) == [0, 2, 4]
    assert curves.index.tolist() == list(range(6))
    assert results[1].section.n_layers == 1 and results[2].section.architecture == "generic"


@pytest.mark.parametrize("alone", ["target", "init"])
def test_joint_against_alone_holds_the_other_two_memories_as_asked(alone):
    """target: the other two frozen at the construction's memories (their recall constant, W_KQ^2's 1); init
    (the authors' freeze_until): at their random initial values until --until, then trained."""
    probes, curves, joint = studies.joint_against_alone(TASK, MODEL, replace(TRAIN, steps=6), progress=False,
                                                        alone=alone, until=2)
    assert set(probes["mode"]) == {"joint", "alone"} and set(probes.trained_alone) == {"", "wk0", "wk1", "wo1"}
    assert sorted(probes.step.unique()) == [0, 2, 4, 6] and set(curves.trained_alone) == {"", "wk0", "wk1", "wo1"}
    assert joint.training["frozen"] == () and sorted(joint.snapshots) == [0, 2, 4, 6]
    assert joint.training["task_config"] == asdict(TASK) and joint.training["steps_run"] == 6
    assert probes.index.tolist() == list(range(len(probes))) and curves.index.tolist() == list(range(len(curves)))
    run = probes[probes.trained_alone == "wo1"].pivot(index="step", columns="probe", values="value")
    start = probes[(probes.trained_alone == "") & (probes.step == 0)].set_index("probe").value
    others = run[["wk0", "wk1"]]
    if alone == "target":
        assert (others == others.iloc[0]).all().all() and (others.wk1 == 1.0).all() and start.wk1 < 1.0
    else:
        assert (others.loc[[0, 2]] == start[["wk0", "wk1"]]).all().all()
    learned = studies.steps_to_learn(probes)
    assert list(learned.columns) == ["probe", "joint", "alone"] and learned.probe.tolist() == ["wk0", "wk1", "wo1"]
    assert set(studies.accuracy_to_learn(curves)) == {"joint", "alone_wk0", "alone_wk1", "alone_wo1"}


def test_with_alone_init_the_other_memories_join_training_after_until(monkeypatch):
    """The authors' freeze_until: in each run that trains one memory alone, the other two stay exactly at
    their initial values up to step `until` and move after it (by 0.03 and more at step 4, lr 0.2)."""
    from models.induction.construction import TARGETS
    from models.induction.weights import init_weights

    runs = []

    def keep(*args, **kwargs):
        results = train(*args, **kwargs)
        runs.append(results[0])
        return results
    monkeypatch.setattr(studies, "train", keep)
    studies.joint_against_alone(TASK, MODEL, replace(TRAIN, steps=4), progress=False, alone="init", until=2)
    start = init_weights(MODEL.section(TASK.build()), TRAIN.seed[0])
    assert [run.training["frozen"] for run in runs[1:]] == [TARGETS[1:], TARGETS[::2], TARGETS[:2]]
    for run in runs[1:]:  # runs[0]: the joint run
        assert sorted(run.snapshots) == [0, 2, 4]
        for key in run.training["frozen"]:
            moved = [(run.snapshots[step][key] - start[key]).abs().max().item() for step in (0, 2, 4)]
            assert moved[:2] == [0.0, 0.0] and moved[2] > 0.01, (key, moved)


def test_the_authors_freeze_until_is_refused_outside_the_run():
    with pytest.raises(ValueError, match="--until must be a step in 1..3"):
        studies.joint_against_alone(TASK, MODEL, TRAIN, progress=False, alone="init", until=4)
    with pytest.raises(ValueError, match="alone must be one of target, init, none"):
        studies.joint_against_alone(TASK, MODEL, TRAIN, progress=False, alone="frozen")


def test_learning_order_and_steps_to_learn_read_the_first_step_over_the_threshold():
    probes = pd.DataFrame({"step": [0, 10, 20] * 3, "probe": ["wk0"] * 3 + ["wk1"] * 3 + ["wo1"] * 3,
                           "value": [0, 0.5, 0.95, 0, 0.91, 1, 0.2, 0.3, 0.4]})
    order = studies.learning_order(probes)
    assert order.probe.tolist() == ["wk1", "wk0", "wo1"] and order.first_step.tolist()[:2] == [10, 20]
    assert pd.isna(order.first_step.iloc[2])
    learned = studies.steps_to_learn(probes.assign(mode="joint"))
    assert learned.set_index("probe").loc["wk0", "joint"] == 20 and learned["alone"].isna().all()


def test_circuit_writes_an_offline_page_and_the_head_scores(ckpt, tmp_path):
    assert main(["circuit", str(ckpt), "--out", str(tmp_path), "--device", "cpu"]) == 0
    page = (tmp_path / "circuit.html").read_text()
    assert "L0H0" in page and "L1H0" in page and "unpkg.com" not in page
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert list(heads.columns) == ["layer", "head", "previous_token", "induction"] and len(heads) == 2


def test_location_writes_the_variants_and_the_mlps_kl(ckpt, tmp_path):
    assert main(["location", str(ckpt), "--out", str(tmp_path), "--device", "cpu", "--ranks", "2"]) == 0
    table = pd.read_csv(tmp_path / "location.csv")
    assert table.variant.tolist() == ["clean", "mlp_ablated", "mlp_rank_2", "head_1.0_ablated"]
    assert (tmp_path / "location.png").stat().st_size > 1000 and (tmp_path / "summary.json").is_file()


def run(argv, capsys) -> tuple[int, str, str]:
    """The command as `python -m analyses.induction` runs it (run_cli's exit code and one-line refusal)."""
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: main(argv))
    out = capsys.readouterr()
    return stop.value.code, out.out, out.err


@pytest.mark.parametrize("command", [[], ["layers"], ["probes"], ["reproduce"], ["circuit"], ["location"]])
def test_every_command_has_help(command, capsys):
    code, out, _ = run([*command, "--help"], capsys)
    assert code == 0 and "usage: python -m analyses.induction" in out


@pytest.mark.parametrize("argv, message", [
    (["location", "tests/data/pre_aot_package/factual_recall"], "this tool reads induction checkpoints only"),
    (["circuit", "tests/data/pre_aot_package/attention_only"], "this tool reads induction checkpoints only"),
    (["layers", "--steps", "0"], "--steps must be >= 1"),
    (["probes", "--d-model", "0"], "--d-model must be >= 1"),
    (["reproduce", "--n-triggers", "70"], "n_triggers must be an integer in 1..65"),
    (["probes", "--preset", "huge"], "invalid choice: 'huge'"),
    (["circuit", "no/such/dir"], "no such directory"),
])
def test_bad_input_is_refused_in_one_line(argv, message, tmp_path, capsys):
    code, _, err = run([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_the_module_refuses_in_one_line_as_a_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "analyses.induction", "location",
                           "tests/data/pre_aot_package/factual_recall", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_checkpoint_results_record_their_weights_and_refuse_others(ckpt, other, tmp_path, capsys):
    """circuit and location record the checkpoint, step and weights_sha256 they read, and write only into a
    folder of their own results of the same weights and settings (analyses.recorded)."""
    out = tmp_path / "loc"
    assert main(["location", str(ckpt), "--out", str(out), "--device", "cpu", "--ranks", "2", "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in ("checkpoint", "step", "weights_sha256", "settings")} == {
        "checkpoint": str(ckpt), "step": None, "weights_sha256": weights_sha256(ckpt), "settings": {"ranks": [2]}}
    assert main(["location", str(ckpt), "--out", str(out), "--device", "cpu", "--ranks", "2", "--quiet"]) == 0  # same
    for argv, message in (([str(other), "--ranks", "2"], "holds other induction_location results (weights_sha256"),
                          ([str(ckpt), "--ranks", "4"], "holds other induction_location results (settings.ranks")):
        code, _, err = run(["location", *argv, "--out", str(out), "--device", "cpu"], capsys)
        assert code == 2 and message in err and err.count("\n") == 1, err
    code, _, err = run(["circuit", str(ckpt), "--out", str(other / "analysis" / "mine"), "--device", "cpu"], capsys)
    assert code == 2 and "is inside another checkpoint" in err, err
    code, _, err = run(["probes", "--out", str(ckpt / "analysis" / "probes")], capsys)
    assert code == 2 and "is inside a checkpoint" in err, err


def test_a_checkpoints_own_results_follow_its_weights_and_snapshots(ckpt, tmp_path):
    """In the checkpoint's own analysis/ folder, results of earlier weights (it was trained again) are
    replaced; a snapshot's go to analysis/step_N/ with that snapshot's hash."""
    copy = shutil.copytree(ckpt, tmp_path / "copy")
    assert main(["circuit", str(copy), "--device", "cpu", "--quiet"]) == 0
    own = copy / "analysis" / "induction_circuit"
    shutil.copy(snapshot_path(ckpt, 2), copy / "model.safetensors")  # trained again
    assert main(["circuit", str(copy), "--device", "cpu", "--quiet"]) == 0
    assert json.loads((own / "summary.json").read_text())["weights_sha256"] == weights_sha256(copy)
    assert main(["circuit", str(copy), "--step", "2", "--device", "cpu", "--quiet"]) == 0
    step = json.loads((copy / "analysis" / "step_2" / "induction_circuit" / "summary.json").read_text())
    assert step["step"] == 2 and step["weights_sha256"] == weights_sha256(copy, 2)


def test_probes_continue_only_their_own_interrupted_run(tmp_path, capsys):
    """The joint run's state (OUT/train_state) records its settings: a study of other settings refuses it
    in one line; the same settings continue from it, and the state goes once the study is done."""
    argv = ["probes", "--steps", "4", "--n-triggers", "2", "--seq-len", "16", "--d-model", "16", "--batch-size", "8",
            "--probe-every", "2", "--alone", "none", "--triggers", "random", "--device", "cpu", "--quiet",
            "--out", str(tmp_path)]
    state = tmp_path / "train_state"
    state.mkdir()
    (state / "run.json").write_text(json.dumps({"task": {}, "model": {}, "training": {"steps": 3}}))
    code, _, err = run(argv, capsys)
    assert code == 2 and "holds the training state of another probes run" in err and err.count("\n") == 1, err
    (state / "run.json").unlink()
    assert main(argv) == 0 and not state.exists()
    assert json.loads((tmp_path / "summary.json").read_text())["probes"]["sizes"]["triggers"] == "random"
    first = pd.read_csv(tmp_path / "probes.csv")
    state.mkdir()
    (state / "run.json").write_text(json.dumps(json.loads((tmp_path / "summary.json").read_text())["probes"]["run"]))
    assert main(argv) == 0 and pd.read_csv(tmp_path / "probes.csv").equals(first)


def test_the_tables_of_the_probes_study_read_the_threshold_inclusively_and_each_runs_own_memory():
    """A run alone counts for its own memory only; a value equal to the threshold has reached it; a probe or
    run that never does is last (NaN, None); the tables have fresh indices and only their own columns."""
    rows = []
    for trained_alone, values in (("", {"wk0": [0, 0.5, 0.9], "wk1": [0, 0.9, 1], "wo1": [0.1, 0.2, 0.3],
                                        "ff1": [2.0, 1.0, 0.5]}),
                                  ("wo1", {"wo1": [0, 0.9, 1], "wk0": [1, 1, 1]}),
                                  ("wk0", {"wk0": [0, 0, 0.95], "wk1": [1, 1, 1]})):
        for probe, series in values.items():
            rows += [{"step": step, "probe": probe, "value": v, "mode": "alone" if trained_alone else "joint",
                      "trained_alone": trained_alone} for step, v in zip((0, 10, 20), series)]
    probes = pd.DataFrame(rows)
    own = studies.own_probe(probes)
    assert own.index.tolist() == list(range(len(own))) and list(own.columns) == list(probes.columns)
    assert sorted(set(zip(own.trained_alone, own.probe))) == [("", "wk0"), ("", "wk1"), ("", "wo1"),
                                                              ("wk0", "wk0"), ("wo1", "wo1")]
    learned = studies.steps_to_learn(probes).set_index("probe")
    assert learned.loc["wk0"].tolist() == [20, 20] and learned.loc["wo1", "alone"] == 10
    assert learned.loc["wk1", "joint"] == 10 and pd.isna(learned.loc["wk1", "alone"])
    assert pd.isna(learned.loc["wo1", "joint"])
    order = studies.learning_order(probes[probes["mode"] == "joint"])
    assert list(order.columns) == ["probe", "memory", "first_step"] and order.index.tolist() == [0, 1, 2]
    assert order.probe.tolist() == ["wk1", "wk0", "wo1"] and order.memory[0] == "blocks.1.attn.W_K"
    assert order.first_step.tolist()[:2] == [10, 20] and pd.isna(order.first_step[2])
    curves = pd.DataFrame({"step": [0, 10] * 3, "mode": ["joint"] * 2 + ["alone"] * 4,
                           "trained_alone": ["", "", "wo1", "wo1", "wk0", "wk0"],
                           "in_context_accuracy": [0.1, 0.9, 0.2, 0.95, 0.1, 0.3]})
    found = studies.accuracy_to_learn(curves)
    assert list(found.items()) == [("joint", 10), ("alone_wo1", 10), ("alone_wk0", None)]
    read_back = curves.replace({"trained_alone": {"": float("nan")}})  # the joint run's "" in probes_curves.csv
    assert studies.accuracy_to_learn(read_back) == found


def test_the_curves_and_the_mlps_kl_over_training():
    from models.bridge import build_bridge
    from probe.induction import memory_recall

    result = train(TASK, replace(MODEL, d_mlp=32), replace(TRAIN, loss="all"), progress=False)[0]
    curve = studies.curve_table(result, mode="joint")
    assert "lr" not in curve and "seed" not in curve and (curve["mode"] == "joint").all() and "step" in curve
    kl = studies.ff1_over_training(result)
    assert list(kl.columns) == ["step", "ff1_kl"] and kl.step.tolist() == [0, 2, 4]
    model = build_bridge(result.section, result.snapshots[4], "cpu", result.task)
    assert kl.ff1_kl.iloc[-1] == pytest.approx(memory_recall(model, result.task).set_index("probe").value["ff1"])
    assert studies.probes_over_snapshots(result).probe.tolist()[:4] == ["wk0", "wk1", "wo1", "ff1"]  # as measured
    assert list(studies.curve_table(replace(result, metrics=[{"step": 0, "in_context_accuracy": 0.5}]))) == [
        "step", "in_context_accuracy"]  # a curve without lr and seed read as it is
    with pytest.raises(ValueError, match=r"^the model has no snapshots \(train with snapshot_every > 0\)\.$"):
        studies.probes_over_snapshots(replace(result, snapshots={}))


def test_the_studies_show_a_bar_per_run_and_take_every_alone_mode(monkeypatch, capsys):
    """By default each training run shows its progress (here as status lines); init: the others join at
    step 1 (step 0 is refused: they would never be frozen); none: the joint run only; snapshots at every
    evaluation when the configuration asks for none."""
    monkeypatch.delenv("FACTUAL_RECALL_PROGRESS", raising=False)
    monkeypatch.setattr("models.training.progress.STATUS_SECONDS", 0.0)
    cfg = replace(TRAIN, steps=2, snapshot_every=0)
    probes, _, _ = studies.joint_against_alone(TASK, MODEL, cfg, alone="init", until=1)
    assert capsys.readouterr().err.count("training 1 model: 1/2 steps") == 4
    assert sorted(probes.step.unique()) == [0, 2] and set(probes.trained_alone) == {"", "wk0", "wk1", "wo1"}
    probes, curves, _ = studies.joint_against_alone(TASK, MODEL, cfg, progress=False, alone="none")
    assert set(probes["mode"]) == {"joint"} and set(curves.trained_alone) == {""}
    with pytest.raises(ValueError, match="--until must be a step in 1..1"):
        studies.joint_against_alone(TASK, MODEL, cfg, progress=False, alone="init", until=0)
    studies.one_against_two_layers(TASK, MODEL, cfg)
    assert capsys.readouterr().err.count("training 1 model: 1/2 steps") == 2


def long_model():
    """An untrained simplified model of T = 64 (the circuit page's defaults show 48 characters)."""
    from models.bridge import build_bridge
    from models.induction.weights import init_weights

    task = replace(TASK, seq_len=64).build()
    section = MODEL.section(task)
    return build_bridge(section, init_weights(section, 0), "cpu", task), task


def test_the_circuit_views_are_each_layers_patterns_with_the_characters(monkeypatch):
    import circuitsvis.attention

    from analyses.induction import report

    model, task = long_model()
    tokens = task.eval_set(1, seed=2).tokens[0, :20]
    tokens[:2] = torch.tensor([0, 1])  # "\n" and " ": written as \n and a space
    asked = {}
    monkeypatch.setattr(circuitsvis.attention, "attention_heads", lambda **kwargs: asked.update(kwargs) or "view")
    assert report.attention_view(model, tokens, 1) == "view"
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens[None])
    pattern = cache["blocks.1.attn.hook_pattern"][0]  # [H, T, T]
    assert asked.pop("attention") == torch.round(pattern, decimals=4).tolist()
    assert asked.pop("tokens") == ["\\n", " "] + [repr(c)[1:-1] for c in model.to_str_tokens(tokens)[2:]]
    assert asked == {"attention_head_names": ["L1H0"], "max_value": 1.0, "min_value": 0.0, "mask_upper_tri": True}


def test_the_circuit_page_shows_the_scores_the_triggers_and_a_view_per_layer(monkeypatch):
    from analyses.induction import report
    from probe.induction import clean_batch, head_scores

    model, task = long_model()
    monkeypatch.setattr(report, "attention_view", lambda model, tokens, layer: (layer, tokens.tolist()))
    monkeypatch.setattr(report, "offline_html", lambda view: f"<view {view[0]}: {view[1]}>")
    text, scores = report.circuit_page(model, task, "the title")
    batch = clean_batch(model, task, 64)
    expected = head_scores(model, task, batch)
    pd.testing.assert_frame_equal(scores, expected)
    triggers = ", ".join(f"{task.token_label(int(q))!r} -> {task.token_label(int(o))!r}"
                         for q, o in zip(batch.triggers[0], batch.outputs[0]))
    previous = expected.loc[expected.previous_token.idxmax()]
    for shown in (f"triggers {html.escape(triggers)}. Scores over 64 sequences: <b>previous_token</b> = share of "
                  "a query's attention on the position before it; <b>induction</b> = share, at in-context "
                  "positions (a trigger seen before), on the positions that follow an earlier occurrence of the "
                  "query's token.</p>\n" + expected.to_html(index=False, float_format="%.3f") + "\n<p>",
                  f"The previous-token head: L{int(previous.layer)}H{int(previous['head'])} "
                  f"({previous.previous_token:.2f})",
                  "<h2>Layer 0</h2>\n<view 0: " + str(batch.tokens[0, :48].tolist()),
                  "<h2>Layer 1</h2>\n<view 1: "):
        assert shown in text, shown


def drawn(ax) -> list[tuple]:
    """(label, linestyle, colour, x, y) of each line of an axes."""
    from matplotlib.colors import to_hex
    return [(line.get_label(), line.get_linestyle(), to_hex(line.get_color()), list(line.get_xdata()),
             list(line.get_ydata())) for line in ax.get_lines()]


def test_the_figures_draw_their_tables(tmp_path):
    """Each figure's lines, bars, labels and limits, read back from the matplotlib objects."""
    from analyses.induction import figures

    curves = pd.DataFrame({"layers": [1, 1, 2, 2], "step": [0, 5, 0, 5], "in_context_accuracy": [0.1, 0.4, 0.2, 0.9],
                           "bigram_loss": [3.0, 2.5, 3.1, 2.4]})
    fig = figures.layers_figure(curves, tmp_path / "layers.png")
    acc, loss = fig.axes
    assert (tmp_path / "layers.png").stat().st_size > 0
    assert drawn(acc) == [("1 layer", "-", "#1f77b4", [0, 5], [0.1, 0.4]),
                          ("2 layers", "-", "#ff7f0e", [0, 5], [0.2, 0.9]),
                          ("talk: 1 layer ~55%", ":", "#808080", [0, 1], [0.55, 0.55]),
                          ("talk: 2 layers ~99%", "--", "#808080", [0, 1], [0.99, 0.99])]
    assert drawn(loss) == [("1 layer", "-", "#1f77b4", [0, 5], [3.0, 2.5]),
                           ("2 layers", "-", "#ff7f0e", [0, 5], [3.1, 2.4])]
    assert list(fig.get_size_inches()) == [10, 3.6] and acc.get_position().y0 == loss.get_position().y0
    assert (acc.get_xlabel(), acc.get_ylabel(), acc.get_ylim()) == ("step", "in-context accuracy (counter >= 2)",
                                                                     (0, 1.02))
    assert (loss.get_xlabel(), loss.get_ylabel()) == ("step", "bigram loss (nats)")
    assert [t.get_fontsize() for ax in (acc, loss) for t in ax.get_legend().get_texts()][:1] == [8.0]
    assert loss.get_legend() is not None and loss.get_legend().get_texts()[0].get_fontsize() == 8.0

    names = ["wk0"] * 2 + ["wk0_64"] * 2 + ["wk1"] * 2 + ["wo1"] * 2 + ["ff1"] * 2
    probes = pd.DataFrame({"step": [0, 5] * 5, "probe": names,
                           "value": [0.1, 0.5, 0.2, 0.6, 0.3, 0.7, 0.4, 0.8, 2.0, 1.0], "mode": ["joint"] * 10,
                           "trained_alone": [""] * 10})
    alone = pd.DataFrame({"step": [0, 5, 0, 5], "probe": ["wo1", "wo1", "wk0", "wk0"], "value": [0.0, 1.0, 0.5, 0.5],
                          "mode": ["alone"] * 4, "trained_alone": ["wo1", "wo1", "wo1", "wo1"]})
    runs = pd.DataFrame({"step": [0, 5, 0, 5], "mode": ["joint", "joint", "alone", "alone"],
                         "trained_alone": ["", "", "wo1", "wo1"], "in_context_accuracy": [0.1, 0.3, 0.2, 0.6]})
    fig = figures.probes_figure(pd.concat([probes, alone], ignore_index=True), runs, tmp_path / "probes.png")
    ax, acc = fig.axes
    assert list(fig.get_size_inches()) == [11, 3.8] and ax.get_position().y0 == acc.get_position().y0
    assert (tmp_path / "probes.png").stat().st_size > 0
    assert drawn(ax) == [("W_KQ^1 (wk0), joint", "-", "#1f77b4", [0, 5], [0.1, 0.5]),
                         ("W_KQ^1, t < 64 (wk0_64), joint", ":", "#1f77b4", [0, 5], [0.2, 0.6]),
                         ("W_KQ^2 (wk1), joint", "-", "#ff7f0e", [0, 5], [0.3, 0.7]),
                         ("W_OV^2 (wo1), joint", "-", "#2ca02c", [0, 5], [0.4, 0.8]),
                         ("W_OV^2 (wo1), alone", "--", "#2ca02c", [0, 5], [0.0, 1.0])]
    assert drawn(acc) == [("joint", "-", "#000000", [0, 5], [0.1, 0.3]),
                          ("W_OV^2 (wo1) alone", "--", "#2ca02c", [0, 5], [0.2, 0.6])]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_ylim()) == ("step", "memory recall", (-0.02, 1.02))
    assert (acc.get_xlabel(), acc.get_ylabel(), acc.get_ylim()) == ("step", "held-out in-context accuracy",
                                                                    (-0.02, 1.02))
    assert [a.get_legend().get_texts()[0].get_fontsize() for a in (ax, acc)] == [7.0, 7.0]

    table = pd.DataFrame({"in_context": [0.8, 0.2], "global": [0.1, 0.6], "bigram_kl": [0.2, 2.0]},
                         index=pd.Index(["clean", "mlp_ablated"], name="variant"))
    fig = figures.location_figure(table)
    share, kl = fig.axes
    assert list(fig.get_size_inches()) == [10, 3.6] and share.get_position().y0 == kl.get_position().y0
    bars = [(round(b.get_x(), 3), round(b.get_width(), 3), b.get_height()) for b in share.patches]
    assert bars == [(-0.4, 0.4, 0.8), (0.6, 0.4, 0.2), (-0.0, 0.4, 0.1), (1.0, 0.4, 0.6)]
    assert [(round(b.get_x() + b.get_width() / 2, 3), b.get_height()) for b in kl.patches] == [(0, 0.2), (1, 2.0)]
    for a in (share, kl):
        ticks = a.get_xticklabels()
        assert [t.get_text() for t in ticks] == ["clean", "mlp_ablated"] and list(a.get_xticks()) == [0, 1]
        assert (ticks[0].get_rotation(), ticks[0].get_ha(), ticks[0].get_fontsize()) == (30.0, "right", 8.0)
    assert (share.get_ylabel(), share.get_ylim()) == ("share of in-context positions\n(output != global top)", (0, 1))
    assert kl.get_ylabel() == "KL(pi_b || model) at bigram positions (nats)"
    assert [t.get_text() for t in share.get_legend().get_texts()] == ["predicts the in-context output",
                                                                      "predicts the global bigram"]
    assert share.get_legend().get_texts()[0].get_fontsize() == 8.0
