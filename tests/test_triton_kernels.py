"""Where Triton runs the toolkit's kernels (tasks.triton_kernels.runs_on), and the rule every
Triton test follows (tests.conftest.require_triton): where set-up installed the kernels extra,
a Triton test that cannot run fails instead of skipping."""
import pytest
import torch

import tests.conftest as conftest
from tasks import triton_kernels

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_triton_runs_its_kernels_in_the_interpreter_on_a_machine_without_a_gpu():
    conftest.require_triton(CUDA if torch.cuda.is_available() else CPU)
    import triton

    if torch.cuda.is_available():
        assert triton_kernels.runs_on(CUDA) and not triton_kernels.runs_on(CPU)
    else:  # Triton's interpreter: CPU tensors, never CUDA ones
        assert triton_kernels.runs_on(CPU) and not triton_kernels.runs_on(CUDA)
        assert triton.knobs.runtime.interpret


@pytest.mark.parametrize("installed, ci, outcome", [
    (True, "", pytest.fail.Exception),  # installed: runs_on saying no is the failure
    (False, "true", pytest.fail.Exception),  # CI installs the kernels extra: its absence is the failure
    (False, "", pytest.skip.Exception)])  # a developer's venv without the extra: a skip saying so
def test_a_triton_test_that_cannot_run_fails_where_triton_should_run(monkeypatch, installed, ci, outcome):
    here = CUDA if torch.cuda.is_available() else CPU
    monkeypatch.setattr(triton_kernels, "runs_on", lambda device: False)
    monkeypatch.setattr(conftest, "triton_installed", lambda: installed)
    monkeypatch.setattr(conftest.platform, "system", lambda: "Linux")
    monkeypatch.setattr(conftest.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("CI", ci)
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception)) as raised:
        conftest.require_triton(here)
    assert raised.type is outcome
    assert ("says its kernels do not run here" if installed else "needs Triton") in str(raised.value)


def test_a_triton_test_on_a_device_the_machine_lacks_is_skipped(monkeypatch):
    monkeypatch.setattr(triton_kernels, "runs_on", lambda device: False)
    monkeypatch.setattr(conftest, "triton_installed", lambda: True)
    lacking = CPU if torch.cuda.is_available() else CUDA
    with pytest.raises(pytest.skip.Exception, match=f"not on {lacking}"):
        conftest.require_triton(lacking)
