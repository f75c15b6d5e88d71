"""A CPU check that a training step can be captured in a CUDA graph (models.training.graphed).

`check_capturable(step)` runs a step (a function of no arguments, as models.training.graphed.Step
takes it) whose tensors were built on the `meta` device: every operation it dispatches,
forward and backward, is seen by a TorchDispatchMode and computed on shapes only, so the
check runs anywhere, in milliseconds. It refuses what a capture cannot hold:

- a CPU tensor operand in work on the device (a capture reads its value once, or refuses it);
- a copy between the host and the device (host to device: refused under capture unless
  pinned, and read once; device to host: waits for the device);
- an operation that waits for a value on the host: `.item()`, `bool()`, `int()`, `.tolist()`,
  a Python branch on a tensor (`aten._local_scalar_dense`), `torch.equal`, `allclose`;
- an output whose shape depends on the data: `nonzero`, `masked_select`, `unique`, boolean-mask
  indexing, `repeat_interleave` by a tensor;
- a random draw (a replay repeats the draws of the generators registered with the graph only;
  the trainers draw their data with the counter sampler, integer arithmetic);
- an operation torch marks unsafe for CUDA graphs (`Tag.cudagraph_unsafe`);
- a step whose work differs between two calls (the operations, shapes or devices): a
  replay repeats the captured call, whatever the host would have done next.

Not checkable here (docs/gpu.md): a tensor allocated in the step that the host keeps past
the next replay (the graph's memory pool is overwritten by it), and whatever a CUDA kernel
alone does (a host-side synchronisation inside a library call, a custom generator's state).
"""
from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[2]  # the toolkit's sources: where a hazard is reported
INDEXING = ("index", "index_put", "index_put_", "_index_put_impl_")  # torch tags them dynamic: only a mask is


class CaptureHazard(ValueError):
    """A step does something a CUDA graph cannot capture or replay faithfully."""


def _where() -> str:
    """The innermost frame of the toolkit's own code on the stack (`path:line`), or '?'."""
    here = Path(__file__).resolve()
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path != here and ROOT in path.parents and ".venv" not in path.parts:
            return f"{path.relative_to(ROOT)}:{frame.lineno}"
    return "?"


def _tensors(args, kwargs) -> list[torch.Tensor]:
    return [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


def _reason(func, args, kwargs, out_device: torch.device | None) -> str | None:
    """Why the operation `func(*args, **kwargs)` cannot be captured, or None."""
    name = func.overloadpacket.__name__
    tags = func.tags
    inputs = _tensors(args, kwargs)
    devices = {t.device.type for t in inputs} | ({out_device.type} if out_device is not None else set())
    if torch.Tag.data_dependent_output in tags:
        return "waits for a value on the host (.item(), bool(), a Python branch on a tensor, .tolist())"
    if name in INDEXING and any(t.dtype in (torch.bool, torch.uint8) for t in inputs[1:]):
        return "boolean-mask indexing: its shape depends on the data"
    if torch.Tag.dynamic_output_shape in tags and name not in INDEXING:
        return "its output's shape depends on the data"
    if torch.Tag.nondeterministic_seeded in tags:
        return "a random draw: a replay repeats only the draws of generators registered with the graph"
    if torch.Tag.cudagraph_unsafe in tags:
        return "torch marks it unsafe in a CUDA graph"
    if name in ("_to_copy", "copy_", "copy") and len(devices) > 1:
        return ("a copy from the host to the device" if inputs[0 if name == "_to_copy" else -1].device.type == "cpu"
                else "a copy from the device to the host (waits for the device)")
    if "cpu" in devices and len(devices) > 1:
        return "a CPU tensor operand in work on the device"
    return None


class _Watch(TorchDispatchMode):
    """Records every operation's signature; raises CaptureHazard at the first hazard."""

    def __init__(self):
        super().__init__()
        self.trace: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        reason = _reason(func, args, kwargs, torch.device(device) if device is not None else None)
        if reason:
            raise CaptureHazard(f"{func} at {_where()}: {reason}.")
        self.trace.append((str(func), *((t.device.type, t.dtype, tuple(t.shape)) for t in _tensors(args, kwargs))))
        return func(*args, **kwargs)


def check_capturable(step: Callable[[], object]) -> None:
    """Run `step` twice, its tensors on the `meta` device (build them there: a run's tensors
    on `torch.device("meta")`), and raise CaptureHazard naming the first operation (and the
    line of the toolkit's code that ran it) a CUDA graph could not capture or replay as the
    step: see the module docstring. ValueError where the step did no work off the CPU (then
    nothing was checked)."""
    traces = []
    for _ in range(2):
        with _Watch() as watch:
            step()
        traces.append(watch.trace)
    if not any(device == "meta" for op in traces[0] for device, *_ in op[1:]):
        raise ValueError("the step ran no operation on the meta device: build its tensors there to check it.")
    first, second = traces[0] + [None], traces[1] + [None]  # None: the shorter one ended
    if first != second:
        i = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
        raise CaptureHazard(f"the step's work differs between two calls (operation {i}: {first[i]} then "
                            f"{second[i]}): a replay repeats the captured call.")
