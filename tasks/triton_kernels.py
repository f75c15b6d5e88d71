"""Triton kernels of the toolkit, imported on first use: compiled for CUDA tensors or, in a
process without a GPU, run by Triton's interpreter on CPU tensors (exact and slow: the tests
pin each kernel to its torch form there). Triton is optional (`pip install -e .[kernels]`)."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch

if not torch.cuda.is_available():  # a process without a GPU has Triton interpret the kernels:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when Triton is imported (torch may import it)


@functools.cache
def load(module: str):
    """The kernel module `module` (say "tasks.counter_kernel"), imported once."""
    return importlib.import_module(module)


def runs_on(device: torch.device) -> bool:
    """Whether Triton kernels run on `device` here: Triton is installed, and compiles for CUDA
    or, in a process without a GPU, interprets on the CPU."""
    if importlib.util.find_spec("triton") is None:
        return False
    import triton

    return device.type == ("cpu" if triton.knobs.runtime.interpret else "cuda")
