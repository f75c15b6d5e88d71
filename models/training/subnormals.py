"""Flush subnormal floats to zero on every CPU thread torch computes with, while training.

As a model learns, its answer probabilities and attention weights fall below float32's
smallest normal number (2^-126, about 1.2e-38): at step 8000 of a paper-tradeoff run, 12%
of the answer probabilities, 0.15% of the attention weights and 1.5% of their gradients.
Exponentials with such results take a slow path on a CPU (the cross-entropy's log-softmax,
forward and backward, about twice as long on this 2-core AMD EPYC), so a trainer slows
down as it trains (bench/train_throughput.py, trained weights). The CPU's flush-to-zero
and denormals-are-zero modes (FTZ and DAZ, set by `torch.set_flush_denormal`) replace such
numbers by zero at full speed; a value below 1.2e-38 vanishes in any sum with a normal
float32 number, so training changes little if at all (bench/subnormal_seeds.py).

FTZ and DAZ are bits of each thread's own control register (MXCSR on x86), and
`torch.set_flush_denormal` sets them on the calling thread only. A thread starts with its
creator's bits, so OpenMP workers that torch started before the call keep computing with
subnormals. `flushed` therefore also sets them inside one OpenMP parallel region, on every
thread of the team torch's parallel operations use, and puts them back on exit.
On a GPU it does nothing (the CPU's mode does not reach CUDA kernels).
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_SMALLEST_SUBNORMAL = struct.unpack("<d", struct.pack("<Q", 1))[0]  # 5e-324, made without float arithmetic


def flushing() -> bool:
    """Whether the calling thread flushes subnormals (denormals-are-zero is on)."""
    return _SMALLEST_SUBNORMAL * 1.0 == 0.0


def _openmp_parallel():
    """OpenMP's GOMP_parallel as torch binds it (the process's global symbol), or None."""
    try:
        gomp_parallel = ctypes.CDLL(None).GOMP_parallel
    except (AttributeError, OSError, TypeError):  # no OpenMP runtime in the global scope (or not Linux)
        return None
    gomp_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    gomp_parallel.restype = None
    return gomp_parallel


_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def on_every_thread(fn) -> list:
    """Run `fn()` once on every thread of torch's OpenMP team (the calling thread first
    when there is no team or one thread); returns the results."""
    results = []
    gomp_parallel = _openmp_parallel() if torch.get_num_threads() > 1 else None
    if gomp_parallel is None:
        return [fn()]

    @_BODY
    def body(_):
        results.append(fn())  # list.append is atomic; every thread holds the GIL here

    gomp_parallel(ctypes.cast(body, ctypes.c_void_p), None, torch.get_num_threads(), 0)
    return results


@contextmanager
def flushed(device: torch.device, enabled: bool = True) -> Iterator[None]:
    """Inside: subnormal floats are flushed to zero on every thread torch computes with on
    the CPU (a no-op for other devices, when not `enabled`, or when the threads already
    flush). On exit the threads are put back as they were."""
    if not enabled or device.type != "cpu" or flushing():
        yield
        return
    if not torch.set_flush_denormal(True):  # this CPU has no such mode
        yield
        return
    on_every_thread(lambda: torch.set_flush_denormal(True))
    try:
        yield
    finally:
        on_every_thread(lambda: torch.set_flush_denormal(False))
