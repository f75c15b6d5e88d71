"""Where Triton runs the toolkit's kernels (tasks.triton_kernels.runs_on), and the rule every
Triton test follows (tests.conftest.require_triton): where set-up installed the kernels extra,
a Triton test that cannot run fails instead of skipping."""
import importlib
import os

import pytest
import torch

import tests.conftest as conftest
from tasks import triton_kernels

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
FIND_SPEC = importlib.util.find_spec


def test_triton_runs_its_kernels_in_the_interpreter_on_a_machine_without_a_gpu():
    conftest.require_triton(CUDA if torch.cuda.is_available() else CPU)
    import triton

    for runs_on in (triton_kernels.runs_on, triton_kernels.runs_on.__wrapped__):  # cached, and computed now
        if torch.cuda.is_available():
            assert runs_on(CUDA) and not runs_on(CPU)
        else:  # Triton's interpreter: CPU tensors, never CUDA ones
            assert runs_on(CPU) and not runs_on(CUDA)
            assert triton.knobs.runtime.interpret
    assert triton_kernels.load.__wrapped__("tasks.counter_kernel") is importlib.import_module("tasks.counter_kernel")


def test_without_triton_no_kernel_runs(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else FIND_SPEC(name, *a))
    assert not triton_kernels.runs_on.__wrapped__(CPU) and not triton_kernels.runs_on.__wrapped__(CUDA)


def test_the_interpreter_is_asked_for_on_a_machine_without_a_gpu_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    triton_kernels._interpret_without_a_gpu()
    assert os.environ.get("TRITON_INTERPRET") == (None if torch.cuda.is_available() else "1")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    triton_kernels._interpret_without_a_gpu()
    assert os.environ["TRITON_INTERPRET"] == "0"


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


@pytest.mark.parametrize("cuda, hip, gpu, interpret", [(None, None, False, True),  # a CPU torch
                                                      ("12.4", None, False, True),  # a CUDA torch, no GPU here
                                                      ("12.4", None, True, False),  # a CUDA torch on a GPU: compiled
                                                      (None, "6.2", True, False)])  # a ROCm torch on a GPU
def test_the_interpreter_is_asked_for_by_every_torch_build_without_a_gpu(monkeypatch, cuda, hip, gpu, interpret):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    triton_kernels._interpret_without_a_gpu()
    assert os.environ.get("TRITON_INTERPRET") == ("1" if interpret else None)


KERNEL_MODULES = ("models.training.adam_kernel", "models.cores.fused_kernels", "tasks.counter_kernel")


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_a_compiled_launch_binds_each_argument_of_every_kernel_to_itself(module):
    """A compiled launch (CUDA) first binds the arguments in a function Triton generates, whose own
    locals (`params`, `specialization`, `options`) a kernel argument of the same name would shadow:
    the launch then fails on the GPU only, the interpreter never binding. Built here as on CUDA."""
    conftest.require_triton(CUDA if torch.cuda.is_available() else CPU)
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    kernels = [k for k in vars(triton_kernels.load(module)).values() if hasattr(k, "fn") or isinstance(k, JITFunction)]
    assert kernels
    for kernel in kernels:
        jit = JITFunction(kernel.fn) if not isinstance(kernel, JITFunction) else kernel
        bind = create_function_from_signature(jit.signature, jit.params, BaseBackend)
        args = {p.name: 16 if p.is_constexpr else torch.zeros(2) for p in jit.params}  # [2] stands for any tensor
        bound, _, options = bind(**args, enable_fp_fusion=False)
        assert list(bound) == list(args) and all(bound[name] is arg for name, arg in args.items()), kernel.fn.__name__
        assert options == {"enable_fp_fusion": False}
