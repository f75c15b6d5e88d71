"""A run that cannot fit the device's memory is refused in one line before anything is built or written."""
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from models.cli import override
from models.recall.fits import GIB, available_bytes, check_fits, needed_bytes
from models.recall.presets import PRESETS, preset

CPU = torch.device("cpu")
TINY = preset("tiny")


def _tiny(**fields):
    groups = {"task": TINY.task, "model": TINY.model, "train": TINY.train}
    for group, config in groups.items():
        mine = {k: v for k, v in fields.items() if hasattr(config, k)}
        groups[group] = override(config, mine)
    return replace(TINY, **groups)


@pytest.mark.parametrize("flag, value, part", [
    ("d_model", 1_000_000, "evaluation"), ("n_subjects", 100_000_000, "evaluation"),
    ("batch_size", 100_000_000, "training step")])
def test_sizes_that_cannot_fit_a_24_gib_machine_are_refused_naming_the_largest_part(flag, value, part):
    """The review's three commands, on the review's machine (24 GiB): refused, from the configs alone."""
    with pytest.raises(ValueError, match=rf"^this run needs an estimated [\d.]+ GiB of memory on cpu \({part} "
                                         r"[\d.]+ GiB\), more than the 24.0 GiB available; make it smaller \(--"):
        check_fits(_tiny(**{flag: value}), CPU, available=24 * GIB)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_fits_in_a_gigabyte(name):
    check_fits(preset(name), CPU, available=GIB)


def test_the_estimate_grows_with_each_size():
    base = sum(needed_bytes(TINY).values())
    for flag, value in {"d_model": 128, "d_mlp": 256, "n_heads": 16, "batch_size": 4096, "eval_size": 16384,
                        "n_subjects": 64, "n_noise": 64, "lr": (1e-2, 1e-3)}.items():
        assert sum(needed_bytes(_tiny(**{flag: value})).values()) > base, flag


def test_the_available_memory_is_read_on_a_cpu():
    available = available_bytes(CPU)
    assert available is None or 0 < available < 2 ** 50


TOO_LARGE = [["--eval-size", "1000000000000"], ["--n-subjects", "100000000000"], ["--d-model", "1000000000"],
             ["--batch-size", "1000000000000"]]  # for any machine


@pytest.mark.parametrize("args", TOO_LARGE[1:])
def test_train_refuses_a_run_too_large_for_any_machine_before_writing(tmp_path, capsys, args):
    from models.cli import run_cli
    from models.train import main

    out = tmp_path / "ckpt"
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(["--out", str(out), "--quiet", "--device", "cpu", *args]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: this run needs an estimated "), err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow
def test_the_refusal_is_one_line_and_exit_2_from_the_command(tmp_path):
    out = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, "-m", "models.train", "--out", str(out), "--quiet", "--device", "cpu",
                           *TOO_LARGE[0]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error: this run needs an estimated "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
