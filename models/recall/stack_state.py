"""A shape stack's resumable training state (models.recall.shape_trainer), in models.training.train_state's
format: saved in the stack's folder every `save_every` seconds of training, at an evaluation
(where the loop already waits for the device: no sync is added, and never inside a captured
step), and once more when every run has stopped; only the latest state is kept.

It holds the stack's trainable weights, Adam's moments and step count, the data generators'
states (none with the counter sampler, whose stream is the step), and per run its metrics,
stop step, seconds and snapshots. A stack resumed from it skips the evaluations it recorded
and goes on from that step: it ends bit-identical to an uncut stack on the same device
(tests/test_stack_resume.py). A state another stack saved (other runs) is deleted and the
stack starts over.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from models.recall.config import RunConfig, run_record
from models.training.train_state import complete_steps, keep_latest, load_state, remove_partial, restore, save_state


def fingerprint(runs: list[RunConfig]) -> str:
    """What a stack trains, as a short hash of its runs (where and how they run aside: the
    device and whether the step is graphed change no number)."""
    described = []
    for run in runs:
        d = run_record(run)
        d["train"].pop("device")
        d["train"].pop("cuda_graph")
        described.append(d)
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def save(folder: Path, state) -> None:
    """The stack `state` (models.recall.shape_trainer._ShapeTraining) at its step, evaluated."""
    cells = [{"metrics": c.metrics, "stopped": c.stopped, "seconds": c.seconds, "snapshots": sorted(c.snapshots)}
             for c in state.cells]
    snapshots = {f"snapshot.{i}.{step}.{k}": t for i, c in enumerate(state.cells)
                 for step, snap in c.snapshots.items() for k, t in snap.items()}
    runs = [c.run for c in state.cells]
    save_state(folder, state.step, state.params, state.optimizer, state.data.generators, cells,
               runs[0].train.sampler, extra={"stack": fingerprint(runs),
                                             "seconds": time.perf_counter() - state.start}, tensors=snapshots)
    keep_latest(folder)


def resume(folder: Path, state) -> bool:
    """Put the latest state in `folder` back into the fresh stack `state` (in place: no live
    tensor is rebound); False where there is none, or only another stack's (then deleted)."""
    folder.mkdir(parents=True, exist_ok=True)
    remove_partial(folder)
    steps = complete_steps(folder)
    if not steps:
        return False
    tensors, info = load_state(folder, steps[-1])
    runs = [c.run for c in state.cells]
    if info.get("stack") != fingerprint(runs):
        for path in folder.glob("step_*"):
            path.unlink()
        return False
    state.step, cells = restore(tensors, info, state.params, state.optimizer, state.data.generators,
                                runs[0].train.sampler)
    for i, (cell, saved) in enumerate(zip(state.cells, cells)):
        cell.metrics, cell.stopped, cell.seconds = saved["metrics"], saved["stopped"], saved["seconds"]
        cell.snapshots = {step: {k[len(f"snapshot.{i}.{step}."):]: t for k, t in tensors.items()
                                 if k.startswith(f"snapshot.{i}.{step}.")} for step in saved["snapshots"]}
        if cell.stopped is not None:
            state.lr[cell.rows] = 0.0  # frozen, as when it stopped
    state.evaluated = state.step
    state.start = time.perf_counter() - info["seconds"]
    return True
