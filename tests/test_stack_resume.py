"""A shape stack cut in the middle of its training (a kill, or a stop injected at a step)
resumes from the last state it saved and ends bit-identical to the stack that was never cut:
every weight, every snapshot, every metric but the clock."""
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import torch

from models.checkpoint import complete_steps
from models.recall import shape_trainer
from models.recall.config import ModelConfig, RunConfig, TrainConfig
from models.recall.shape_trainer import train_shapes, train_stacks
from models.training.graphed import Step
from tests.conftest import TEST_DEVICE

ROOT = Path(__file__).resolve().parents[1]


def runs() -> list[RunConfig]:
    """Three shapes: an lr sweep with snapshots, another seed, and one that stops at step 12."""
    train = TrainConfig(batch_size=64, steps=30, eval_every=6, eval_size=128, device=str(TEST_DEVICE))
    return [RunConfig(model=ModelConfig(n_heads=4, d_head=8, d_mlp=64), train=replace(train, lr=(1e-2, 3e-3))),
            RunConfig(model=ModelConfig(n_heads=2, d_head=4, d_mlp=32),
                      train=replace(train, seed=(1,), snapshots_per_octave=0)),
            RunConfig(model=ModelConfig(n_heads=1, d_head=6, d_mlp=16), train=replace(train, steps=12, eval_every=4))]


@pytest.fixture(scope="module")
def uncut():
    return train_shapes(runs(), progress=False)


def assert_identical(resumed, uncut):
    """Two stacks' results equal bit for bit (the seconds aside)."""
    for mine, theirs in zip(resumed, uncut, strict=True):
        assert mine.training["steps_run"] == theirs.training["steps_run"]
        for key, value in theirs.stacked.items():
            assert torch.equal(mine.stacked[key], value), key
        assert mine.snapshots.keys() == theirs.snapshots.keys()
        for step, snapshot in theirs.snapshots.items():
            assert all(torch.equal(mine.snapshots[step][k], t) for k, t in snapshot.items()), step
        drop = [{k: v for k, v in row.items() if k != "seconds"} for row in theirs.metrics]
        assert [{k: v for k, v in row.items() if k != "seconds"} for row in mine.metrics] == drop


class _Killed(Exception):
    pass


def _cut_at(step: int):
    """A Step that raises (as a kill would end the process) when asked for step `step`."""
    class Cut(Step):
        def __call__(self):
            if self.calls == step:
                raise _Killed
            return super().__call__()
    return Cut


def test_a_stack_stopped_mid_training_resumes_bit_identical(tmp_path, uncut):
    with mock.patch.object(shape_trainer, "Step", _cut_at(21)), pytest.raises(_Killed):
        train_shapes(runs(), progress=False, state_folder=tmp_path, save_every=0)
    assert complete_steps(tmp_path) == [18]  # the evaluation before the cut; older states deleted
    resumed = train_shapes(runs(), progress=False, state_folder=tmp_path, save_every=0)
    assert_identical(resumed, uncut)
    assert uncut[2].training["steps_run"] == 12 and uncut[0].snapshots  # a stopped run and snapshots restored
    assert complete_steps(tmp_path) == [30]  # the end is saved too: a kill after it retrains nothing
    with mock.patch.object(shape_trainer, "Step", _cut_at(0)):  # not one step more
        again = train_shapes(runs(), progress=False, state_folder=tmp_path)
    assert_identical(again, uncut)


def test_a_state_of_another_stack_is_set_aside(tmp_path, uncut):
    with mock.patch.object(shape_trainer, "Step", _cut_at(7)), pytest.raises(_Killed):
        train_shapes(runs()[:2], progress=False, state_folder=tmp_path, save_every=0)
    assert complete_steps(tmp_path) == [6]
    assert_identical(train_shapes(runs(), progress=False, state_folder=tmp_path, save_every=0), uncut)


KILLED = """
import sys, time, torch
from models.recall import stack_state
from models.recall.shape_trainer import train_stacks
from tests.test_stack_resume import runs
torch.set_num_threads({threads})
save = stack_state.save
def save_then_wait(folder, state):  # the kill lands after the state of step 12, mid-training
    save(folder, state)
    if state.step >= 12:
        print("saved", state.step, flush=True)
        time.sleep(600)
stack_state.save = save_then_wait
train_stacks(runs(), progress=False, state_folder=sys.argv[1], save_every=0)
"""


@pytest.mark.slow
def test_a_stack_killed_by_sigkill_resumes_bit_identical(tmp_path, uncut):
    script = textwrap.dedent(KILLED).format(threads=torch.get_num_threads())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = child.stdout.readline()
        assert line.startswith("saved"), child.stderr.read()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    folder = tmp_path / "stack0"
    assert complete_steps(folder) == [int(line.split()[1])]
    assert_identical(train_stacks(runs(), progress=False, state_folder=tmp_path), uncut)
