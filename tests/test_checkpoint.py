"""Checkpoint round trip and every bad-input case of the format's spec."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from models import CheckpointError, ModelSection, build_bridge, load, load_checkpoint
from models.aot.config import AoTModelConfig
from models.checkpoint import read_metrics, snapshot_steps, write_json
from models.recall.config import ModelConfig, TaskConfig
from models.recall.trainer import EVAL_SEED
from tasks.association import AssociationTask


def test_round_trip_same_logits(tiny_result, tiny_ckpt):
    ckpt = load_checkpoint(tiny_ckpt)
    for key, value in tiny_result.weights.items():
        assert torch.equal(ckpt.weights[key], value), key
    assert torch.equal(ckpt.task.facts, tiny_result.task.facts)
    bridge, task = load(tiny_ckpt, device="cpu")
    batch = task.eval_set(512)
    with torch.no_grad():
        theirs = bridge(batch.tokens)[:, -1]
        ours = build_bridge(tiny_result.section, tiny_result.weights)(batch.tokens)[:, -1]
    assert torch.equal(ours, theirs)
    assert (theirs.argmax(-1) == batch.answers).float().mean() >= 0.99


def test_metrics_and_snapshots_written(tiny_ckpt):
    rows = read_metrics(tiny_ckpt)
    assert rows and all({"step", "loss", "accuracy"} <= set(r) for r in rows)
    steps = snapshot_steps(tiny_ckpt)
    assert steps[0] == 0 and steps[-1] == rows[-1]["step"]
    first = load_checkpoint(tiny_ckpt, step=0)
    assert not torch.equal(first.weights["blocks.0.attn.W_Q"], load_checkpoint(tiny_ckpt).weights["blocks.0.attn.W_Q"])
    assert torch.equal(first.weights["embed.W_E"], load_checkpoint(tiny_ckpt).weights["embed.W_E"])


def _edit_config(ckpt, edit):
    path = ckpt / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def _edit_weights(ckpt, edit):
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _set(section, key, value):
    return lambda c: c[section].__setitem__(key, value)


BAD = {
    "missing config": (lambda p: (p / "config.json").unlink(), "config.json: missing"),
    "config not json": (lambda p: (p / "config.json").write_text("{nope"), "config.json: not valid JSON"),
    "missing section": (lambda p: _edit_config(p, lambda c: c.pop("training")), "lacks the required field 'training'"),
    "format version": (lambda p: _edit_config(p, lambda c: c.__setitem__("format_version", 7)),
                       "unknown format_version 7"),
    "unknown kind": (lambda p: _edit_config(p, _set("task", "kind", "parity")),
                     "task kind 'parity' is not one of factual_recall, association, distribution"),
    "other kind, no fields": (lambda p: _edit_config(p, _set("task", "kind", "association")),
                              "task section lacks n_tokens, context"),
    "unknown attention": (lambda p: _edit_config(p, _set("model", "attention", "sparse")),
                          "model.attention must be 'softmax' or 'linear', got 'sparse'"),
    "layer norm": (lambda p: _edit_config(p, _set("model", "normalization_type", "LN")),
                   "normalization_type must be null"),
    "no d_vocab_out": (lambda p: _edit_config(p, lambda c: c["model"].pop("d_vocab_out")),
                       "model section lacks d_vocab_out"),
    "seq_len": (lambda p: _edit_config(p, _set("task", "seq_len", 99)), "differs from model.n_ctx"),
    "fact outside block": (lambda p: _edit_config(p, lambda c: c["task"]["facts"][2].__setitem__(1, 0)),
                           "fact (2, 1) = 0 lies outside relation 1's answer block"),
    "missing weights": (lambda p: (p / "model.safetensors").unlink(), "model.safetensors: missing"),
    "not safetensors": (lambda p: (p / "model.safetensors").write_bytes(b"\x80\x04garbage" * 10),
                        "model.safetensors: not a valid safetensors file"),
    "truncated safetensors": (lambda p: (p / "model.safetensors").write_bytes(
                                  (p / "model.safetensors").read_bytes()[:500]),
                              "not a valid safetensors file"),
    "missing tensor": (lambda p: _edit_weights(p, lambda t: t.pop("blocks.0.attn.W_O")),
                       "lacks the tensor blocks.0.attn.W_O"),
    "mis-shaped tensor": (lambda p: _edit_weights(p, lambda t: t.__setitem__("unembed.W_U", torch.zeros(3, 3))),
                          "tensor unembed.W_U has shape [3, 3], expected"),
    "NaN weight": (lambda p: _edit_weights(p, lambda t: t["blocks.0.mlp.W_in"].view(-1).__setitem__(5, float("nan"))),
                   "tensor blocks.0.mlp.W_in holds non-finite values"),
    "infinite weight": (lambda p: _edit_weights(p, lambda t: t["embed.W_E"].view(-1).__setitem__(0, float("-inf"))),
                        "tensor embed.W_E holds non-finite values"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_refused_with_one_line(case, tiny_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    corrupt, message = BAD[case]
    corrupt(ckpt)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in ckpt.rglob("*"))
    with pytest.raises(CheckpointError) as err:
        load(ckpt, device="cpu")
    text = str(err.value)
    assert message in text and "\n" not in text and str(ckpt) in text
    assert sorted((p.name, p.stat().st_mtime_ns) for p in ckpt.rglob("*")) == before  # nothing written


def test_extra_fields_and_tensors_are_ignored(tiny_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    _edit_config(ckpt, _set("model", "some_future_field", 3))
    _edit_weights(ckpt, lambda t: t.__setitem__("extra.tensor", torch.ones(2)))
    bridge, task = load(ckpt, device="cpu")
    assert task.n_subjects == 16


def test_pickle_and_missing_paths_refused(tmp_path):
    pickle_file = tmp_path / "model.pt"
    pickle_file.write_bytes(b"\x80\x04.")
    with pytest.raises(CheckpointError, match="a pickle file, which is never loaded"):
        load(pickle_file)
    with pytest.raises(CheckpointError, match="no such directory"):
        load(tmp_path / "absent")


SECTIONS = {
    "standard": (ModelConfig(), TaskConfig().build()),
    "authors, attention-only": (ModelConfig(parameterisation="authors", attn_only=True), TaskConfig().build()),
    "linear": (ModelConfig(attention="linear", attn_only=True), TaskConfig().build()),
    "attention-only family": (AoTModelConfig(8, 2, 4, 16), AssociationTask(10, 3)),
    "dana layout": (AoTModelConfig(8, 2, 4, 0, head_layout="dana"), AssociationTask(10, 3)),
}


@pytest.mark.parametrize("case", list(SECTIONS))
def test_model_section_round_trips_through_json(case):
    cfg, task = SECTIONS[case]
    section = cfg.checkpoint_section(task)
    data = json.loads(json.dumps(section.to_json()))
    assert ModelSection.from_json(data) == section
    assert list(ModelSection.from_json(data).to_json()) == list(data)  # key order kept


def test_model_section_refuses_in_one_line():
    data = ModelConfig().checkpoint_section(TaskConfig().build()).to_json()
    for edit, message in [({"act_fn": "gelu"}, "model.act_fn must be 'relu'"),
                          ({"d_mlp": 0}, "model.d_mlp must be a positive integer"),
                          ({"head_layout": "dana", "d_embed": 3}, "d_model = d_embed \\+ d_head")]:
        with pytest.raises(ValueError, match=message):
            ModelSection.from_json({**data, **edit})
    assert ModelSection.from_json({**data, "act_fn": "gelu", "positional_embedding": "trainable"}).act_fn == "gelu"


OLD = Path(__file__).parent / "data" / "pre_aot_package"


@pytest.mark.parametrize("name", ["factual_recall", "attention_only", "attention_only_dana"])
def test_checkpoints_written_before_the_aot_package_still_load(name):
    """Committed checkpoints written when the attention-only family lived in models/aot_*.py
    (one training step each) load as a bridge whose scores are the recorded final ones."""
    ckpt = OLD / name
    training = json.loads((ckpt / "config.json").read_text())["training"]
    bridge, task = load(ckpt, device="cpu")
    with torch.no_grad():
        if name == "factual_recall":
            held_out = task.eval_set(training["eval_size"], EVAL_SEED)
            logits = bridge(held_out.tokens)[:, -1]  # [batch, answer]
            loss = torch.nn.functional.cross_entropy(logits, held_out.answers).item()
            accuracy = (logits.argmax(-1) == held_out.answers).float().mean().item()
        else:
            scores = task.scores(bridge(task.sequences())[:, -1])
            loss, accuracy = scores["loss"].item(), scores["accuracy"].item()
    assert loss == pytest.approx(training["final_loss"], abs=1e-5)
    assert accuracy == pytest.approx(training["final_accuracy"])


def test_a_step_without_a_snapshot_is_refused_naming_the_steps_there_are(tiny_ckpt):
    steps = snapshot_steps(tiny_ckpt)
    assert len(steps) > 2 and 17 not in steps
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tiny_ckpt, step=17)
    assert f"no snapshot of step 17; its snapshots are at steps {', '.join(map(str, steps))}." in str(refused.value)


def test_an_interrupted_run_is_named_with_its_resume_command(tmp_path):
    """A run killed before its checkpoint: run.json and train_state/ only."""
    ckpt = tmp_path / "killed"
    write_json(ckpt / "run.json", {"preset": "tiny"})
    for step in (4, 8):
        write_json(ckpt / "train_state" / f"step_{step:08d}.json", {"step": step})
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(ckpt)
    message = str(refused.value)
    assert "interrupted" in message and "saved at step 8" in message and "\n" not in message
    assert f"`python -m models.train --resume {ckpt}`" in message
