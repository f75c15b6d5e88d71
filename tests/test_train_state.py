"""models.training.train_state on states written by hand: what a state file holds, the restore of
weights, Adam's moments, step count and data generators, damaged and partial files, and the
weights of every saved state. (A whole run resumed: tests/test_reliability.py.)"""
import json

import pytest
import torch
from safetensors.torch import load_file

from models.checkpoint import CheckpointError
from models.training.optimizer import Optimizer
from models.training.train_state import load_state, remove_partial, restore, save_state, saved_snapshots

LR = torch.tensor([1e-2, 3e-3])


def trained(kind: str, steps: int, seed: int = 0) -> tuple[dict, Optimizer]:
    gen = torch.Generator().manual_seed(seed)
    params = {"a": torch.randn(2, 3, generator=gen), "b": torch.randn(2, 4, generator=gen)}
    opt = Optimizer(params, LR, kind)
    for _ in range(steps):
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return params, opt


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_state_holds_the_weights_the_moments_the_generators_and_the_metrics(tmp_path, kind):
    params, opt = trained(kind, 3)
    data = torch.Generator().manual_seed(7)
    torch.rand(5, generator=data)
    save_state(tmp_path, 3, params, opt, {7: data}, [{"step": 0}, {"step": 3}], "generator")
    tensors = load_file(str(tmp_path / "step_00000003.safetensors"))
    moments = {f"adam.{m}.{k}" for m in "mv" for k in params} if kind == "adam" else set()
    assert set(tensors) == {"weights.a", "weights.b", "rng.7"} | moments
    assert torch.equal(tensors["weights.b"], params["b"]) and torch.equal(tensors["rng.7"], data.get_state())
    if kind == "adam":
        assert torch.equal(tensors["adam.v.a"], opt.v["a"]) and torch.equal(tensors["adam.m.b"], opt.m["b"])
    info = json.loads((tmp_path / "step_00000003.json").read_text())
    assert {k: info[k] for k in ("step", "adam_t", "sampler", "metrics")} == {
        "step": 3, "adam_t": 3, "sampler": "generator", "metrics": [{"step": 0}, {"step": 3}]}
    loaded, loaded_info = load_state(tmp_path, 3)
    assert loaded_info == info and all(torch.equal(loaded[k], tensors[k]) for k in tensors)


def test_a_restore_gives_back_every_part_of_the_state(tmp_path):
    params, opt = trained("adam", 4)
    data = torch.Generator().manual_seed(7)
    torch.rand(5, generator=data)
    save_state(tmp_path, 4, params, opt, {7: data}, [{"step": 4}], "generator")
    expected_draw = torch.rand(3, generator=data)
    live, fresh = trained("adam", 1, seed=1)
    other = torch.Generator().manual_seed(99)
    step, metrics = restore(*load_state(tmp_path, 4), live, fresh, {7: other}, "generator")
    assert (step, metrics, int(fresh.t)) == (4, [{"step": 4}], 4)
    for k in params:
        assert torch.equal(live[k], params[k])
        assert torch.equal(fresh.m[k], opt.m[k]) and torch.equal(fresh.v[k], opt.v[k])
    assert torch.equal(torch.rand(3, generator=other), expected_draw)  # the data stream goes on where it was
    with pytest.raises(CheckpointError, match="^the training state was saved by the 'generator' sampler, "
                                              "not 'counter'.$"):
        restore(*load_state(tmp_path, 4), live, fresh, {}, "counter")


def test_a_state_written_before_the_counter_sampler_is_the_generator_s(tmp_path):
    params, opt = trained("sgd", 2)
    save_state(tmp_path, 2, params, opt, {}, [], "generator")
    info = json.loads((tmp_path / "step_00000002.json").read_text())
    del info["sampler"]
    live, fresh = trained("sgd", 0, seed=1)
    assert restore(load_state(tmp_path, 2)[0], info, live, fresh, {}, "generator") == (2, [])
    with pytest.raises(CheckpointError, match="saved by the 'generator' sampler"):
        restore(load_state(tmp_path, 2)[0], info, live, fresh, {}, "counter")


@pytest.mark.parametrize("damage", ["json", "tensors", "missing"])
def test_a_damaged_state_is_refused_in_one_line(tmp_path, damage):
    params, opt = trained("adam", 1)
    save_state(tmp_path, 12, params, opt, {}, [], "counter")
    if damage == "json":
        (tmp_path / "step_00000012.json").write_text("{cut")
    elif damage == "tensors":
        (tmp_path / "step_00000012.safetensors").write_bytes(b"\x00" * 10)
    else:
        (tmp_path / "step_00000012.safetensors").unlink()
    with pytest.raises(CheckpointError) as refused:
        load_state(tmp_path, 12)
    kind = {"json": "JSONDecodeError", "tensors": "SafetensorError", "missing": "FileNotFoundError"}[damage]
    assert str(refused.value) == f"{tmp_path}/step_00000012: unreadable training state ({kind})."


def test_partial_files_are_removed_and_named_states_kept(tmp_path):
    params, opt = trained("adam", 1)
    save_state(tmp_path, 1, params, opt, {}, [], "counter")
    for name in (".step_00000002.safetensors.abc.tmp", ".step_00000002.json.x.tmp"):
        (tmp_path / name).write_bytes(b"partial")
    (tmp_path / "notes.tmp").write_text("not a state's")
    remove_partial(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.tmp", "step_00000001.json",
                                                          "step_00000001.safetensors"]


def test_saved_snapshots_are_the_weights_of_every_complete_state(tmp_path):
    weights = {}
    for step in (2, 5, 9):
        params, opt = trained("adam", step)
        save_state(tmp_path, step, params, opt, {}, [], "counter")
        weights[step] = params
    (tmp_path / "step_00000009.json").unlink()  # incomplete: its JSON is written last
    snapshots = saved_snapshots(tmp_path, ["a"])
    assert sorted(snapshots) == [2, 5] and all(set(s) == {"a"} for s in snapshots.values())
    assert all(torch.equal(snapshots[step]["a"], weights[step]["a"]) for step in (2, 5))
