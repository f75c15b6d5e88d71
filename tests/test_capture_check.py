"""The CPU check for CUDA-graph capture hazards (models.training.capture_check): each hazard it names is
refused, a clean step passes, and every trainer's step, built on the meta device as the
trainer builds it, passes with every sampler `--cuda-graph auto` captures. The association
task's step as it was (its table copied from the host inside the step) is kept as a fixture
the check must refuse."""
import re
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.aot.trainer import population_step, prepare
from models.recall.config import RunConfig, TaskConfig, TrainConfig, TwoHopTaskConfig, shape_model
from models.recall.presets import preset
from models.recall.shape_trainer import _start_shapes
from models.recall.trainer import _start
from models.training.capture_check import CaptureHazard, check_capturable
from models.training.graphed import use_cuda_graph
from tasks.association import AssociationTask, DistributionTask

META = torch.device("meta")
ROOT = Path(__file__).resolve().parents[1]
UNSAFE = torch.library.Library("capture_check_test", "DEF")  # an operation torch tags unsafe in a CUDA graph
UNSAFE.define("unsafe(Tensor x) -> Tensor", tags=(torch.Tag.cudagraph_unsafe,))
UNSAFE.impl("unsafe", lambda x: x.clone(), "CompositeExplicitAutograd")
CAPTURED = [s for s in ("generator", "counter") if use_cuda_graph("auto", torch.device("cuda"), s)]


def _weights():
    return torch.zeros(4, 3, device=META).requires_grad_()


def _clean_step(w):
    def step():
        loss = (w * 2).square().sum()
        loss.backward()
        with torch.no_grad():
            w.sub_(w.grad)
        w.grad = None
        return (loss.detach(),)
    return step


def test_a_clean_step_passes_forward_backward_and_update():
    check_capturable(_clean_step(_weights()))


HOST_TABLE = torch.arange(3)  # a tensor the host keeps, as the association task kept its table


@pytest.mark.parametrize("body, message", [
    (lambda w: w.sum(0) + HOST_TABLE, "CPU tensor operand"),
    (lambda w: w.sum(0) * torch.tensor(2.0), "CPU tensor operand"),
    (lambda w: w.gather(0, HOST_TABLE.to(w.device)[None]), "copy from the host to the device"),
    (lambda w: w.detach().cpu(), "copy from the device to the host"),
    (lambda w: w.sum().item(), "waits for a value on the host"),
    (lambda w: w * 2 if w.sum() > 0 else w, "waits for a value on the host"),
    (lambda w: w.nonzero(), "shape depends on the data"),
    (lambda w: w[w > 0], "boolean-mask indexing"),
    (lambda w: w + torch.randn(w.shape, device=w.device), "random draw"),
], ids=["cpu operand", "cpu scalar tensor", "host to device", "device to host", "item", "python branch",
        "nonzero", "boolean mask", "random draw"])
def test_each_hazard_is_refused_naming_the_operation_and_the_line(body, message):
    w = _weights()
    with pytest.raises(CaptureHazard, match=rf"aten\.\S+ at tests/test_capture_check\.py:\d+: .*{message}"):
        check_capturable(lambda: body(w))


class _HostScaledGradient(torch.autograd.Function):
    """Doubles its input; its backward multiplies by a CPU tensor."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * torch.tensor(2.0)


def test_a_hazard_in_the_backward_is_refused():
    w = _weights()
    with pytest.raises(CaptureHazard, match=r"aten\.mul\.Tensor at tests/test_capture_check\.py:\d+: a CPU tensor"):
        check_capturable(lambda: _HostScaledGradient.apply(w).sum().backward())


def test_a_step_whose_work_changes_between_calls_is_refused():
    w, calls = _weights(), []

    def step():  # the host decides: a replay would repeat the first call's work
        calls.append(1)
        return w * 2 if len(calls) % 2 else w + 1
    with pytest.raises(CaptureHazard, match="differs between two calls"):
        check_capturable(step)


def test_a_step_whose_shapes_change_between_calls_is_refused():
    """The same operations on the same device, on a slice the host sizes anew each call: a
    replay would repeat the first call's shapes."""
    w, calls = _weights(), []

    def step():
        calls.append(1)
        return (w[:len(calls)] * 2,)
    with pytest.raises(CaptureHazard, match=r"differs between two calls \(operation 1: .*\(1, 3\).* then .*\(2, 3\)"):
        check_capturable(step)


def test_a_step_whose_keyword_operand_changes_between_calls_is_refused():
    """The same operation whose output tensor (a keyword argument) changes dtype: recorded too."""
    w, calls = _weights().detach(), []
    outputs = [torch.empty(4, 3, device=META, dtype=dtype) for dtype in (torch.float64, torch.float32)]

    def step():
        calls.append(1)
        return (torch.mul(w, 2, out=outputs[len(calls) % 2]),)
    differs = r"operation 0: \('aten\.mul\.out', .*torch\.float32, \(4, 3\)\)\) then .*torch\.float64"
    with pytest.raises(CaptureHazard, match=differs):
        check_capturable(step)


def test_a_step_on_the_cpu_is_not_called_checked():
    w = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError) as refused:
        check_capturable(lambda: (w * 2).sum().backward())
    assert str(refused.value) == "the step ran no operation on the meta device: build its tensors there to check it."


def _compiled(source: str, filename: str):
    """The function `step` of `source`, as if it were written in the file `filename`."""
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["step"]


def test_a_hazard_is_placed_in_the_toolkit_s_code_not_in_a_virtual_environment_inside_it():
    """A library's frame under ROOT/.venv (where set-up puts the venv) is passed over for the
    toolkit's own line that called it; a hazard from no frame of the toolkit says `?`."""
    w = _weights()
    library = _compiled("def step(w):\n    return w.sum().item()\n",
                        str(ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "lib.py"))
    with pytest.raises(CaptureHazard, match=r"aten\.\S+ at tests/test_capture_check\.py:\d+: "):
        check_capturable(lambda: library(w))
    refused = []
    outside = _compiled("def step(w, check, refused):\n    try:\n        check(lambda: w.sum().item())\n"
                        "    except ValueError as e:\n        refused.append(str(e))\n", "/elsewhere/step.py")
    thread = threading.Thread(target=outside, args=(w, check_capturable, refused))  # no frame of the toolkit's
    thread.start()
    thread.join()
    assert len(refused) == 1 and re.fullmatch(r"aten\.\S+ at \?: waits for a value on the host .*", refused[0])


# ------------------------------------------------------------------ every trainer's step
AOT_RUNS = {layout: [(AoTModelConfig(d_model=8, n_heads=2, d_head=4, head_layout=layout), 0),
                     (AoTModelConfig(d_model=6, n_heads=1, d_head=8, d_mlp=4, head_layout=layout), 1)]
            for layout in ("standard", "dana")}
AOT_TASKS = {"association": AssociationTask(n_tokens=10, context=2),
             "distribution": DistributionTask(n_tokens=10, context=3, concentration=2.0)}
AOT_TRAIN = AoTTrainConfig(batch_size=32, batches=4)


@pytest.mark.parametrize("layout", AOT_RUNS)
@pytest.mark.parametrize("kind", AOT_TASKS)
def test_the_attention_only_step_is_capturable(kind, layout):
    state = prepare(AOT_TASKS[kind], AOT_RUNS[layout], AOT_TRAIN, META)
    check_capturable(state.step())


@pytest.mark.parametrize("kind", AOT_TASKS)
def test_the_step_reading_the_task_from_the_host_is_refused(kind):
    """The fixture: the step as it was on CUDA, its task's table left on the CPU and copied to
    the device inside the step (what failed under capture on an H100)."""
    task = AOT_TASKS[kind]
    state = prepare(task, AOT_RUNS["standard"], AOT_TRAIN, META)
    with pytest.raises(CaptureHazard, match=r"at tasks/association\.py:\d+: a copy from the host to the device"):
        check_capturable(population_step(state.stack, task, state.optimizer, state.data, state.order))


def _tiny(**train):
    return replace(preset("tiny"), train=replace(preset("tiny").train, **train))


FACTUAL_RECALL = {
    "tiny": _tiny(),
    "lr x seed": _tiny(lr=(1e-2, 3e-3), seed=(0, 1, 2)),
    "sgd, frozen OV": _tiny(optimizer="sgd", freeze_ov=True),
    "authors": preset("paper-tradeoff"),
    "linear, one-hot": preset("fig5-linear"),
    "two layers": replace(_tiny(), model=replace(preset("tiny").model, n_layers=2)),
    "authors, three layers": replace(preset("paper-tradeoff"), model=replace(preset("paper-tradeoff").model,
                                                                              n_layers=3)),
    "linear, one-hot, two layers": replace(preset("fig5-linear"), model=replace(preset("fig5-linear").model,
                                                                                 n_layers=2)),
    "two-hop, two layers": replace(_tiny(), task=TwoHopTaskConfig(), model=replace(preset("tiny").model, n_layers=2)),
}


@pytest.mark.parametrize("sampler", CAPTURED)
@pytest.mark.parametrize("name", FACTUAL_RECALL)
def test_the_factual_recall_step_is_capturable(name, sampler):
    run = FACTUAL_RECALL[name]
    run = replace(run, train=replace(run.train, sampler=sampler, batch_size=64, eval_size=64))
    check_capturable(_start(run, META, None).step_once.step)


def _shape_runs(d: tuple[int, ...], tasks: tuple[TaskConfig, ...], sampler: str) -> list[RunConfig]:
    train = TrainConfig(batch_size=64, eval_size=64, sampler=sampler)
    return [RunConfig(task, shape_model(1.0, 1.0, 2, size), replace(train, seed=(seed,)))
            for seed, (size, task) in enumerate(zip(d, tasks))]


SMALL, LARGER = TaskConfig(n_subjects=8, n_relations=2), TaskConfig(n_subjects=12, n_relations=3, n_noise=20)
SHAPE_STACKS = {"sizes d": ((8, 16, 12), (SMALL,) * 3), "sizes d and tasks": ((8, 16), (SMALL, LARGER))}


@pytest.mark.parametrize("sampler", CAPTURED)
@pytest.mark.parametrize("name", SHAPE_STACKS)
def test_the_shape_stack_step_is_capturable(name, sampler):
    check_capturable(_start_shapes(_shape_runs(*SHAPE_STACKS[name], sampler), META).step_once.step)


@pytest.mark.parametrize("name", ["tiny", "lr x seed", "authors", "shape stack"])
def test_the_steps_with_adam_s_triton_kernel_are_capturable(name, monkeypatch):
    """Adam as CUDA runs it (models/training/adam_kernel.py: the weights in one flat buffer, one `cat` of
    the gradients, one kernel), the kernel an operator the check sees with its operands."""
    from models.training import optimizer

    monkeypatch.setattr(optimizer, "uses_kernel", lambda device: True)
    if name == "shape stack":
        state = _start_shapes(_shape_runs(*SHAPE_STACKS["sizes d and tasks"], "counter"), META)
    else:
        run = FACTUAL_RECALL[name]
        state = _start(replace(run, train=replace(run.train, batch_size=64, eval_size=64)), META, None)
    assert state.optimizer.kernel
    check_capturable(state.step_once.step)


@pytest.mark.parametrize("body, reason", [
    (lambda w: w.detach().copy_(HOST_TABLE[None].float()), "a copy from the host to the device"),
    (lambda w: torch.empty(4, 3).copy_(w.detach()), "a copy from the device to the host (waits for the device)"),
    (lambda w: torch.ops.aten.copy(w, HOST_TABLE[None].float().expand(4, 3)), "a copy from the host to the device"),
    (lambda w: torch.ops.aten.copy(torch.empty(4, 3), w), "a copy from the device to the host (waits for the device)"),
    (lambda w: torch.searchsorted(w[0], w[1], sorter=HOST_TABLE), "a CPU tensor operand in work on the device"),
    (lambda w: torch.ops.capture_check_test.unsafe(w), "torch marks it unsafe in a CUDA graph"),
    (lambda w: w.sum().item(), "waits for a value on the host (.item(), bool(), a Python branch on a tensor, "
                               ".tolist())"),
    (lambda w: w.nonzero(), "its output's shape depends on the data"),
    (lambda w: w[w > 0], "boolean-mask indexing: its shape depends on the data"),
    (lambda w: w + torch.randn(w.shape, device=w.device), "a random draw: a replay repeats only the draws of "
                                                         "generators registered with the graph"),
], ids=["copy_ from the host", "copy_ to the host", "copy from the host", "copy to the host",
         "keyword operand on the host", "tagged unsafe", "item", "nonzero", "boolean mask", "random draw"])
def test_each_hazard_s_line_says_which_way_and_why(body, reason):
    """The whole line after the operation and the place: which way a copy goes (the in-place
    copy_ and the functional copy that functionalised code dispatches), a host tensor passed as
    a keyword argument, an operation tagged unsafe, and why the capture cannot hold it."""
    w = _weights()
    with pytest.raises(CaptureHazard) as refused:
        check_capturable(lambda: body(w))
    assert re.fullmatch(r"\w+\.\S+ at tests/test_capture_check\.py:\d+: (.*)\.", str(refused.value)).group(1) == reason


def test_a_step_whose_work_changes_between_calls_names_the_first_operation_that_differs():
    w, calls = _weights(), []

    def step():
        calls.append(1)
        x = w * 2  # operation 0: the same in both calls
        return (x + 1,) if len(calls) == 1 else (x - 1,)

    with pytest.raises(CaptureHazard, match=r"operation 1: \('aten\.add\.Tensor'.* then \('aten\.sub\.Tensor'"):
        check_capturable(step)


def test_the_fused_core_s_token_order_is_capturable():
    """The fused attention core's torch work in the backward, outside its Triton kernels:
    each model's positions sorted by token and where each entry starts (fixed shapes, no
    wait for the host), for tokens shared by heads and per head. The kernels themselves run
    only where Triton compiles (CUDA) or interprets (CPU), not on `meta`."""
    from models.cores.fused_attention import token_order

    K, H, B, T, V = 3, 4, 16, 5, 11
    meta = torch.device("meta")
    shared = torch.empty(K, 1, B, T, dtype=torch.long, device=meta).expand(K, H, B, T)
    per_head = torch.empty(K, H, B, T, dtype=torch.long, device=meta)
    for index in (shared, per_head):
        check_capturable(lambda index=index: token_order(index, V))
    with pytest.raises(CaptureHazard):  # the check would see the entries' counts read on the host
        check_capturable(lambda: token_order(per_head, V)[1].tolist())
