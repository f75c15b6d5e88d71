"""Read and write checkpoints (docs/checkpoint_format.md, version 1) of every task kind: the
reader checks the envelope every checkpoint shares, then the model and task sections of the kind
`task.kind` names. safetensors and JSON only, nothing unpickled; every write goes to a temporary
name in the same directory, then is renamed into place (an interrupted run leaves no half-written
file). Readers refuse bad input with a CheckpointError: one line naming the file and the problem."""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from models.section import InductionSection, ModelSection, shapes
from tasks import TASKS, Task, task_kind
from tasks.association import SequenceTask
from tasks.factual_recall import FactualRecallTask
from tasks.induction import InductionTask

FORMAT = "factual-recall-ckpt"
FORMAT_VERSION = 1
SNAPSHOT_RE = re.compile(r"^step_(\d{8})\.safetensors$")
STATE_RE = re.compile(r"^step_(\d{8})\.json$")  # a training state is complete when its JSON is there


class CheckpointError(ValueError):
    """A checkpoint that does not follow the format; the message is one line."""


@dataclass
class Checkpoint:
    path: Path
    config: dict  # the whole config.json
    section: ModelSection  # its model section
    task: Task
    weights: dict[str, torch.Tensor]  # HookedTransformer-format keys, float32, CPU

    @property
    def attention(self) -> str:
        return self.section.attention


# --------------------------------------------------------------------------- reading
def read_config(ckpt: str | Path, kind: str | None = None) -> tuple[dict, Task]:
    """config.json, validated, and the task it describes, of the kind it names. With `kind`
    (a tool that reads one kind only), a checkpoint of another kind is refused."""
    try:
        return _read_config(Path(ckpt), kind)
    except (TypeError, KeyError, AttributeError, OverflowError, RuntimeError) as e:
        # a field of the wrong JSON type that _read_config's checks do not name
        raise CheckpointError(f"{Path(ckpt) / 'config.json'}: malformed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'bad field'}).") from None


def read_envelope(ckpt: str | Path) -> dict:
    """config.json as a dict, with the fields every checkpoint kind shares checked: the
    directory and the file exist, the JSON is an object with format, format_version, model,
    task and training, and the format is ours (pickles are refused, never loaded)."""
    ckpt = Path(ckpt)
    if ckpt.is_file() and ckpt.suffix in (".pt", ".pth", ".pkl", ".bin", ".ckpt"):
        raise CheckpointError(f"{ckpt}: a pickle file, which is never loaded; a checkpoint is a directory "
                              "with config.json and model.safetensors.")
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt}: not a checkpoint directory "
                              f"({'not a directory' if ckpt.exists() else 'no such directory'}).")
    path = ckpt / "config.json"
    if not path.is_file() and (ckpt / "run.json").is_file():
        raise CheckpointError(interrupted_run(ckpt))
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (every checkpoint needs config.json).")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.__class__.__name__}: {str(e).splitlines()[0]}).") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, found {type(config).__name__}.")
    for key in ("format", "format_version", "model", "task", "training"):
        if key not in config:
            raise CheckpointError(f"{path}: lacks the required field '{key}'.")
    if config["format"] != FORMAT:
        raise CheckpointError(f"{path}: format is {config['format']!r}, expected {FORMAT!r}.")
    if config["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: unknown format_version {config['format_version']!r} "
                              f"(this reader knows {FORMAT_VERSION}).")
    if not isinstance(config["model"], dict) or not isinstance(config["task"], dict):
        raise CheckpointError(f"{path}: 'model' and 'task' must be JSON objects.")
    return config


def _read_config(ckpt: Path, kind: str | None) -> tuple[dict, Task]:
    config = read_envelope(ckpt)
    path = ckpt / "config.json"
    found = task_kind(config["task"])
    if kind is not None and found != kind:
        article = "an" if kind[0] in "aeiou" else "a"
        raise CheckpointError(f"{path}: task kind {found!r} is not {article} {kind.replace('_', '-')} task; "
                              f"this tool reads {kind} checkpoints only.")
    if found not in TASKS:
        raise CheckpointError(f"{path}: task kind {found!r} is not one of {', '.join(TASKS)}.")
    if found == FactualRecallTask.kind:
        return config, _factual_recall_task(path, config["model"], config["task"])
    if found == InductionTask.kind:
        return config, _induction_task(path, config["model"], config["task"])
    return config, _sequence_task(path, config["model"], config["task"])


def _model_section(path: Path, data: dict) -> ModelSection:
    try:
        return ModelSection.from_json(data)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _factual_recall_task(path: Path, data: dict, task_cfg: dict) -> FactualRecallTask:
    """The factual-recall task of a checkpoint, its model section checked against it."""
    section = _model_section(path, data)
    try:
        task = FactualRecallTask.from_config(task_cfg)
    except ValueError as e:
        raise CheckpointError(f"{path}: task: {e}") from None
    if task_cfg["seq_len"] != section.n_ctx:
        raise CheckpointError(f"{path}: task.seq_len {task_cfg['seq_len']} differs from model.n_ctx {section.n_ctx}.")
    if section.d_vocab != task.d_vocab:
        raise CheckpointError(f"{path}: model.d_vocab {section.d_vocab} differs from S + R + N + 1 = {task.d_vocab}.")
    if section.d_vocab_out != task.d_vocab_out:
        raise CheckpointError(f"{path}: model.d_vocab_out {section.d_vocab_out} differs from "
                              f"R * D = {task.d_vocab_out}.")
    return task


def _sequence_task(path: Path, data: dict, task_cfg: dict) -> SequenceTask:
    """The association or distribution task of an attention-only checkpoint, its model section checked."""
    try:
        task = TASKS[task_kind(task_cfg)].from_config(task_cfg)
    except ValueError as e:
        raise CheckpointError(f"{path}: {str(e).splitlines()[0]}") from None
    section = _model_section(path, data)
    expected = {"n_ctx": task.seq_len, "d_vocab": task.d_vocab, "d_vocab_out": task.d_vocab_out}
    for key, value in expected.items():
        if getattr(section, key) != value:
            raise CheckpointError(f"{path}: model.{key} is {getattr(section, key)!r}, expected {value!r} for {task}.")
    if section.attention != "softmax":
        raise CheckpointError(f"{path}: only softmax attention is supported for {task.kind} checkpoints.")
    return task


# --------------------------------------------------------------------------- the induction family
def _induction_task(path: Path, data: dict, task_cfg: dict) -> InductionTask:
    """The induction task of a checkpoint, its (multi-layer) model section checked against it."""
    try:
        task = InductionTask.from_config(task_cfg)
        section = InductionSection.from_json(data)
    except ValueError as e:
        raise CheckpointError(f"{path}: {str(e).splitlines()[0]}") from None
    expected = {"n_ctx": task.seq_len, "d_vocab": task.d_vocab, "d_vocab_out": task.d_vocab_out}
    for key, value in expected.items():
        if getattr(section, key) != value:
            raise CheckpointError(f"{path}: model.{key} is {getattr(section, key)!r}, expected {value!r} for {task}.")
    return task


def model_section(config: dict) -> ModelSection | InductionSection:
    """The model section of a validated config.json, of its task kind's family."""
    if task_kind(config["task"]) == InductionTask.kind:
        return InductionSection.from_json(config["model"])
    return ModelSection.from_json(config["model"])


def weight_shapes(section: ModelSection | InductionSection) -> dict[str, tuple[int, ...]]:
    return section.weight_shapes() if isinstance(section, InductionSection) else shapes(section)


# --------------------------------------------------------------------------- weights
def read_weights(path: str | Path, section: ModelSection) -> dict[str, torch.Tensor]:
    """The tensors a model needs from one safetensors file, checked against the config's
    shapes and finite, as float32 on the CPU. Unknown tensors are dropped."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing.")
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for every malformation
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: not a valid safetensors file ({reason}).") from None
    weights = {}
    for key, shape in weight_shapes(section).items():
        if key not in tensors:
            raise CheckpointError(f"{path}: lacks the tensor {key}.")
        t = tensors[key]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{path}: tensor {key} has shape {list(t.shape)}, expected {list(shape)}.")
        if not t.is_floating_point():
            raise CheckpointError(f"{path}: tensor {key} has dtype {t.dtype}, expected a float type.")
        if not torch.isfinite(t).all():
            raise CheckpointError(f"{path}: tensor {key} holds non-finite values (NaN or infinity).")
        weights[key] = t.float()
    return weights


def interrupted_run(ckpt: Path) -> str:
    """What to do with a directory models.train started (run.json) and never finished (no
    config.json): resume it; no weights can be read before."""
    saved = complete_steps(state_dir(ckpt))
    state = (f"its training state is saved at step {saved[-1]}" if saved else "no training state was saved yet")
    try:  # the induction family's run.json names its model's architecture
        induction = "architecture" in json.loads((ckpt / "run.json").read_text()).get("model", {})
    except (OSError, ValueError, AttributeError):
        induction = False
    command = "models.induction.train" if induction else "models.train"
    return (f"{ckpt}: a training run that was interrupted before it wrote its checkpoint (run.json, no config.json; "
            f"{state}, readable once the run finishes); resume it with `python -m {command} --resume {ckpt}`.")


def load_checkpoint(ckpt: str | Path, step: int | None = None, kind: str | None = None) -> Checkpoint:
    """A validated checkpoint of any task kind (or only `kind`): the final weights, or those
    of snapshot `step` (a step without a snapshot is refused, naming the steps there are)."""
    config, task = read_config(ckpt, kind)
    ckpt, file = Path(ckpt), weights_file(ckpt, step)
    section = model_section(config)  # checked by read_config
    return Checkpoint(ckpt, config, section, task, read_weights(file, section))


def state_dir(ckpt: str | Path) -> Path:
    """Where a resumable run keeps its training state (models.training.train_state)."""
    return Path(ckpt) / "train_state"


def complete_steps(folder: Path) -> list[int]:
    """Steps whose training state in `folder` is complete, ascending."""
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := STATE_RE.match(p.name)))


def snapshot_path(ckpt: str | Path, step: int) -> Path:
    return Path(ckpt) / "snapshots" / f"step_{step:08d}.safetensors"


def snapshot_steps(ckpt: str | Path) -> list[int]:
    """Steps of the snapshots present, ascending."""
    folder = Path(ckpt) / "snapshots"
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := SNAPSHOT_RE.match(p.name)))


def weights_sha256(ckpt: str | Path, step: int | None = None) -> str:
    """The content hash (sha256, hex) of the weights an analysis reads (weights_file). Results recorded
    with it belong to these very weights: a copy of the checkpoint has the same, another another."""
    return _sha256([weights_file(ckpt, step)])


def weights_file(ckpt: str | Path, step: int | None = None) -> Path:
    """model.safetensors, or the snapshot of `step` (a step without one refused, naming the steps
    there are and the flag of the checkpoint's family that writes them)."""
    file = Path(ckpt) / "model.safetensors" if step is None else snapshot_path(ckpt, step)
    if step is not None and not file.is_file():
        steps = snapshot_steps(ckpt)
        induction = task_kind(read_envelope(ckpt)["task"]) == "induction"
        flag = "--snapshot-every" if induction else "--snapshots-per-octave"  # each family's
        there = (f"its snapshots are at steps {', '.join(map(str, steps))}" if steps else
                 f"it has no snapshots (train with {flag} N to write them)")
        raise CheckpointError(f"{file}: missing: no snapshot of step {step}; {there}.")
    return file


def snapshots_sha256(ckpt: str | Path) -> str:
    """One content hash (sha256, hex) of every snapshot, in step order, with its step."""
    return _sha256([snapshot_path(ckpt, step) for step in snapshot_steps(ckpt)], named=True)


def _sha256(files: list[Path], named: bool = False) -> str:
    digest = hashlib.sha256()
    for path in files:
        if named:
            digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def read_metrics(ckpt: str | Path) -> list[dict]:
    """metrics.jsonl as a list of dicts ([] when absent)."""
    path = Path(ckpt) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise CheckpointError(f"{path}: line {i} is not valid JSON.") from None
    return rows


# --------------------------------------------------------------------------- writing
def atomic_write(path: str | Path, write) -> None:
    """Call write(tmp_path) on a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json(path: str | Path, obj) -> None:
    """Indented JSON whose integer lists (fact table rows) stay on one line each."""
    text = json.dumps(obj, indent=1)
    text = re.sub(r"\[[\d,\s-]*\]", lambda m: json.dumps(json.loads(m.group())), text)
    write_text(path, text + "\n")


def write_weights(path: str | Path, weights: dict[str, torch.Tensor], cast: bool = True) -> None:
    """safetensors file of `weights` (as float32 unless cast=False), written atomically."""
    tensors = {k: (v.detach().float() if cast else v.detach()).to("cpu").contiguous() for k, v in weights.items()}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))


def write_checkpoint(ckpt: str | Path, section: ModelSection, task: Task, training: dict,
                     weights: dict[str, torch.Tensor], metrics: list[dict] = (),
                     snapshots: dict[int, dict[str, torch.Tensor]] | None = None) -> Path:
    """Write a whole checkpoint directory; config.json goes last, so a directory with a
    config.json is complete."""
    ckpt = Path(ckpt)
    for step, snapshot in sorted((snapshots or {}).items()):
        write_weights(snapshot_path(ckpt, step), snapshot)
    write_weights(ckpt / "model.safetensors", weights)
    write_text(ckpt / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in metrics))
    write_json(ckpt / "config.json", {"format": FORMAT, "format_version": FORMAT_VERSION,
                                      "model": section.to_json(), "task": task.to_config(), "training": training})
    return ckpt
