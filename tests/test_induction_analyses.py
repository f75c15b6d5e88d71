"""python -m analyses.induction: the studies on tiny models, the circuit page offline, the location
table, --help on every command and bad input refused in one line."""
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest

from analyses.induction import studies
from analyses.induction.cli import main
from analyses.sweeps.cli import run_cli
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


def test_one_against_two_layers_trains_the_generic_model_with_each_depth():
    curves, results = studies.one_against_two_layers(TASK, MODEL, TRAIN, progress=False)
    assert sorted(curves.layers.unique()) == [1, 2] and list(curves[curves.layers == 1].step) == [0, 2, 4]
    assert results[1].section.n_layers == 1 and results[2].section.architecture == "generic"


def test_joint_against_alone_trains_each_memory_alone_from_the_others_targets():
    curves = studies.joint_against_alone(TASK, MODEL, TRAIN, progress=False)
    alone = curves[curves["mode"] == "alone"]
    assert set(alone.probe) == {"wk0", "wk1", "wo1"} and set(curves["mode"]) == {"joint", "alone"}
    assert sorted(alone.step.unique()) == [0, 2, 4]


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
