from __future__ import annotations

import functools
import importlib.util
import os
import platform
import resource
import signal
import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from models.recall.config import RunConfig

# torch and the toolkit are imported where first used, not here: pytest-xdist's controller loads
# this file before it starts the workers and runs no test (two seconds of CPU before any starts).


@functools.cache
def test_device():
    """The device the parity tests and the trained fixtures compute on: the CPU, or a GPU with
    FACTUAL_RECALL_TEST_DEVICE=cuda (docs/gpu.md). TF32 off, so float32 is float32."""
    import torch

    device = torch.device(os.environ.get("FACTUAL_RECALL_TEST_DEVICE", "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return device


def __getattr__(name: str):
    """TEST_DEVICE (`from tests.conftest import TEST_DEVICE`): test_device()."""
    if name == "TEST_DEVICE":
        return test_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_expected(device: torch.device) -> bool:
    """Whether Triton should run its kernels on `device` here, said without asking
    tasks.triton_kernels: it is installed, and the device is the CPU of a machine without a GPU
    (Triton's interpreter) or the GPU of a machine with one (compiled)."""
    import torch

    return triton_installed() and device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def triton_on(device: torch.device) -> pytest.MarkDecorator:
    """Marks a test of Triton kernels on `device` (see `require_triton`)."""
    import torch

    return pytest.mark.triton(device=torch.device(device))


def require_triton(device: torch.device) -> None:
    """A Triton test on `device` runs where triton_kernels.runs_on says the kernels run. Where
    it says they do not: a failure where they should (triton_expected: set-up installs the
    kernels extra, so a wrong runs_on must not turn every Triton test into a silent skip), and
    where Triton is absent on a platform the extra installs on while CI is set; else a skip
    saying why (no Triton on a developer's machine, a CUDA device the machine lacks)."""
    import torch

    from tasks import triton_kernels

    if triton_kernels.runs_on(device):
        return
    if triton_expected(device):
        pytest.fail(f"Triton is installed but tasks.triton_kernels.runs_on({str(device)!r}) says its kernels do "
                    "not run here: they should (interpreted on a machine without a GPU, compiled on one with)")
    if not triton_installed():
        reason = "needs Triton (pip install -e .[kernels])"
        ci = os.environ.get("CI", "").lower() not in ("", "0", "false")
        if ci and platform.system() == "Linux" and platform.machine() == "x86_64":
            pytest.fail(f"{reason}; CI is set, and set-up installs the kernels extra on this platform")
        pytest.skip(reason)
    pytest.skip(f"Triton runs its kernels on {'the GPU' if torch.cuda.is_available() else 'the CPU'} here, "
                f"not on {device}")


def pytest_configure(config):
    if TIMES:
        config.pluginmanager.register(_Timer(), "factual-recall-test-times")
    config.addinivalue_line("markers", "triton(device): a test of Triton kernels on `device` (tests.conftest."
                                       "require_triton: fails, not skips, where they should run)")


def pytest_collection_modifyitems(config, items):
    """The slow tier's tests first (in their order), so that with two workers the minute-long ones
    start at once instead of ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item):
    for mark in item.iter_markers("triton"):
        require_triton(mark.kwargs["device"])


def as_from_a_terminal() -> None:
    """A child's Ctrl-C as a terminal gives it (a Popen preexec_fn): SIGINT's default action,
    also where the suite itself runs in the background, whose shell starts it with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def quick(run: RunConfig, **train_overrides) -> RunConfig:
    """`run` on TEST_DEVICE, with training fields replaced."""
    from models.cli import override
    from models.recall.config import RunConfig

    return RunConfig(run.task, run.model, override(run.train, {"device": str(test_device()), **train_overrides}))


def run_main(main, argv, capsys) -> tuple[int, str, str]:
    """A command's main run in this process through run_cli, the path its `python -m` takes,
    without the 1-3 s of CPU a new process spends importing torch and TransformerLens: (exit
    code, stdout, stderr). Each command keeps a test through its real entry point, as a process."""
    from models.cli import run_cli

    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main([str(arg) for arg in argv]))
    said = capsys.readouterr()
    return exit_.value.code, said.out, said.err


@pytest.fixture(scope="session")
def tiny_result():
    """The tiny preset trained once for the whole session."""
    from models.recall.presets import preset
    from models.recall.trainer import train

    return train(quick(preset("tiny")), progress=False, preset_name="tiny")


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_result, tmp_path_factory):
    return tiny_result.save(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(autouse=True)
def _seeded():
    import torch

    test_device()  # TF32 off before a test computes on a GPU
    torch.manual_seed(0)


# What each test costs, for scripts/time_suite.sh: with FACTUAL_RECALL_TEST_TIMES=FILE each phase of each
# test (setup, call, teardown) appends a line "nodeid<TAB>phase<TAB>wall s<TAB>CPU s<TAB>children's CPU s":
# the CPU seconds of this process (all its threads) and of the subprocesses that ended in the phase
# (kernels, CLIs, workers, once waited for). A session fixture counts in the setup of its first test.
TIMES = os.environ.get("FACTUAL_RECALL_TEST_TIMES")


def _clocks() -> tuple[float, float, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time(), children.ru_utime + children.ru_stime


def _timed(item, phase: str):
    before = _clocks()
    try:
        return (yield)
    finally:
        spent = [after - start for after, start in zip(_clocks(), before)]
        with open(TIMES, "a") as out:
            out.write(f"{item.nodeid}\t{phase}\t" + "\t".join(f"{s:.3f}" for s in spent) + "\n")


class _Timer:
    """The three phases' hooks, a plugin of their own (pytest_configure registers it) so that
    this module's pytest_runtest_setup (the Triton marks) stays what it is."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        return (yield from _timed(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from _timed(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        return (yield from _timed(item, "teardown"))
