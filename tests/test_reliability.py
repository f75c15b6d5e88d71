"""Checkpoints a user can trust: resume, SIGKILL at random moments, divergence, pickles."""
import contextlib
import json
import os
import pickle
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from analyses import locate_facts
from models import load, load_checkpoint
from models.checkpoint import CheckpointError
from models.recall.presets import preset
from models.recall.trainer import train
from models.training.train_state import complete_steps, load_state
from tests.conftest import as_from_a_terminal, quick

DENSE = ["--steps", "600", "--target-accuracy", "2", "--snapshots-per-octave", "8", "--eval-every", "10", "--quiet"]


def cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "models.train", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("sampler", ["generator", "counter"])
def test_resume_from_a_middle_state_equals_the_uninterrupted_run(tmp_path, sampler):
    run = quick(preset("tiny"), steps=120, target_accuracy=2.0, snapshots_per_octave=4, lr=(1e-2, 3e-3), batch_size=256,
                seed=(0, 1), sampler=sampler)
    full = train(run, progress=False, state_folder=tmp_path / "full")
    steps = complete_steps(tmp_path / "full")
    cut = steps[len(steps) // 2]
    (tmp_path / "cut").mkdir()
    for step in steps[: len(steps) // 2 + 1]:  # as if killed right after the state of `cut`
        for suffix in (".safetensors", ".json"):
            shutil.copy(tmp_path / "full" / f"step_{step:08d}{suffix}", tmp_path / "cut")
    resumed = train(run, progress=False, state_folder=tmp_path / "cut")
    assert 0 < cut < 120
    for key in full.weights:
        assert torch.equal(full.stacked[key], resumed.stacked[key]), key
    assert [r["models"] for r in full.metrics] == [r["models"] for r in resumed.metrics]
    assert sorted(full.snapshots) == sorted(resumed.snapshots)
    other = "generator" if sampler == "counter" else "counter"
    with pytest.raises(CheckpointError, match=f"saved by the '{sampler}' sampler, not '{other}'"):
        train(quick(run, sampler=other), progress=False, state_folder=tmp_path / "cut")


def test_a_resumed_run_reports_what_it_ran_and_the_run_s_totals(tmp_path, capsys):
    """`--resume` of a run cut at step k says it trained the steps from k on, in this call's
    seconds, and gives the run's totals beside them."""
    import re

    from models.train import main

    full = tmp_path / "full"
    assert main(["--out", str(full), "--steps", "120", "--target-accuracy", "2", "--snapshots-per-octave", "4",
                 "--eval-every", "10", "--quiet", "--device", "cpu"]) == 0
    first = capsys.readouterr().out
    assert re.search(r"trained   1 model for 120 steps in [0-9.]+ s on cpu\n", first), first
    steps = complete_steps(full / "train_state")
    cut = steps[len(steps) // 2]
    (tmp_path / "cut" / "train_state").mkdir(parents=True)
    shutil.copy(full / "run.json", tmp_path / "cut")
    for step in steps[: len(steps) // 2 + 1]:  # as if killed right after the state of `cut`
        for suffix in (".safetensors", ".json"):
            shutil.copy(full / "train_state" / f"step_{step:08d}{suffix}", tmp_path / "cut" / "train_state")
    assert main(["--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    line = re.search(r"trained   1 model for (\d+) steps \((\d+) to 120\) in ([0-9.]+) s; the run: 120 steps in "
                     r"([0-9.]+) s on cpu\n", capsys.readouterr().out)
    assert line and (int(line[1]), int(line[2])) == (120 - cut, cut) and 0 < cut < 120
    saved = json.loads((full / "train_state" / f"step_{cut:08d}.json").read_text())
    assert float(line[4]) >= float(line[3]) + saved["metrics"][-1]["seconds"] - 0.1  # earlier seconds included


def _check_readable(ckpt: Path) -> None:
    """Every named (non-temporary) file is whole, the last complete state loads."""
    for path in list((ckpt / "train_state").glob("step_*")) + list((ckpt / "snapshots").glob("step_*")):
        if path.suffix == ".json":
            json.loads(path.read_text())
        else:
            load_file(str(path))
    steps = complete_steps(ckpt / "train_state")
    if steps:
        load_state(ckpt / "train_state", steps[-1])
    if (ckpt / "config.json").exists():
        load_checkpoint(ckpt)


# A process that imports the trainer once, then runs each command it is sent (a line of JSON: the
# arguments and a file for stderr) in a process forked from it, that command's own: it says the
# child's pid, then its exit code (minus the signal's number when a signal ended it).
FORK_SERVER = """
import json, os, sys
from models.cli import run_cli
from models.recall.train import main
for line in sys.stdin:
    argv, stderr = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        try:
            run_cli(lambda: main(argv))
        except SystemExit as done:
            os._exit(done.code or 0)
        os._exit(1)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class Forked:
    """`python -m models.train ARGS` run by the fork server: a process of its own, without the
    second or two a new process spends importing torch and the trainer."""

    def __init__(self, server: subprocess.Popen, argv: list[str], stderr: Path):
        self.server = server  # unbuffered: select sees every line not yet read
        server.stdin.write((json.dumps([argv, str(stderr)]) + "\n").encode())
        self.pid, self.returncode = int(server.stdout.readline()), None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.server.stdout], [], [], 0)[0]:
            self.returncode = int(self.server.stdout.readline())
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended this instant
                os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = int(self.server.stdout.readline())
        return self.returncode


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path):
    """SIGKILL at 20 random moments of the training runs (each run a process forked from one
    that has imported the trainer, so every moment falls in the run itself, not in the imports),
    resumed each time: every named file is whole, and the resumed run ends with the weights and
    metrics of an uninterrupted one."""
    server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              bufsize=0)
    try:
        _sigkill_then_resume(tmp_path, lambda argv: Forked(server, argv, tmp_path / "stderr.txt"))
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def _sigkill_then_resume(tmp_path: Path, cli) -> None:
    reference = tmp_path / "reference"
    assert cli(["--out", str(reference), *DENSE]).wait() == 0
    ckpt = tmp_path / "killed"
    rng = random.Random(0)
    kills = 0
    def start():  # a run killed before it wrote run.json has nothing to resume: it starts over
        resumable = (ckpt / "run.json").exists()
        return cli(["--resume", str(ckpt)] if resumable else ["--out", str(ckpt), "--force", *DENSE])

    while kills < 20:
        proc = start()
        time.sleep(rng.uniform(0.05, 1.5))
        proc.kill()
        if proc.wait() != -signal.SIGKILL:  # it finished before the kill: start over
            assert proc.returncode == 0, (tmp_path / "stderr.txt").read_text()
            shutil.rmtree(ckpt)
            continue
        kills += 1
        _check_readable(ckpt)
    proc = start()
    assert proc.wait() == 0, (tmp_path / "stderr.txt").read_text()
    a, b = load_checkpoint(reference), load_checkpoint(ckpt)
    for key in a.weights:
        assert torch.equal(a.weights[key], b.weights[key]), key
    assert (ckpt / "metrics.jsonl").read_text().count("\n") == (reference / "metrics.jsonl").read_text().count("\n")


@pytest.mark.slow
def test_ctrl_c_names_the_saved_step_and_the_resume_command(tmp_path):
    ckpt = tmp_path / "run"
    proc = cli("--out", str(ckpt), *DENSE[2:], "--steps", "200", preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 120
    while not complete_steps(ckpt / "train_state") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait() == 130
    message = proc.stderr.read().strip()
    saved = complete_steps(ckpt / "train_state")[-1]
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert f"saved at step {saved}" in message and f"`python -m models.train --resume {ckpt}`" in message
    assert cli("--resume", str(ckpt)).wait() == 0 and (ckpt / "config.json").is_file()


def test_resume_refuses_every_other_setting(tmp_path, capsys):
    from models.cli import run_cli
    from models.recall.train import main

    for flags in (["--preset", "paper-tradeoff"], ["--lr", "0.1"], ["--out", str(tmp_path / "x")]):
        with pytest.raises(SystemExit) as exit_:
            run_cli(lambda flags=flags: main(["--resume", str(tmp_path), *flags]))
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"drop {flags[0]}" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_divergence_of_every_model_stops_naming_step_and_model(tmp_path):
    out = tmp_path / "nan"
    proc = subprocess.run([sys.executable, "-m", "models.train", "--out", str(out), "--quiet", "--optimizer", "sgd",
                           "--lr", "1e30,1e31", "--steps", "200"], capture_output=True, text=True)
    assert proc.returncode != 0
    message = proc.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert "step " in message and "model 0 of 2 (lr=1e+30" in message and "non-finite" in message
    last = complete_steps(out / "train_state")[-1]
    assert f"last good snapshot is step {last}" in message
    tensors, _ = load_state(out / "train_state", last)
    assert all(torch.isfinite(t).all() for k, t in tensors.items() if k.startswith("weights."))


MALICIOUS = b"cos\nsystem\n(S'touch {marker}'\ntR."  # a pickle that runs a shell command when loaded


@pytest.mark.slow
def test_malicious_pickle_in_checkpoint_is_never_executed(tiny_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    marker = tmp_path / "pwned"
    payload = MALICIOUS.replace(b"{marker}", str(marker).encode())
    for name in ("model.pt", "model.pkl", "optimizer.pth"):
        (ckpt / name).write_bytes(payload)
    load(ckpt, device="cpu")
    assert locate_facts.main([str(ckpt), "--contexts", "2", "--patch-contexts", "1", "--quiet",
                              "--out", str(tmp_path / "out")]) == 0
    with pytest.raises(CheckpointError, match="a pickle file, which is never loaded"):
        load(ckpt / "model.pt")
    proc = subprocess.run([sys.executable, "-m", "analyses.locate_facts", str(ckpt / "model.pkl")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "never loaded" in proc.stderr
    assert not marker.exists()
    pickle.loads(payload)  # the test of the test: this payload does run when unpickled
    assert marker.exists()


def _interrupted(tmp_path: Path, sampler: str) -> tuple[Path, Path]:
    """A finished CPU run of `models.train` (`full`) and a copy of it cut after its middle
    training state, as a kill would leave it (`cut`: run.json and the states up to there)."""
    from models.recall.train import main

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["--out", str(full), "--steps", "48", "--target-accuracy", "2", "--snapshots-per-octave", "2",
                 "--eval-every", "8", "--sampler", sampler, "--device", "cpu", "--quiet"]) == 0
    steps = complete_steps(full / "train_state")
    (cut / "train_state").mkdir(parents=True)
    shutil.copy(full / "run.json", cut)
    for step in steps[: len(steps) // 2 + 1]:
        for suffix in (".safetensors", ".json"):
            shutil.copy(full / "train_state" / f"step_{step:08d}{suffix}", cut / "train_state")
    assert 0 < steps[len(steps) // 2] < 48
    return full, cut


def _recorded_on(cut: Path, device: str) -> None:
    """Make `cut` read as a run started on `device` (the CPU cannot start one on CUDA): its
    run.json's device and its states' devices."""
    run = json.loads((cut / "run.json").read_text())
    run["train"]["device"] = device
    (cut / "run.json").write_text(json.dumps(run))
    for state in (cut / "train_state").glob("step_*.json"):
        state.write_text(json.dumps({**json.loads(state.read_text()), "device": f"{device}:0"}))


def test_a_counter_run_started_on_cuda_resumes_on_the_cpu_bit_identical(tmp_path):
    """With the counter sampler the batches are a function of the step alone, on any device:
    a run recorded on CUDA, resumed with --device cpu, ends with the uninterrupted run's weights."""
    from models.recall.train import main

    full, cut = _interrupted(tmp_path, "counter")
    _recorded_on(cut, "cuda")
    assert main(["--resume", str(cut), "--device", "cpu", "--quiet"]) == 0
    resumed, uninterrupted = load_file(str(cut / "model.safetensors")), load_file(str(full / "model.safetensors"))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)
    assert json.loads((cut / "run.json").read_text())["train"]["device"] == "cuda"  # where it started


def test_a_generator_run_refuses_to_move_to_another_kind_of_device(tmp_path, capsys):
    """A torch.Generator's state is its device's (CUDA's Philox state is 16 bytes): the run is
    refused in one line naming both devices, and nothing is written."""
    from models.cli import run_cli
    from models.recall.train import main

    _, cut = _interrupted(tmp_path, "generator")
    _recorded_on(cut, "cuda")
    for state in (cut / "train_state").glob("step_*.safetensors"):
        tensors = load_file(str(state))
        tensors.update({k: torch.zeros(16, dtype=torch.uint8) for k in tensors if k.startswith("rng.")})
        save_file(tensors, str(state))
    before = sorted(p.name for p in cut.rglob("*"))
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(["--resume", str(cut), "--device", "cpu", "--quiet"]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "saved on cuda:0 by the generator sampler" in err and "cannot move to cpu" in err
    assert sorted(p.name for p in cut.rglob("*")) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="moves a run onto a CUDA GPU")
def test_a_counter_run_moves_from_the_cpu_to_cuda_and_back(tmp_path):
    """CPU -> CUDA -> CPU: each leg resumes from the last state of the one before and
    records where it ran; the curve up to the cut is the CPU's, and the run ends where the
    uninterrupted one does (CUDA's arithmetic is not the CPU's: close, not bit-identical)."""
    from models.recall.train import main

    def metrics(ckpt: Path) -> list[dict]:
        return [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]

    full, cut = _interrupted(tmp_path, "counter")
    states = complete_steps(cut / "train_state")
    assert main(["--resume", str(cut), "--device", "cuda", "--quiet"]) == 0
    assert json.loads((cut / "config.json").read_text())["training"]["device"].startswith("cuda")
    saved = complete_steps(cut / "train_state")
    assert json.loads((cut / "train_state" / f"step_{saved[-1]:08d}.json").read_text())["device"].startswith("cuda")
    before = [r for r in metrics(full) if r["step"] <= states[-1]]
    assert [r["models"] for r in metrics(cut)[:len(before)]] == [r["models"] for r in before]
    back = tmp_path / "back"
    (back / "train_state").mkdir(parents=True)
    shutil.copy(cut / "run.json", back)
    for step in saved[:-1]:  # cut before CUDA's last state: the CPU finishes the run
        for suffix in (".safetensors", ".json"):
            shutil.copy(cut / "train_state" / f"step_{step:08d}{suffix}", back / "train_state")
    assert main(["--resume", str(back), "--device", "cpu", "--quiet"]) == 0
    for ckpt in (cut, back):
        training = json.loads((ckpt / "config.json").read_text())["training"]
        uninterrupted = json.loads((full / "config.json").read_text())["training"]
        assert training["final_loss"] == pytest.approx(uninterrupted["final_loss"], rel=0.2, abs=0.05)
