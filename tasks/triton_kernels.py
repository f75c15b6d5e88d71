"""Triton kernels of the toolkit, imported on first use: compiled for CUDA tensors or, in a
process without a GPU, run by Triton's interpreter on CPU tensors (exact and slow: the tests
pin each kernel to its torch form there). Triton is optional (`pip install -e .[kernels]`)."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch


def _interpret_without_a_gpu() -> None:
    """Have Triton interpret the kernels in a process without a GPU. TRITON_INTERPRET is read
    when Triton is imported, and torch may import it first: a CPU-only torch says so at once
    (this module's import); a CUDA torch is asked at first use (asking before a fork would
    keep the forked processes from CUDA)."""
    if torch.version.cuda is None and torch.version.hip is None or not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


if torch.version.cuda is None and torch.version.hip is None:
    _interpret_without_a_gpu()


@functools.cache
def load(module: str):
    """The kernel module `module` (say "tasks.counter_kernel"), imported once."""
    _interpret_without_a_gpu()
    return importlib.import_module(module)


@functools.cache
def runs_on(device: torch.device) -> bool:
    """Whether Triton kernels run on `device` here: Triton is installed, and compiles for CUDA
    or, in a process without a GPU, interprets on the CPU."""
    if importlib.util.find_spec("triton") is None:
        return False
    _interpret_without_a_gpu()
    import triton

    return device.type == ("cpu" if triton.knobs.runtime.interpret else "cuda")
