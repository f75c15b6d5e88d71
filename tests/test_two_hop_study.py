"""The two-hop study's command (analyses/two_hop.py): the accuracy curves are the metrics log's, each
prompt set is read on its own prompts, the baselines answer without composing, the report and the
figure say what was measured, and bad input is refused in one line with nothing written."""
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from analyses import two_hop
from models import load
from models.recall.config import ModelConfig, RunConfig, TrainConfig, TwoHopTaskConfig
from models.recall.trainer import train
from probe.bridge import bridge_readout, resolution_by_outcome, shortcuts
from tasks import TwoHopTask
from tests.conftest import run_main

S, R, N, T = 8, 3, 8, 8


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A two-layer two-hop run of 6 steps, evaluated at steps 0, 3, 6."""
    run = RunConfig(TwoHopTaskConfig(n_subjects=S, n_relations=R, n_noise=N, seq_len=T),
                    replace(ModelConfig(), n_layers=2),
                    TrainConfig(steps=6, eval_every=3, eval_size=64, batch_size=64, device="cpu", target_accuracy=2))
    return train(run, progress=False).save(tmp_path_factory.mktemp("two_hop") / "ckpt")


def test_the_curves_are_the_metrics_log_s_accuracies_per_evaluation_step(ckpt, tmp_path):
    logged = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    curves = two_hop.curves(ckpt)
    assert list(curves.columns) == ["step", "accuracy", "one_hop", "two_hop", "held_out"]
    assert curves["step"].tolist() == [0, 3, 6]
    for column in curves.columns:
        assert curves[column].tolist() == [row[column] for row in logged], column
    (tmp_path / "metrics.jsonl").write_text('{"step": 5, "accuracy": 0.5, "one_hop": 0.25}\n')
    one_set = two_hop.curves(tmp_path)  # a log without the two-hop sets: their columns empty
    assert one_set.iloc[0][["step", "accuracy", "one_hop"]].tolist() == [5, 0.5, 0.25]
    assert one_set[["two_hop", "held_out"]].isna().all().all()
    assert list(two_hop.curves(tmp_path / "no_log").columns) == list(curves.columns)  # no log: no rows, same columns


def test_the_first_layer_is_the_first_whose_value_reaches_the_bar():
    values = pd.Series([0.5, 0.9, 0.95, 0.2], index=[0, 1, 2, 3])
    assert two_hop.first_layer(values, 0.9) == 1 and two_hop.first_layer(values, 0.91) == 2
    assert two_hop.first_layer(values, 0.96) is None
    assert two_hop.first_layer(pd.Series([0.1, 1.0], index=[3, 4]), 0.5) == 4  # a layer, not a position
    assert two_hop.READABLE == 0.9


def test_each_set_is_read_on_its_own_prompts_and_a_task_without_held_out_compositions_has_one_set(ckpt):
    """study: the trained compositions on eval_set(n, seed), the held-out ones on eval_set(n, seed + 1),
    each with the probe's split of `seed`; the numbers are those readouts' (answered, the first layer
    where the probe reaches 0.9 and the lens 0.5, the outcomes and the wrong answers' shortcuts)."""
    model, task = load(ckpt, "cpu", kind="two_hop")
    layers, prompts, numbers = two_hop.study(model, task, 24, 5)
    assert list(numbers) == ["two_hop", "held_out"] and list(dict.fromkeys(layers["prompts"])) == list(numbers)
    for i, (name, label) in enumerate((("two_hop", "trained compositions"), ("held_out", "held-out compositions"))):
        per_layer, per_prompt = bridge_readout(model, task.eval_set(24, 5 + i, mode=name), 5)
        mine = layers[layers["prompts"] == name].drop(columns="prompts").set_index("layer")
        pd.testing.assert_frame_equal(mine, per_layer)
        pd.testing.assert_frame_equal(prompts[prompts["prompts"] == name].drop(columns="prompts")
                                      .reset_index(drop=True), per_prompt)
        found = numbers[name]
        assert found["label"] == label and found["accuracy"] == per_prompt["correct"].mean()
        assert found["probe_layer"] == two_hop.first_layer(per_layer["probe_accuracy"], 0.9)
        assert found["lens_layer"] == two_hop.first_layer(per_layer["bridge_top1"], 0.5)
        assert found["by_outcome"] == resolution_by_outcome(per_prompt).to_dict(orient="index")
        assert found["predicted"] == shortcuts(per_prompt, task.facts)
    assert len(prompts) == 48 and len(layers) == 2 * 3
    alone = TwoHopTask(S, R, N, T, facts=task.facts.tolist(), held_out_fraction=0)
    layers, prompts, numbers = two_hop.study(model, alone, 24, 5)
    assert list(numbers) == ["two_hop"] and set(layers["prompts"]) == set(prompts["prompts"]) == {"two_hop"}


def test_a_set_s_numbers_are_the_first_layers_where_the_probe_reaches_0_9_and_the_lens_0_5(monkeypatch):
    """study's numbers from each set's readouts (here given): the probe's first layer at 0.9, the lens's
    at 0.5; the tables of every set, one row each (a fresh index)."""
    per_layer = pd.DataFrame({"probe_accuracy": [0.1, 0.89, 0.9, 1.0], "bridge_top1": [0.0, 0.5, 0.9, 1.0]},
                             index=pd.Index(range(4), name="layer"))
    per_prompt = pd.DataFrame({"correct": [True, False], "bridge_layer": [2, -1], "subject": [0, 1], "r1": [0, 0],
                               "r2": [1, 1], "predicted": [0, 0]})
    monkeypatch.setattr(two_hop, "bridge_readout", lambda model, batch, seed: (per_layer, per_prompt))
    task = TwoHopTask(S, R, N, T)
    layers, prompts, numbers = two_hop.study(None, task, 8, 0)
    assert [(found["probe_layer"], found["lens_layer"]) for found in numbers.values()] == [(2, 1), (2, 1)]
    assert list(layers.index) == list(range(8)) and list(prompts.index) == list(range(4))
    assert numbers["two_hop"]["by_outcome"]["correct"] == {"prompts": 1, "resolved_share": 1.0,
                                                           "mean_bridge_layer": 2.0}


def test_the_baselines_are_their_shares_of_the_held_out_compositions():
    """Relation 0's outputs (1, 2, 0, 3) tie four ways, relation 1's (2, 0, 0, 3) have one commonest (0).
    Held out (s, r1, r2): (0, 0, 1) bridge 1, answer r1(1) = 0; (2, 1, 0) bridge 0, answer r0(0) = 1;
    (3, 1, 1) bridge 3, answer 3; (1, 0, 1) bridge 2, answer r1(2) = 0."""
    task = TwoHopTask(4, 2, 4, 6, facts=[[1, 2], [2, 0], [0, 0], [3, 3]],
                      held_out=[[0, 0, 1], [2, 1, 0], [3, 1, 1], [1, 0, 1]])
    found = two_hop.baselines(task)
    assert list(found) == ["r2_commonest", "first_hop_skipped", "bridge"]
    assert found["r2_commonest"] == pytest.approx((1 + 1 / 4 + 0 + 1) / 4, abs=1e-12)  # a tied guess: 1/4
    assert found["first_hop_skipped"] == pytest.approx(2 / 4, abs=1e-12)  # r2(s) = 2, 0, 3, 0
    assert found["bridge"] == pytest.approx(1 / 4, abs=1e-12)


def numbers_of(held_out_baselines: bool = True) -> dict:
    sets = {"two_hop": {"label": "trained compositions", "accuracy": 0.8122, "probe_layer": 1, "lens_layer": None},
            "held_out": {"label": "held-out compositions", "accuracy": 0.0623, "probe_layer": None,
                         "lens_layer": 2}}
    return {"checkpoint": "ckpt/two", "n_layers": 3, "seconds": 1.26, "sets": sets,
            "baselines": ({"r2_commonest": 0.25, "first_hop_skipped": 0.125, "bridge": 0.5} if held_out_baselines
                          else {})}


def test_the_report_gives_the_last_accuracies_the_baselines_and_where_each_set_reads_the_bridge(tmp_path):
    training = pd.DataFrame({"step": [0, 20, 40.0], "accuracy": [0.1, 0.3, 0.5], "one_hop": [0.1, 0.5, 0.9691],
                             "two_hop": [0.0, 0.3, 0.8122], "held_out": [0.0, 0.01, 0.0623]})
    assert two_hop.report(numbers_of(), training, tmp_path).splitlines() == [
        "ckpt/two: L = 3, at step 40 one-hop 0.969, trained compositions 0.812, held-out compositions 0.062",
        "held-out compositions without composing: r2 commonest 0.250, first hop skipped 0.125, bridge 0.500",
        "trained compositions: answered 0.812; the probe reads the bridge from layer 1, the lens from layer None",
        "held-out compositions: answered 0.062; the probe reads the bridge from layer None, the lens from layer 2",
        f"wrote {tmp_path}/ in 1.3 s"]
    training["held_out"] = float("nan")
    numbers = numbers_of(held_out_baselines=False)
    del numbers["sets"]["held_out"]
    assert two_hop.report(numbers, training, tmp_path).splitlines()[:2] == [
        "ckpt/two: L = 3, at step 40 one-hop 0.969, trained compositions 0.812, held-out compositions none",
        "trained compositions: answered 0.812; the probe reads the bridge from layer 1, the lens from layer None"]


def test_the_figure_draws_each_recorded_curve_chance_and_each_set_s_probe_and_lens():
    training = pd.DataFrame({"step": [0, 10], "accuracy": [0.1, 0.5], "one_hop": [0.1, 0.9],
                             "two_hop": [0.0, 0.7], "held_out": [None, None]})
    layers = pd.DataFrame({"layer": [0, 1, 2, 0, 1, 2], "probe_accuracy": [0.1, 0.9, 0.8, 0.2, 0.5, 0.4],
                           "bridge_top1": [0.0, 0.6, 0.1, 0.0, 0.3, 0.0], "chance": [0.125] * 6,
                           "prompts": ["two_hop"] * 3 + ["held_out"] * 3})
    fig = two_hop.figure(training, layers)  # the command's test sees it written
    left, right = fig.axes
    assert left.get_position().x1 < right.get_position().x0 and left.get_position().y0 == right.get_position().y0
    assert left.get_lines()[0].get_xdata().tolist() == [0, 10]  # over the training steps
    assert [line.get_label() for line in left.get_lines()] == ["one-hop facts", "trained compositions",
                                                               "chance (1/S)"]
    assert left.get_lines()[1].get_ydata().tolist() == [0.0, 0.7] and left.get_lines()[2].get_ydata()[0] == 0.125
    assert (left.get_xlabel(), left.get_ylabel(), left.get_title()) == ("training step", "accuracy",
                                                                        "accuracy over training")
    assert [t.get_text() for t in left.get_legend().get_texts()] == ["one-hop facts", "trained compositions",
                                                                    "chance (1/S)"]
    assert [line.get_label() for line in right.get_lines()] == [
        "chance (1/S)", "probe, trained compositions", "lens top-1, trained compositions",
        "probe, held-out compositions", "lens top-1, held-out compositions"]
    assert right.get_lines()[3].get_ydata().tolist() == [0.2, 0.5, 0.4]
    assert all(line.get_xdata().tolist() == [0, 1, 2] for line in right.get_lines()[1:])  # over the layers
    # the probe drawn with dots and a line, the lens with crosses and dashes
    assert [(line.get_marker(), line.get_linestyle()) for line in right.get_lines()[1:3]] == [("o", "-"), ("x", "--")]
    assert right.get_lines()[2].get_ydata().tolist() == [0.0, 0.6, 0.1]
    assert (right.get_xlabel(), right.get_ylabel(), right.get_title()) == (
        "layer (0 = embedding)", "bridge read", "the bridge r1(s) at the last position")
    assert right.get_xticks().tolist() == [0, 1, 2]
    assert left.get_ylim() == right.get_ylim() == (-0.02, 1.02)
    assert len(right.get_legend().get_texts()) == 5


def test_the_command_writes_the_study_and_refuses_bad_input_in_one_line(ckpt, tmp_path, capsys):
    """Its files and summary.json (the settings, depth, held-out count, baselines, last evaluation, sets);
    the same settings again write over their own results, other settings, too few prompts and a one-hop
    checkpoint are refused in one line with nothing written."""
    from models.recall.deep_constructions import main as construct

    out = tmp_path / "study"
    code, printed, err = run_main(two_hop.main, [ckpt, "--device", "cpu", "--prompts", "16", "--seed", "3",
                                                 "--quiet", "--out", out], capsys)
    assert code == 0, err
    assert {p.name for p in out.iterdir()} == {"training.csv", "bridge_layers.csv", "bridge_prompts.csv",
                                               "two_hop.png", "summary.json"}
    summary = json.loads((out / "summary.json").read_text())
    model, task = load(ckpt, "cpu", kind="two_hop")
    assert summary["settings"] == {"prompts": 16, "seed": 3} and summary["n_layers"] == 2
    assert (summary["checkpoint"], summary["step"]) == (str(ckpt), None) and len(summary["weights_sha256"]) == 64
    assert summary["held_out_compositions"] == len(task.held_out) == round(0.2 * S * R * R)
    assert summary["baselines"] == pytest.approx(two_hop.baselines(task), abs=1e-12)
    assert summary["final"] == pytest.approx(two_hop.curves(ckpt).iloc[-1].to_dict())
    _, _, numbers = two_hop.study(model, task, 16, 3)
    assert summary["sets"]["held_out"]["accuracy"] == numbers["held_out"]["accuracy"]
    assert isinstance(summary["seconds"], float) and 0 < summary["seconds"] == round(summary["seconds"], 2) < 600
    training = pd.read_csv(out / "training.csv")
    assert training["step"].tolist() == [0, 3, 6]
    layers = pd.read_csv(out / "bridge_layers.csv")
    assert len(layers) == 6 and len(pd.read_csv(out / "bridge_prompts.csv")) == 32
    assert printed == two_hop.report(summary, training, out) + "\n"
    assert run_main(two_hop.main, [ckpt, "--device", "cpu", "--prompts", "16", "--seed", "3", "--quiet", "--out",
                                   out], capsys)[0] == 0
    before = (out / "summary.json").read_text()
    for argv, says in ((["--prompts", "8"], "holds other two_hop results"),
                       (["--prompts", "3"], "--prompts must be >= 4"),
                       (["--seed", "4", "--prompts", "16"], "holds other two_hop results")):
        code, _, err = run_main(two_hop.main, [ckpt, *argv, "--device", "cpu", "--quiet", "--out", out], capsys)
        assert code == 2 and err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert (out / "summary.json").read_text() == before
    one_hop = tmp_path / "one_hop"
    assert run_main(construct, ["--kind", "mixed", "--out", one_hop], capsys)[0] == 0
    code, _, err = run_main(two_hop.main, [one_hop, "--device", "cpu", "--quiet", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "not a two-hop task" in err and err.count("\n") == 1 and not (tmp_path / "x").exists()
    assert two_hop.parser().description == two_hop.__doc__ and two_hop.TwoHopSettings().prompts == 2000


def test_a_snapshot_s_study_reads_its_weights_and_never_takes_the_final_weights_place(ckpt, tmp_path, capsys):
    """The default folder is CKPT/analysis/two_hop, a snapshot's CKPT/analysis/step_N/two_hop, read on the
    snapshot's weights; a snapshot's study is refused where the final weights' is, in one line naming the
    command; --help names the prompts' seed and the settings' group."""
    import shutil

    from analyses.recorded import source

    mine = Path(shutil.copytree(ckpt, tmp_path / "ckpt"))
    argv = ["--device", "cpu", "--prompts", "16", "--quiet"]
    assert run_main(two_hop.main, [mine, *argv], capsys)[0] == 0
    final = json.loads((mine / "analysis" / "two_hop" / "summary.json").read_text())
    assert run_main(two_hop.main, [mine, *argv, "--step", "1"], capsys)[0] == 0
    early = json.loads((mine / "analysis" / "step_1" / "two_hop" / "summary.json").read_text())
    assert (final["step"], early["step"]) == (None, 1)
    assert early["weights_sha256"] == source(mine, 1)["weights_sha256"] != final["weights_sha256"]
    model, task = load(mine, "cpu", 1, kind="two_hop")
    layers, _, _ = two_hop.study(model, task, 16, 0)
    written = pd.read_csv(mine / "analysis" / "step_1" / "two_hop" / "bridge_layers.csv")
    assert written["probe_accuracy"].tolist() == pytest.approx(layers["probe_accuracy"].tolist(), abs=1e-9)
    code, _, err = run_main(two_hop.main, [mine, *argv, "--step", "1", "--out", mine / "analysis" / "two_hop"], capsys)
    assert code == 2 and "holds other two_hop results" in err and "which two_hop does not write over" in err
    assert err.count("\n") == 1
    assert json.loads((mine / "analysis" / "two_hop" / "summary.json").read_text()) == final
    code, _, err = run_main(two_hop.main, [mine, *argv, "--out", mine / "analysis" / "step_1" / "two_hop"], capsys)
    assert code == 2 and "holds other two_hop results" in err  # nor the final weights' in the snapshot's place
    shown = " ".join(two_hop.parser().format_help().split())
    assert two_hop.parser().prog == "python -m analyses.two_hop"
    assert "seed of the prompts and the probe's split (default 0)" in shown and "what is measured:" in shown
