"""Resumable training state, saved with each snapshot: every model's trainable weights,
the optimizer's state (Adam's moments, SGD's momentum) and step count, the data generators' RNG
states (none with the counter sampler, whose stream is a function of the step) and the metrics so far.

CKPT/train_state/step_XXXXXXXX.safetensors  tensors (weights.<key>, adam.m.<key>, adam.v.<key>,
                                             sgd.momentum.<key>, rng.<seed>, and a caller's own: a
                                             shape stack's snapshots)
CKPT/train_state/step_XXXXXXXX.json         step, adam_t, sampler, device, metrics, dropped (the models
                                             dropped as diverged: models.training.divergence), and a
                                             caller's own fields; written last, so a state is complete
                                             exactly when its JSON exists
The tensors are read back onto any device: a counter-sampler run resumes on another device
(CPU -> CUDA and back) with the same batches; a generator-sampler run only on its own kind of
device, whose random streams its saved generator states are.
Both are written atomically; a kill at any moment leaves every named file whole.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from models.checkpoint import CheckpointError, complete_steps, state_dir, write_json, write_weights

__all__ = ["state_dir", "complete_steps", "save_state", "remove_partial", "keep_latest", "load_state", "restore",
           "saved_snapshots"]


def save_state(folder: Path, step: int, params: dict, optimizer, generators: dict, metrics,
               sampler: str, dropped: list[dict] = (), extra: dict | None = None,
               tensors: dict[str, torch.Tensor] | None = None) -> None:
    """The state at `step` in `folder`: `params`' weights, the optimizer's state (Adam's moments,
    SGD's momentum) and step count, the generators' RNG states, the `metrics` so far (any JSON),
    the models `dropped` as diverged, the JSON fields of `extra` and the tensors of `tensors`
    (names other than weights.*, adam.*, sgd.*, rng.*). Reads the device's step count (a host
    sync): call it between steps, never inside a captured one."""
    saved = {f"weights.{k}": p.detach() for k, p in params.items()}
    saved.update(optimizer.state_tensors())
    saved.update({f"rng.{seed}": g.get_state() for seed, g in generators.items()})
    saved.update(tensors or {})
    write_weights(folder / f"step_{step:08d}.safetensors", saved, cast=False)
    device = str(next(iter(params.values())).device)
    write_json(folder / f"step_{step:08d}.json", {"step": step, "adam_t": optimizer.t.item(), "sampler": sampler,
                                                  "device": device, "metrics": metrics, "dropped": list(dropped),
                                                  **(extra or {})})


def remove_partial(folder: Path) -> None:
    """Delete temporary files a killed run left behind (never a named state)."""
    for tmp in folder.glob(".step_*.tmp"):
        tmp.unlink(missing_ok=True)


def keep_latest(folder: Path) -> None:
    """Delete every state older than the latest complete one (the JSONs first: a kill in
    between leaves an incomplete state, never a damaged complete one)."""
    latest = complete_steps(folder)[-1:]
    older = [p for p in folder.glob("step_*") if latest and int(p.name[5:13]) < latest[0]]
    for path in sorted(older, key=lambda p: p.suffix != ".json"):
        path.unlink(missing_ok=True)


def load_state(folder: Path, step: int) -> tuple[dict, dict]:
    """(tensors, info) of the state at `step`."""
    try:
        info = json.loads((folder / f"step_{step:08d}.json").read_text())
        tensors = load_file(str(folder / f"step_{step:08d}.safetensors"))
    except Exception as e:  # any damage to a state file is reported the same way
        raise CheckpointError(f"{folder}/step_{step:08d}: unreadable training state ({type(e).__name__}).") from None
    return tensors, info


def restore(tensors: dict, info: dict, params: dict, optimizer, generators: dict,
            sampler: str) -> tuple[int, list[dict]]:
    """Put a saved state back into live params, optimizer and generators (in place); returns
    (step, metrics). The counter sampler has no generators: its stream resumes from the step,
    on any device. A generator's state belongs to its kind of device (CPU or CUDA)."""
    saved = info.get("sampler", "generator")  # states written before the counter sampler existed
    if saved != sampler:
        raise CheckpointError(f"the training state was saved by the {saved!r} sampler, not {sampler!r}.")
    for seed, g in generators.items():
        if tensors[f"rng.{seed}"].shape != g.get_state().shape:
            raise CheckpointError(f"the training state was saved on {info.get('device', 'another kind of device')} "
                                  f"by the generator sampler, whose random streams cannot move to {g.device}: "
                                  "resume it there (runs with --sampler counter resume on any device).")
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(tensors[f"weights.{k}"])
        for name, t in optimizer.state_tensors().items():
            t.copy_(tensors[name])
    optimizer.t.fill_(info["adam_t"])
    for seed, g in generators.items():
        g.set_state(tensors[f"rng.{seed}"])
    return info["step"], info["metrics"]


def saved_snapshots(folder: Path, keys) -> dict[int, dict[str, torch.Tensor]]:
    """Trainable weights [K, ...] of every complete state, by step (CPU)."""
    snapshots = {}
    for step in complete_steps(folder):
        tensors = load_state(folder, step)[0]
        snapshots[step] = {k: tensors[f"weights.{k}"] for k in keys}
    return snapshots
