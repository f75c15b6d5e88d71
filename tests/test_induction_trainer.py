"""The induction trainer: SGD with momentum and weight decay and AdamW equal torch.optim's, each
model of a stack trains as it would alone, frozen weights stay, a run resumes bit-identically, the
CPU preset learns the induction head, and the CLI refuses bad input in one line."""
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from models.cli import run_cli
from models.induction import train as train_cli
from models.induction.config import InductionModelConfig, InductionTaskConfig, InductionTrainConfig
from models.induction.trainer import train
from models.training.optimizer import Optimizer

TASK = InductionTaskConfig(n_triggers=2, seq_len=16)
MODEL = InductionModelConfig(d_model=16)
TRAIN = InductionTrainConfig(lr=(0.1,), batch_size=8, steps=6, eval_every=3, eval_size=8, device="cpu")


@pytest.mark.parametrize("kind, reference", [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("adam", lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.01)),
])
def test_the_optimizer_is_torchs(kind, reference):
    torch.manual_seed(0)
    start = torch.randn(3, 4)
    ours = start.clone().requires_grad_()
    theirs = start.clone().requires_grad_()
    opt = Optimizer({"w": ours}, torch.tensor([0.1]), kind, 0.9 if kind == "sgd" else 0.0, 0.01)
    ref = reference([theirs])
    for step in range(5):
        target = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
        for w in (ours, theirs):
            ((w - target) ** 2 * (1 + w)).sum().backward()
        opt.step()
        ref.step()
        ref.zero_grad()
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_each_model_of_a_stack_trains_as_it_would_alone():
    together = train(TASK, MODEL, replace(TRAIN, lr=(0.1, 0.05), seed=(0, 1)), progress=False)
    alone = train(TASK, MODEL, replace(TRAIN, lr=(0.05,), seed=(1,)), progress=False)[0]
    assert [r.training["lr"] for r in together] == [0.1, 0.1, 0.05, 0.05]
    for key, value in alone.weights.items():
        assert torch.allclose(together[3].weights[key], value, atol=1e-6), key


def test_frozen_weights_stay_and_trained_ones_move():
    result = train(TASK, MODEL, replace(TRAIN, frozen=("blocks.0.attn.W_K",), snapshot_every=3), progress=False)[0]
    first, last = result.snapshots[0], result.weights
    assert sorted(result.snapshots) == [0, 3, 6]
    for key in ("blocks.0.attn.W_K", "blocks.0.attn.W_V", "blocks.0.attn.W_O", "embed.W_E", "unembed.W_U"):
        assert torch.equal(first[key], last[key]), key
    for key in ("blocks.1.attn.W_K", "blocks.1.attn.W_O"):
        assert not torch.equal(first[key], last[key]), key


def test_a_run_resumes_bit_identically(tmp_path):
    cfg = replace(TRAIN, steps=6, eval_every=2, snapshot_every=2)
    whole = train(TASK, MODEL, cfg, progress=False)[0]
    train(TASK, MODEL, replace(cfg, steps=4), progress=False, state_folder=tmp_path)  # killed after step 4
    resumed = train(TASK, MODEL, cfg, progress=False, state_folder=tmp_path)[0]
    for key, value in whole.weights.items():
        assert torch.equal(resumed.weights[key], value), key
    assert sorted(resumed.snapshots) == [0, 2, 4, 6]
    assert [r["step"] for r in resumed.metrics] == [0, 2, 4, 6]


def test_the_cpu_preset_learns_the_induction_head_with_two_layers():
    """A shortened `cpu` preset: in-context accuracy far above chance (1/65) within 150 steps (0.62 at seed 0)."""
    from models.induction.config import preset

    task, model, cfg = preset("cpu")
    result = train(task, model, replace(cfg, steps=150, eval_every=150, device="cpu"), progress=False)[0]
    assert result.training["final_in_context_accuracy"] > 0.4


@pytest.mark.parametrize("flags, message", [
    (["--n-triggers", "70"], "n_triggers must be an integer in 1..65"),
    (["--seq-len", "1"], "seq_len T must be an integer >= 2"),
    (["--text", "moby"], "unknown text 'moby'"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--architecture", "generic", "--n-layers", "3"], "n_layers must be 1 or 2"),
    (["--lr", "0"], "every lr must be > 0"),
])
def test_the_cli_refuses_bad_input_in_one_line(flags, message, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: train_cli.main(["--out", str(out), *flags]))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err
    assert err.count("\n") == 1 and not out.exists()


@pytest.mark.slow
def test_the_cli_refuses_in_one_line_as_a_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "models.induction.train", "--out", str(tmp_path / "o"),
                           "--seq-len", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == "error: seq_len T must be an integer >= 2, got 1.\n"


def test_the_cli_trains_writes_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--n-triggers", "2", "--seq-len", "8", "--d-model", "8", "--batch-size", "4", "--steps", "4",
             "--eval-every", "2", "--eval-size", "4", "--device", "cpu", "--quiet", "--out", str(out)]
    assert train_cli.main(flags) == 0
    assert (out / "config.json").is_file() and (out / "train_state").is_dir()
    assert "in-context accuracy" in capsys.readouterr().out
    assert train_cli.main(["--resume", str(out), "--quiet"]) == 0  # already finished: written again, same
    with pytest.raises(ValueError, match="no run.json there"):
        train_cli.main(["--resume", str(tmp_path)])


def test_an_interrupted_run_names_its_own_resume_command(tmp_path):
    from models import load
    from models.checkpoint import CheckpointError

    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text('{"preset": "cpu", "task": {}, "model": {"architecture": "simplified"}}')
    with pytest.raises(CheckpointError, match="python -m models.induction.train --resume"):
        load(out)
