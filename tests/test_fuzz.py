"""Fuzzing (hypothesis): random task and model configurations give a working task/model or
one ValueError sentence; random corruptions of config.json and of safetensors files give a
CheckpointError of one line and never a write into the checkpoint."""
import importlib
import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from models import CheckpointError, load
from models.recall.config import ModelConfig
from models.recall.weights import init_weights
from tasks.factual_recall import FactualRecallTask
from tests.conftest import run_main

CASES = 150  # per property; docs/reliability.md records the total
FUZZ = settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck))
small = st.one_of(st.integers(-3, 24), st.sampled_from([0, 1, 2, 3]), st.floats(-1, 10), st.none(), st.text(max_size=2))


def one_sentence(error: Exception) -> bool:
    text = str(error)
    return bool(text) and "\n" not in text


@FUZZ
@given(S=small, R=small, D=small, N=small, T=small, zipf=st.one_of(st.floats(-2, 5), st.text(max_size=1)),
       facts=st.sampled_from(["random", "structured", "other", [[0]], [[0, 1], [2, 3]]]))
def test_random_task_configs(S, R, D, N, T, zipf, facts):
    try:
        task = FactualRecallTask(S, R, D, N, T, subject_zipf=zipf, facts=facts)
    except ValueError as e:
        assert one_sentence(e)
        return
    batch = task.sample(64, torch.Generator().manual_seed(0))
    assert batch.tokens.shape == (64, T) and (batch.tokens[:, -1] == task.eos).all()
    assert ((batch.answers // D) == batch.relations).all()


@FUZZ
@given(d=small, H=small, dh=small, m=small, attn_only=st.booleans(),
       scale=st.one_of(st.floats(-1, 3), st.just(float("nan"))))
def test_random_model_configs(d, H, dh, m, attn_only, scale):
    task = FactualRecallTask(4, 2, 2, 3, 5)
    try:
        model = ModelConfig(d_model=d, n_heads=H, d_head=dh, d_mlp=m, attn_only=attn_only, init_scale=scale)
        weights = init_weights(model, task, 0)
    except ValueError as e:
        assert one_sentence(e)
        return
    assert weights["blocks.0.attn.W_Q"].shape == (H, d, dh) and torch.isfinite(weights["blocks.0.attn.W_Q"]).all()


def _paths(obj, prefix=()):
    """Every key path of a JSON object."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                        st.text(max_size=4), st.lists(st.integers(-2, 40), max_size=3), st.just({}))


def _snapshot(ckpt):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in ckpt.rglob("*"))


def _expect_clean_refusal_or_load(ckpt):
    before = _snapshot(ckpt)
    try:
        load(ckpt, device="cpu")
    except CheckpointError as e:
        assert one_sentence(e) and str(ckpt) in str(e)
    assert _snapshot(ckpt) == before


@FUZZ
@given(data=st.data())
def test_random_config_corruptions(data, tiny_ckpt, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("fuzz") / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    paths = sorted(_paths(config), key=str)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = config
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            if data.draw(st.booleans()):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = data.draw(JSON_VALUES)
    text = json.dumps(config)
    if data.draw(st.integers(0, 9)) == 0:  # sometimes not JSON at all
        text = text[: data.draw(st.integers(0, len(text)))]
    (ckpt / "config.json").write_text(text)
    _expect_clean_refusal_or_load(ckpt)


@FUZZ
@given(data=st.data())
def test_random_safetensors_corruptions(data, tiny_ckpt, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("fuzz") / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    raw = bytearray((ckpt / "model.safetensors").read_bytes())
    header_end = 8 + int.from_bytes(raw[:8], "little")
    kind = data.draw(st.sampled_from(["flip_header", "flip_any", "truncate", "length"]))
    if kind == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "length":
        raw[:8] = data.draw(st.integers(0, 2**64 - 1)).to_bytes(8, "little")
    else:
        end = header_end if kind == "flip_header" else len(raw)
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, end - 1))] = data.draw(st.integers(0, 255))
    (ckpt / "model.safetensors").write_bytes(bytes(raw))
    _expect_clean_refusal_or_load(ckpt)


def _corrupt(ckpt, part):
    """Damage one part of a finished checkpoint: config.json, model.safetensors (its bytes,
    or one weight made NaN), or the run.json of a run with no config.json yet (an interrupted one)."""
    if part == "config":
        (ckpt / "config.json").write_text('{"format": "factual-recall-ckpt", "format_version": 1, "model": 3}')
    elif part == "weights":
        (ckpt / "model.safetensors").write_bytes(b"\xff" * 64)
    elif part == "nan":
        weights = load_file(ckpt / "model.safetensors")
        weights["blocks.0.attn.W_O"][0, 0, 0] = float("nan")
        save_file(weights, ckpt / "model.safetensors")
    else:
        (ckpt / "config.json").unlink()
        (ckpt / "run.json").write_text("{broken")


@pytest.mark.parametrize("command", [["analyses.locate_facts"], ["models.train", "--resume"]],
                         ids=["locate", "resume"])
@pytest.mark.parametrize("part", ["config", "weights", "nan", "run"])
def test_every_cli_refuses_a_corrupted_checkpoint_with_exit_2(tiny_ckpt, tmp_path, capsys, command, part):
    """Through each command's main, as `python -m` runs it (tests/test_cli.py and
    tests/test_locate_facts.py run both commands as processes)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    _corrupt(ckpt, part)
    before = _snapshot(ckpt)
    code, _, err = run_main(importlib.import_module(command[0]).main, [*command[1:], ckpt], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(ckpt) in err
    assert _snapshot(ckpt) == before
