import os
import resource
import time

import pytest
import torch

from models.cli import override
from models.recall.config import RunConfig
from models.recall.presets import preset
from models.recall.trainer import train

# The device the parity tests and the trained fixtures compute on: the CPU, or a GPU with
# FACTUAL_RECALL_TEST_DEVICE=cuda (docs/gpu.md). TF32 off, so float32 is float32.
TEST_DEVICE = torch.device(os.environ.get("FACTUAL_RECALL_TEST_DEVICE", "cpu"))
if TEST_DEVICE.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def quick(run: RunConfig, **train_overrides) -> RunConfig:
    """`run` on TEST_DEVICE, with training fields replaced."""
    return RunConfig(run.task, run.model, override(run.train, {"device": str(TEST_DEVICE), **train_overrides}))


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
    return train(quick(preset("tiny")), progress=False, preset_name="tiny")


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_result, tmp_path_factory):
    return tiny_result.save(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(autouse=True)
def _seeded():
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


if TIMES:
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(item):
        return (yield from _timed(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item):
        return (yield from _timed(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(item, nextitem):
        return (yield from _timed(item, "teardown"))
