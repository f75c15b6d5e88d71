"""One diverging model among K is dropped and the others train on, saved and resumable; a run
whose every model diverges stops in one line (models.training.divergence)."""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from models.recall.presets import preset
from models.recall.trainer import _start, train
from models.training.capture_check import check_capturable
from models.training.divergence import TrainingDiverged, drop
from models.training.train_state import complete_steps
from tests.conftest import quick

RUN = dict(steps=40, eval_every=5, target_accuracy=2.0, snapshots_per_octave=2)


def test_a_diverging_model_is_dropped_and_the_healthy_one_trains_as_alone(capsys):
    together = train(quick(preset("tiny"), lr=(1e-2, 1e30), **RUN), progress=False)
    alone = train(quick(preset("tiny"), lr=(1e-2,), **RUN), progress=False)
    (line,) = capsys.readouterr().err.strip().splitlines()
    (dropped,) = together.training["dropped"]
    assert dropped["model"] == 1 and dropped["lr"] == 1e30 and 0 < dropped["step"] < 40
    assert line.startswith(f"step {dropped['step']}: model 1 of 2 (lr=1e+30, seed=0) has a non-finite ")
    assert line.endswith("; dropped it, 1 of 2 models train on.")
    assert together.training["lr"] == 1e-2 and together.training["steps_run"] == 40
    for key, value in alone.weights.items():  # equal up to the summation order of batched matmuls
        torch.testing.assert_close(together.weights[key], value, rtol=1e-4, atol=1e-5)
    for row in together.metrics:
        assert (row["models"][1]["accuracy"] is None) == (row["step"] >= dropped["step"])
        assert abs(row["models"][0]["loss"] - next(r for r in alone.metrics if r["step"] == row["step"])["loss"]) < 1e-4
    assert together.training["runs"][1] == {"lr": 1e30, "seed": 0, "loss": None, "accuracy": None}
    assert all(torch.isfinite(t).all() for snap in together.snapshots.values() for t in snap.values())


def test_every_model_diverging_stops_the_run_in_one_line():
    with pytest.raises(TrainingDiverged, match=r"^step \d+: model 0 of 2 \(lr=1e\+30, seed=0\) has a non-finite "
                                               r"(loss|weight [\w.]+); training stopped, the last good snapshot is "
                                               r"step \d+\.$"):
        train(quick(preset("tiny"), lr=(1e30, 1e31), **RUN), progress=False)


@pytest.mark.parametrize("cut", ["before the drop", "after the drop"])
def test_a_run_with_a_dropped_model_resumes_to_the_uninterrupted_result(tmp_path, capsys, cut):
    run = quick(preset("tiny"), lr=(1e-2, 1e30), **RUN)
    full = train(run, progress=False, state_folder=tmp_path / "full")
    when = full.training["dropped"][0]["step"]
    states = [s for s in complete_steps(tmp_path / "full") if (s < when) == (cut == "before the drop")]
    last = states[-1] if cut == "before the drop" else states[0]
    (tmp_path / "cut").mkdir()
    for step in complete_steps(tmp_path / "full"):
        if step <= last:
            for suffix in (".safetensors", ".json"):
                shutil.copy(tmp_path / "full" / f"step_{step:08d}{suffix}", tmp_path / "cut")
    saved = json.loads((tmp_path / "cut" / f"step_{last:08d}.json").read_text())["dropped"]
    assert [d["model"] for d in saved] == ([] if cut == "before the drop" else [1])
    restored = _start(run, torch.device("cpu"), tmp_path / "cut").optimizer.rates
    expected = torch.tensor([1e-2, 1e30 if cut == "before the drop" else 0.0])  # a dropped model stays stopped
    assert torch.equal(restored, expected)
    resumed = train(run, progress=False, state_folder=tmp_path / "cut")
    assert resumed.training["dropped"] == full.training["dropped"]
    for key in full.stacked:
        assert torch.equal(full.stacked[key], resumed.stacked[key]), key
    assert [r["models"] for r in full.metrics] == [r["models"] for r in resumed.metrics]


@pytest.mark.slow
def test_the_command_keeps_the_healthy_model_and_records_the_dropped_one(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "models.train", "--out", str(out), "--quiet", "--device", "cpu",
                           "--lr", "0.01,1e30", "--steps", "20", "--eval-every", "5"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "dropped it, 1 of 2 models train on" in proc.stderr
    training = json.loads((out / "config.json").read_text())["training"]
    assert training["lr"] == 0.01 and [d["lr"] for d in training["dropped"]] == [1e30]
    assert "lr=1e+30 seed=0: dropped at step" in proc.stdout and "kept      lr=0.01" in proc.stdout


def test_a_step_after_a_drop_is_still_capturable():
    """Dropping is in place, between steps: the captured tensors stay the same objects and the
    step's work does not change."""
    state = _start(quick(preset("tiny"), lr=(1e-2, 3e-3), batch_size=64, eval_size=64, sampler="counter"),
                   torch.device("meta"), None)
    bound = [*state.params.values(), state.optimizer.rates, *state.optimizer.m.values(), *state.optimizer.v.values()]
    check_capturable(state.step_once.step)
    drop(1, state.params, state.optimizer)
    check_capturable(state.step_once.step)
    now = [*state.params.values(), state.optimizer.rates, *state.optimizer.m.values(), *state.optimizer.v.values()]
    assert all(a is b for a, b in zip(bound, now, strict=True))


def test_a_capacity_probe_row_reads_a_dropped_model_as_null():
    from analyses.capacity.transformer import probe_row

    run = quick(preset("tiny"), lr=(1e-2, 1e30), steps=20, eval_every=5, target_accuracy=2.0)
    result = train(run, progress=False)
    row = probe_row((1.0, 2.0, 4), 32, 16, run, result)
    healthy, dropped = row["runs"]
    assert dropped["final_accuracy"] is None and dropped["curve"]["accuracy"][-1] is None
    assert round(dropped["best_accuracy"], 5) == max(a for a in dropped["curve"]["accuracy"] if a is not None)
    assert row["best_accuracy"] == healthy["best_accuracy"] and row["lr"] == 1e-2
    json.dumps(row)  # null, not NaN: the row is valid JSON
