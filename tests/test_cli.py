"""Entry points: --help, bad arguments give one line and exit 2 (each command through its main in this
process, and as a process), constructions reach 100%."""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_main


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_train_help_documents_every_flag():
    proc = run("models.train", "--help")
    assert proc.returncode == 0
    for flag in ("--preset", "--out", "--lr", "--seed", "--n-subjects", "--d-model", "--attn-only", "--freeze-ov",
                 "--device", "--target-accuracy", "--snapshots-per-octave", "--wandb", "--embedding"):
        assert flag in proc.stdout, flag


@pytest.mark.parametrize("args, message", [
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--lr", "0"], "learning rates must be > 0"),
    (["--seq-len", "2"], "seq_len must be an integer >= 3"),
    (["--device", "cuda:7"] if not __import__("torch").cuda.is_available() else ["--device", "tpu"], "device"),
    (["--preset", "shape:0.25,1,8,16"], "d_head"),
    (["--target-accuracy", "nan"], "target_accuracy must be a number"),
])
def test_train_bad_arguments_one_line_exit_2(tmp_path, capsys, args, message):
    from models.recall.train import main

    code, _, err = run_main(main, ["--out", tmp_path / "ckpt", "--quiet", *args], capsys)
    assert code == 2 and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("command, args", [
    ("models.train", ["--steps", "many"]),
    ("models.train", ["--optimizer", "rmsprop"]),
    ("models.recall.constructions", ["--kind", "attention", "--d-model", "wide"]),
    ("models.recall.constructions", ["--kind", "both"]),
])
def test_bad_flag_value_is_one_error_line(tmp_path, capsys, command, args):
    main = importlib.import_module(command).main
    code, _, err = run_main(main, ["--out", tmp_path / "ckpt", *args], capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_train_refuses_to_overwrite_without_force(tiny_ckpt):
    before = (tiny_ckpt / "model.safetensors").read_bytes()
    proc = run("models.train", "--out", str(tiny_ckpt), "--quiet")
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert (tiny_ckpt / "model.safetensors").read_bytes() == before


@pytest.mark.slow
def test_train_cli_writes_a_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    proc = run("models.train", "--out", str(out), "--quiet", "--lr", "1e-2,3e-3", "--steps", "40")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "factual-recall-ckpt" and len(config["training"]["runs"]) == 2
    assert "kept" in proc.stdout and [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary left behind
    assert config["training"]["stopped_by"] == "step budget at step 40" and "stopped" not in proc.stdout


def test_the_milestone_rule_warns_outside_its_validation_and_says_when_it_stops(tmp_path, capsys):
    from models.recall.config import TrainConfig
    from models.train import main

    out = tmp_path / "ckpt"
    assert main(["--out", str(out), "--quiet", "--steps", "100", "--eval-every", "10", "--lr", "1e-4",
                 "--give-up", "milestones", "--snapshots-per-octave", "0", "--eval-size", "256"]) == 0
    said = capsys.readouterr()
    assert said.err == ("warning: --give-up milestones was validated on runs of 16,384 steps at d <= 64 only "
                        "(docs/capacity.md); at 100 steps it may stop a run that would reach its target\n")
    assert ("stopped   by the milestone rule (--give-up milestones) at step 30 of 100: best held-out accuracy "
            in said.out) and "below 0.8 at 0.25 of the steps" in said.out
    assert json.loads((out / "config.json").read_text())["training"]["stopped_by"] == "milestones at step 30"
    rule = TrainConfig(give_up="milestones", steps=16384)
    assert rule.milestones_warning(64) is None and "at d = 128 it may stop" in rule.milestones_warning(128)
    assert TrainConfig(steps=100).milestones_warning(128) is None  # the rule off: nothing to say


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_constructions_reach_100_percent(tmp_path, kind):
    out = tmp_path / kind
    proc = run("models.recall.constructions", "--kind", kind, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    training = json.loads((out / "config.json").read_text())["training"]
    assert training["final_accuracy"] == 1.0 and training["storage"] == kind
    shape = "d=48 H=4 d_h=4" + (", attention only" if kind == "attention" else " m=32")
    assert f"{shape}; held-out accuracy 1.0000" in proc.stdout and "None" not in proc.stdout


@pytest.mark.slow
def test_constructions_refuse_too_small_models(tmp_path):
    proc = run("models.recall.constructions", "--kind", "attention", "--out", str(tmp_path / "c"), "--d-model", "8")
    assert proc.returncode == 2 and "d_model >= d_vocab" in proc.stderr


def test_locate_facts_bad_arguments(tiny_ckpt, tmp_path, capsys):
    from analyses.locate_facts import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    for args, message in [(["--contexts", "1"], "--contexts must be >= 2"),
                          (["--out", str(blocker / "sub")], f"{blocker} exists and is not a directory"),
                          (["--step", "12345"], "step_00012345.safetensors: missing")]:
        code, _, err = run_main(main, [tiny_ckpt, "--quiet", *args], capsys)
        assert code == 2 and message in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA")
def test_gpu_checks_refuse_a_machine_without_cuda(tmp_path):
    out = tmp_path / "gpu"
    script = Path(__file__).resolve().parents[1] / "bench" / "gpu_checks.py"
    r = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True)
    assert r.returncode != 0
    assert r.stderr.strip() == "bench/gpu_checks.py: this machine has no CUDA device."
    assert not out.exists()
