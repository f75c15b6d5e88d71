"""Training flushes subnormal floats on every thread torch computes with, restores the
threads afterwards, and stays bit-reproducible."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.training.subnormals import flushed, flushing, on_every_thread

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh process with two torch threads, started before training (as earlier work
# in a notebook would start them). The probe is a parallel elementwise op over subnormal
# inputs: each thread flushes its own share of the output to zero or keeps it.
NOTEBOOK = """
import json, torch
torch.set_num_threads(2)

def flushed_share():
    x = torch.full((1 << 20,), 1 << 20, dtype=torch.int32).view(torch.float32)  # subnormal, no float arithmetic
    return (x * 1.0 == 0).float().mean().item()

before = flushed_share()  # starts torch's OpenMP threads
import models.recall.trainer as trainer
from models.recall.config import RunConfig
from models.cli import override
from models.recall.presets import preset
from models.cores.forward import last_position_logits

during, train_step = [], trainer.train_step
def probing_step(*args):
    if len(during) == len(results):
        during.append(flushed_share())
    return train_step(*args)
trainer.train_step = probing_step

base = preset("tiny")
run = RunConfig(base.task, base.model, override(base.train, {"device": "cpu", "steps": 120, "eval_every": 40,
                                                             "target_accuracy": 2.0, "snapshots_per_octave": 0}))
results = []
for _ in range(2):
    results.append(trainer.train(run, progress=False))
a, b = results
held_out = a.task.eval_set(1024, 0, torch.device("cpu"))
with torch.no_grad():
    p = last_position_logits(a.stacked, held_out.tokens[None], "softmax").softmax(-1)
print(json.dumps({"before": before, "during": during, "after": flushed_share(),
                  "labels": [r.training["subnormals"] for r in results],
                  "identical": all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights),
                  "subnormal_probabilities": ((p > 0) & (p < torch.finfo(torch.float32).tiny)).float().mean().item()}))
"""


@pytest.fixture(scope="module")
def notebook_runs():
    # PASSIVE: idle threads sleep instead of spinning (same results; on a loaded machine
    # spinning threads slowed this run by 20x)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run([sys.executable, "-c", NOTEBOOK], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="torch built without OpenMP")
def test_training_flushes_subnormals_on_every_thread_then_restores_them(notebook_runs):
    assert notebook_runs["before"] == 0.0  # subnormals are kept by default
    assert notebook_runs["during"] == [1.0, 1.0]  # both threads, in both runs (0.5: only the caller's)
    assert notebook_runs["after"] == 0.0
    assert notebook_runs["labels"] == ["flushed", "flushed"]


@pytest.mark.slow
def test_flushed_training_is_bit_reproducible(notebook_runs):
    assert notebook_runs["subnormal_probabilities"] > 0  # the trained model is in the regime that matters
    assert notebook_runs["identical"]


def test_flushed_changes_nothing_off_the_cpu_or_when_disabled():
    assert not flushing()
    for device, enabled in ((torch.device("cuda"), True), (torch.device("cpu"), False)):
        with flushed(device, enabled):
            assert on_every_thread(flushing) == [False] * len(on_every_thread(flushing))
    with flushed(torch.device("cpu")):
        assert all(on_every_thread(flushing))
    assert not any(on_every_thread(flushing))
