"""Graphed training (models.training.graphed): the choice of eager or captured, the in-place restore a
captured run needs, and, where CUDA is present, the captured step against the eager one."""
import contextlib
import json
import subprocess
import sys
from dataclasses import asdict, replace

import pytest
import torch

from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.aot.trainer import train_aot
from models.recall.config import TrainConfig
from models.recall.presets import PRESETS, preset
from models.recall.shape_trainer import train_shapes
from models.recall.trainer import train
from models.training.graphed import WARMUP_STEPS, Step, not_capturable, use_cuda_graph
from models.training.optimizer import Optimizer
from models.training.train_state import load_state, restore, save_state
from tasks.association import AssociationTask
from tests.conftest import TEST_DEVICE, quick
from tests.test_shape_stack import runs as shape_runs

CUDA = pytest.mark.skipif(TEST_DEVICE.type != "cuda",
                          reason="CUDA graphs need a GPU: run with FACTUAL_RECALL_TEST_DEVICE=cuda")
GPU = torch.device("cuda")  # a device object only: nothing is allocated on it below the CUDA mark


@pytest.mark.parametrize("mode, device, sampler, graphed", [
    ("auto", torch.device("cpu"), "counter", False),
    ("off", GPU, "counter", False),
    ("auto", GPU, "counter", True),
    ("on", GPU, "counter", True),
    ("auto", GPU, "generator", False),  # falls back: a replay would not advance the generators
])
def test_auto_captures_where_it_can(mode, device, sampler, graphed):
    assert use_cuda_graph(mode, device, sampler) is graphed


@pytest.mark.parametrize("device, sampler, reason", [
    (torch.device("cpu"), "counter", "the run is on cpu"),
    (GPU, "generator", "use --sampler counter"),
])
def test_on_refuses_what_cannot_be_captured(device, sampler, reason):
    with pytest.raises(ValueError, match=f"--cuda-graph on: .*{reason}"):
        use_cuda_graph("on", device, sampler)
    with pytest.raises(ValueError, match="cuda_graph must be one of auto, on, off"):
        use_cuda_graph("always", device, sampler)


@pytest.mark.slow
def test_train_cli_refuses_a_graph_it_cannot_capture_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "models.train", "--preset", "tiny", "--device", "cpu",
                           "--cuda-graph", "on", "--out", str(tmp_path / "ckpt")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --cuda-graph on: the run is on cpu, and CUDA graphs need a CUDA device."]
    assert not (tmp_path / "ckpt").exists()


def test_an_eager_step_runs_the_function_at_every_call():
    calls = []
    step = Step(lambda: (torch.tensor(float(len(calls))), calls.append(1))[:1], graphed=False)
    outputs = [float(step()[0]) for _ in range(WARMUP_STEPS + 3)]
    assert outputs == list(range(WARMUP_STEPS + 3)) and step.graph is None and step.calls == WARMUP_STEPS + 3


def test_a_graphed_step_warms_up_on_a_side_stream_captures_once_then_replays(monkeypatch):
    """The order of the CUDA calls a graphed Step makes, with torch.cuda's streams and graphs
    replaced by stand-ins that record them (the captured step itself: the CUDA tests below)."""
    events = []

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            events.append(f"{self.name} waits for {other.name}")

    class Graph:
        def replay(self):
            events.append("replay")

    @contextlib.contextmanager
    def on(stream):
        events.append(f"on {stream.name}")
        yield

    @contextlib.contextmanager
    def capturing(graph):
        assert isinstance(graph, Graph)
        events.append("capture")
        yield

    current = Stream("current")
    for name, value in (("Stream", Stream), ("current_stream", lambda: current), ("stream", on),
                        ("CUDAGraph", Graph), ("graph", capturing)):
        monkeypatch.setattr(torch.cuda, name, value)
    made = []
    step = Step(lambda: (made.append(torch.tensor(float(len(made)))) or made[-1],), graphed=True)
    outputs = [step() for _ in range(WARMUP_STEPS + 3)]
    warmup = ["side waits for current", "on side", "current waits for side"]
    assert events == warmup * WARMUP_STEPS + ["capture", "replay", "replay", "replay"]
    assert [float(o[0]) for o in outputs[:WARMUP_STEPS]] == list(range(WARMUP_STEPS))  # real steps
    assert len(made) == WARMUP_STEPS + 1  # then captured once: later calls replay, never call it
    assert all(o is step.outputs and o[0] is made[-1] for o in outputs[WARMUP_STEPS:])
    assert isinstance(step.graph, Graph) and step.calls == WARMUP_STEPS + 3


def test_a_step_is_captured_where_the_run_is_on_cuda_with_the_counter_sampler():
    assert not_capturable(GPU) is None and not_capturable(GPU, "counter") is None
    assert not_capturable(GPU, "generator") == ("the generator sampler draws from torch.Generators that a replay "
                                                "would not advance; use --sampler counter")
    assert not_capturable(torch.device("cpu")) == "the run is on cpu, and CUDA graphs need a CUDA device"
    assert use_cuda_graph("auto", GPU) and not use_cuda_graph("off", GPU)
    assert use_cuda_graph("off", device=None) is False  # off is decided without looking at the device


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_captures_on_cuda_by_default(name):
    """No flag needed: the default sampler is the one a CUDA graph replays."""
    train_cfg = preset(name).train
    assert use_cuda_graph(train_cfg.cuda_graph, GPU, train_cfg.sampler)


def test_the_sweeps_capture_on_cuda_by_default(tmp_path):
    from analyses.capacity.transformer import TransformerSweep
    from analyses.tradeoff.cli import parser as tradeoff_parser
    from analyses.tradeoff.common import base_run

    sweep = TransformerSweep()
    assert use_cuda_graph(sweep.cuda_graph, GPU, sweep.sampler)
    assert use_cuda_graph(AoTTrainConfig().cuda_graph, GPU)
    run = base_run(tradeoff_parser().parse_args(["grid", "--out", str(tmp_path / "new")]))
    assert use_cuda_graph(run.train.cuda_graph, GPU, run.train.sampler)


def test_a_trade_off_sweep_recorded_without_a_sampler_resumes_with_the_generator(tmp_path):
    """Its settings.json (a grid recorded before the counter sampler was the default) names
    none; --sampler, where given, still chooses."""
    from analyses.tradeoff.cli import parser as tradeoff_parser
    from analyses.tradeoff.common import base_run

    (tmp_path / "settings.json").write_text(json.dumps({"analysis": "tradeoff grid", "run": {"train": {}}}))
    args = ["grid", "--out", str(tmp_path)]
    assert base_run(tradeoff_parser().parse_args(args)).train.sampler == "generator"
    assert base_run(tradeoff_parser().parse_args([*args, "--sampler", "counter"])).train.sampler == "counter"


def test_a_run_started_before_the_sampler_was_a_setting_resumes_with_the_generator(tmp_path):
    from models.recall.train import read_run

    recorded = {"preset": "tiny", **asdict(preset("tiny"))}
    del recorded["train"]["sampler"]
    (tmp_path / "run.json").write_text(json.dumps(recorded))
    run, name = read_run(tmp_path)
    assert (run.train.sampler, name) == ("generator", "tiny") and run.task == preset("tiny").task


def test_a_run_records_whether_its_step_was_graphed():
    result = train(quick(preset("tiny"), steps=3, eval_every=1, snapshots_per_octave=0), progress=False)
    assert result.training["cuda_graph"] == "auto" and result.training["graphed"] is (TEST_DEVICE.type == "cuda")


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_restore_copies_into_the_live_tensors_and_rebinds_none(tmp_path, kind):
    """A captured graph reads the tensors it was captured with: resuming must write the saved
    state into them, never replace them."""
    gen = torch.Generator().manual_seed(0)
    saved = {"a": torch.randn(2, 3, generator=gen), "b": torch.randn(2, 4, generator=gen)}
    opt = Optimizer(saved, torch.tensor([1e-2, 3e-3]), kind)
    for _ in range(5):
        for p in saved.values():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    save_state(tmp_path, 5, saved, opt, {}, [{"step": 5}], "counter")

    live = {k: torch.zeros_like(p) for k, p in saved.items()}
    fresh = Optimizer(live, torch.tensor([1e-2, 3e-3]), kind)

    def bound():  # every tensor a captured step reads, as the optimizer and the run hold them now
        return [*live.values(), fresh.t, *getattr(fresh, "m", {}).values(), *getattr(fresh, "v", {}).values()]

    before = [(t, t.data_ptr()) for t in bound()]
    step, metrics = restore(*load_state(tmp_path, 5), live, fresh, {}, "counter")
    assert (step, metrics) == (5, [{"step": 5}])
    after = bound()  # read again: a restore that rebinds a dict entry shows here
    assert len(after) == len(before) and all(t is kept and t.data_ptr() == ptr for (kept, ptr), t in zip(before, after))
    assert all(torch.equal(live[k], saved[k]) for k in saved) and int(fresh.t) == 5
    if kind == "adam":
        assert all(torch.equal(fresh.m[k], opt.m[k]) and torch.equal(fresh.v[k], opt.v[k]) for k in saved)


# ------------------------------------------------------------------ on a GPU: captured = eager
def _both(train_fn):
    """The result of `train_fn(mode)` eager and captured."""
    return train_fn("off"), train_fn("on")


def _timeless(curve: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in curve]


def _assert_same_weights(eager: dict, graphed: dict) -> None:
    assert eager.keys() == graphed.keys()
    for key in eager:
        assert torch.equal(eager[key], graphed[key]), key


@CUDA
@pytest.mark.parametrize("seeds", [(0,), tuple(range(64))], ids=["one model", "64 seeds"])
def test_graphed_training_is_bit_identical_to_eager(seeds):
    run = quick(preset("tiny"), steps=1000, eval_every=250, target_accuracy=2.0, snapshots_per_octave=1,
                sampler="counter", seed=seeds)
    eager, graphed = _both(lambda mode: train(quick(run, cuda_graph=mode), progress=False))
    assert (eager.training["graphed"], graphed.training["graphed"]) == (False, True)
    _assert_same_weights(eager.stacked, graphed.stacked)
    assert [r["models"] for r in eager.metrics] == [r["models"] for r in graphed.metrics]
    assert sorted(eager.snapshots) == sorted(graphed.snapshots)
    for step in eager.snapshots:
        _assert_same_weights(eager.snapshots[step], graphed.snapshots[step])


@CUDA
def test_a_graphed_shape_stack_is_bit_identical_to_eager():
    def stacked(mode):
        return train_shapes([replace(r, train=replace(r.train, steps=1000, sampler="counter", cuda_graph=mode))
                             for r in shape_runs("authors")], progress=False)
    eager, graphed = _both(stacked)
    for e, g in zip(eager, graphed):
        assert e.training["steps_run"] == g.training["steps_run"] and g.training["graphed"]
        _assert_same_weights(e.stacked, g.stacked)


@CUDA
@pytest.mark.parametrize("layout", ["standard", "dana"])
def test_graphed_attention_only_training_is_bit_identical_to_eager(layout):
    task = AssociationTask(n_tokens=10, context=2)
    runs = [(AoTModelConfig(d_model=8, n_heads=2, d_head=4, head_layout=layout), 0),
            (AoTModelConfig(d_model=8, n_heads=1, d_head=8, head_layout=layout), 1)]
    cfg = AoTTrainConfig(batches=50, epochs=20, batch_size=256, eval_every=100, device=str(TEST_DEVICE))
    eager, graphed = _both(lambda mode: train_aot(task, runs, replace(cfg, cuda_graph=mode), progress=False))
    for e, g in zip(eager, graphed):
        assert g.training["graphed"] and _timeless(e.metrics) == _timeless(g.metrics)
        _assert_same_weights(e.weights, g.weights)
        assert e.training["batch_accuracy"] == g.training["batch_accuracy"]


@CUDA
def test_a_replayed_step_never_waits_for_the_host():
    from models.recall.trainer import training_step
    from models.recall.training_data import TrainingData
    from models.recall.weights import init_weights, stack, trainable_keys

    run = preset("tiny")
    task = run.task.build()
    weights = {k: t.to(TEST_DEVICE) for k, t in stack([init_weights(run.model, task, 0)]).items()}
    params = {k: weights[k].requires_grad_() for k in trainable_keys(weights)}
    opt = Optimizer(params, torch.tensor([1e-2], device=TEST_DEVICE), "adam")
    data = TrainingData(task, [(1e-2, 0)], 1024, TEST_DEVICE, "counter")
    step = Step(training_step(weights, opt, data, "softmax", False), graphed=True)
    for _ in range(WARMUP_STEPS + 1):  # warm-up and capture
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(100):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(opt.t) == WARMUP_STEPS + 101


def test_the_training_config_refuses_an_unknown_graph_mode():
    with pytest.raises(ValueError, match="cuda_graph must be one of auto, on, off, got 'yes'"):
        TrainConfig(cuda_graph="yes").validate()
