"""The batched trainer: reaches the target, is bit-reproducible, K models = K runs."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from models.cores.forward import has_positions, last_position_logits
from models.recall.presets import preset
from models.recall.trainer import summed_loss, train, train_step
from models.recall.training_data import TrainingData
from models.recall.weights import init_weights, stack, trainable_keys
from models.training.optimizer import ADAM_BETAS, ADAM_EPS, Optimizer, bias_corrections
from models.training.result import snapshot_schedule
from tasks.factual_recall import FactualRecallTask
from tests.conftest import quick, triton_on


def test_tiny_reaches_99_percent(tiny_result):
    assert tiny_result.training["final_accuracy"] >= 0.99
    assert tiny_result.metrics[-1]["accuracy"] >= 0.99
    assert tiny_result.metrics[0]["accuracy"] < 0.5  # it learned, it did not start there


def test_one_seed_gives_identical_weights():
    run = quick(preset("tiny"), steps=25, target_accuracy=2.0)
    a, b = train(run, progress=False), train(run, progress=False)
    for key in a.weights:
        assert torch.equal(a.weights[key], b.weights[key]), key
    c = train(quick(preset("tiny"), steps=25, target_accuracy=2.0, seed=(1,)), progress=False)
    assert not torch.equal(a.weights["blocks.0.attn.W_Q"], c.weights["blocks.0.attn.W_Q"])


@pytest.mark.parametrize("sampler", ["generator", "counter"])
def test_k_models_equal_k_separate_runs(sampler):
    base = preset("tiny")
    together = train(quick(base, lr=(1e-2, 3e-3), seed=(0, 1), steps=20, target_accuracy=2.0, sampler=sampler),
                     progress=False)
    runs = [(lr, seed) for seed in (0, 1) for lr in (1e-2, 3e-3)]
    assert [(r["lr"], r["seed"]) for r in together.training["runs"]] == runs
    assert together.training["sampler"] == sampler
    for k, (lr, seed) in enumerate(runs):
        alone = train(quick(base, lr=(lr,), seed=(seed,), steps=20, target_accuracy=2.0, sampler=sampler),
                      progress=False)
        for key, value in alone.weights.items():  # equal up to the summation order of batched matmuls
            torch.testing.assert_close(together.stacked[key][k], value, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, key=key, k=k: f"model {k}, {key}: {m}")
        assert abs(together.training["runs"][k]["loss"] - alone.training["final_loss"]) < 1e-5


def test_best_model_is_kept_and_all_are_recorded():
    result = train(quick(preset("tiny"), lr=(1e-6, 1e-2), steps=60, target_accuracy=2.0), progress=False)
    assert result.training["lr"] == 1e-2 and result.training["kept_model"] == 1
    assert all(len(row["models"]) == 2 for row in result.metrics)
    assert result.metrics[-1]["accuracy"] == result.metrics[-1]["models"][1]["accuracy"]


def test_frozen_weights_do_not_move():
    run = quick(preset("tiny"), steps=10, target_accuracy=2.0, freeze_ov=True)
    result = train(run, progress=False)
    first = result.snapshots[0]
    for key in ("embed.W_E", "unembed.W_U", "blocks.0.attn.W_V", "blocks.0.attn.W_O", "blocks.0.mlp.b_in"):
        assert torch.equal(first[key], result.weights[key]), key
    for key in ("blocks.0.attn.W_Q", "blocks.0.mlp.W_in"):
        assert not torch.equal(first[key], result.weights[key]), key


def test_snapshot_schedule_is_log_spaced():
    steps = sorted(snapshot_schedule(1000, 2))
    assert steps[:5] == [0, 1, 2, 3, 4] and steps[-1] <= 1000 and 700 <= steps[-1]
    ratios = [b / a for a, b in zip(steps[4:], steps[5:])]
    assert all(1.2 < r < 1.7 for r in ratios)
    assert snapshot_schedule(1000, 0) == set()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_optimizer_step_consumes_gradients(optimizer):
    run = preset("tiny")
    task = run.task.build()
    weights = stack([init_weights(run.model, task, 0)])
    params = {k: weights[k].requires_grad_() for k in trainable_keys(weights)}
    opt = Optimizer(params, torch.tensor([0.1]), optimizer)
    batch = task.sample(64, torch.Generator().manual_seed(0))
    before = {k: p.detach().clone() for k, p in params.items()}
    train_step(weights, opt, batch.tokens[None], batch.answers[None])
    assert all(p.grad is None for p in params.values())  # nothing accumulates into the next step
    if optimizer == "sgd":  # one plain gradient-descent step: the move equals lr * gradient
        weights2 = {k: (before[k].clone().requires_grad_() if k in params else v) for k, v in weights.items()}
        loss = F.cross_entropy(last_position_logits(weights2, batch.tokens[None])[0], batch.answers)
        grads = torch.autograd.grad(loss, [weights2[k] for k in params])
        for (k, p), g in zip(params.items(), grads):
            torch.testing.assert_close(before[k] - p.detach(), 0.1 * g, rtol=1e-4, atol=1e-7)


def test_adam_matches_torch_adam_for_each_model():
    """K models in one Optimizer take the steps torch.optim.Adam takes for each alone."""
    gen = torch.Generator().manual_seed(0)
    lrs = [1e-2, 3e-4]
    ours = {"a": torch.randn(2, 3, 4, generator=gen), "b": torch.randn(2, 5, generator=gen)}
    alone = [[ours[k][i].clone().requires_grad_() for k in ours] for i in range(2)]
    reference = [torch.optim.Adam(params, lr=lr) for params, lr in zip(alone, lrs)]
    opt = Optimizer(ours, torch.tensor(lrs), "adam")
    for _ in range(5):
        grads = {k: torch.randn(p.shape, generator=gen) for k, p in ours.items()}
        for key, p in ours.items():
            p.grad = grads[key].clone()
        opt.step()
        for i, (params, ref) in enumerate(zip(alone, reference)):
            for key, p in zip(ours, params):
                p.grad = grads[key][i].clone()
            ref.step()
    for i, params in enumerate(alone):
        for key, p in zip(ours, params):
            torch.testing.assert_close(ours[key][i], p.detach(), rtol=1e-6, atol=1e-8)
    assert not torch.allclose(ours["a"][0], alone[1][0])  # the two learning rates differ


def python_float_adam(params: dict, m: dict, v: dict, lr: torch.Tensor, t: int, grads: dict) -> None:
    """One Adam step as the trainer computed it before its step count moved to the device:
    the bias corrections in Python floats (float64), each tensor in place."""
    b1, b2 = ADAM_BETAS
    for key, p in params.items():
        g, lr_k = grads[key], lr.view(-1, *([1] * (p.dim() - 1)))
        m[key].lerp_(g, 1 - b1)
        v[key].mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v[key].sqrt() / math.sqrt(1 - b2 ** t)).add_(ADAM_EPS)
        p.sub_(lr_k / (1 - b1 ** t) * m[key] / denom)


@pytest.mark.parametrize("first_step", [1, 38_100])  # from the start, and across the end of the table
def test_adam_is_bit_identical_to_the_python_float_formulas(first_step):
    gen = torch.Generator().manual_seed(0)
    lr = torch.tensor([1e-2, 3e-4])
    ours = {"a": torch.randn(2, 3, 4, generator=gen), "b": torch.randn(2, 5, generator=gen)}
    reference = {k: p.clone() for k, p in ours.items()}
    m, v = ({k: torch.zeros_like(p) for k, p in ours.items()} for _ in range(2))
    opt = Optimizer(ours, lr, "adam")
    opt.t.fill_(first_step - 1)
    for t in range(first_step, first_step + 50):
        grads = {k: torch.randn(p.shape, generator=gen) for k, p in ours.items()}
        for key, p in ours.items():
            p.grad = grads[key].clone()
        opt.step()
        python_float_adam(reference, m, v, lr, t, grads)
    assert int(opt.t) == first_step + 49
    for key in ours:
        assert torch.equal(ours[key], reference[key]) and torch.equal(opt.m[key], m[key]), key


def test_bias_correction_table_ends_where_both_corrections_are_one():
    table = bias_corrections()  # [n, 2] float32
    b1, b2 = ADAM_BETAS
    assert table[0].tolist() == [torch.tensor(1 - b1).item(), torch.tensor(math.sqrt(1 - b2)).item()]
    assert table[-1].tolist() == [1.0, 1.0] and 1 - b1 ** 10 ** 6 == 1 - b2 ** 10 ** 6 == 1.0
    assert len(table) == 38_105


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_step_updates_device_tensors_in_place(optimizer):
    """What a CUDA graph would replay: the step rebinds no attribute and moves no tensor;
    its only per-step state, the step count, is a tensor counted up in place."""
    gen = torch.Generator().manual_seed(0)
    params = {"a": torch.randn(2, 3, 4, generator=gen), "b": torch.randn(2, 5, generator=gen)}
    opt = Optimizer(params, torch.tensor([1e-2, 3e-4]), optimizer)

    def tensors():
        found = {name: value for name, value in vars(opt).items() if isinstance(value, torch.Tensor)}
        found.update({f"{name}.{key}": t for name, value in vars(opt).items() if isinstance(value, dict)
                      for key, t in value.items()})
        return {name: (t, t.data_ptr()) for name, t in found.items()}

    before, attributes = tensors(), dict(vars(opt))
    for _ in range(3):
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    after = tensors()
    assert after.keys() == before.keys() and {"t", "params.a", "lr.b"} <= after.keys()
    assert all(after[name][0] is t and after[name][1] == ptr for name, (t, ptr) in before.items())
    assert all(vars(opt)[name] is value for name, value in attributes.items())
    assert int(opt.t) == 3


class _HostSyncs(TorchDispatchMode):
    """Records the ops that make the host wait for a GPU: reading a value (.item(), bool(),
    float()) or a shape that depends on values (nonzero, masked_select, unique)."""
    SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2",
               "aten::unique_dim", "aten::unique_consecutive"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.SYNCING:
            self.calls.append(func._schema.name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("core", ["vocab", pytest.param("fused", marks=triton_on("cpu"))])
@pytest.mark.parametrize("sampler", ["generator", "counter"])
@pytest.mark.parametrize("variant", ["uniform", "zipf, two seeds, positions"])
def test_training_step_never_waits_for_the_device(variant, sampler, core):
    """The hot loop (a fresh batch, forward, backward, Adam) reads no value back to the host,
    so on a GPU steps queue without a synchronisation; checked on the CPU by the ops it runs."""
    run = preset("tiny")
    # a small vocabulary, context and batch: the Triton interpreter runs each program of the fused core
    # (per vocabulary entry or block of 16 prompts, head and model) in Python
    task = FactualRecallTask(4, 2, 2, 2, 6)
    seeds = (0,)
    if variant != "uniform":
        task = FactualRecallTask(task.n_subjects, task.n_relations, task.answers_per_relation, task.n_noise,
                                 task.seq_len, subject_zipf=1.1, relation_zipf=0.5)
        seeds = (0, 1)
    runs = [(1e-2, s) for s in seeds]
    weights = stack([init_weights(run.model, task, s) for s in seeds])
    if variant != "uniform":
        shape = weights["pos_embed.W_pos"].shape
        weights["pos_embed.W_pos"] = 0.1 * torch.randn(shape, generator=torch.Generator().manual_seed(0))
    params = {k: weights[k].requires_grad_() for k in trainable_keys(weights)}
    opt = Optimizer(params, torch.tensor([lr for lr, _ in runs]), "adam")
    data = TrainingData(task, runs, 16, torch.device("cpu"), sampler)
    positional = has_positions(weights)  # once per run, outside the loop
    with _HostSyncs() as syncs:
        for step in range(2):
            tokens, answers = data.batch(opt.t if sampler == "counter" else step)  # the device's step count
            loss = train_step(weights, opt, tokens, answers, positional=positional, attention_core=core)
    assert syncs.calls == []
    with _HostSyncs() as syncs:  # the recorder does see a read-back
        bool(loss > 0)
    assert syncs.calls == ["aten::_local_scalar_dense"]


def test_a_stack_of_tasks_and_sizes_steps_without_waiting_for_the_device():
    """The padded stack's step (per-task counter batches, -inf answer padding, gradient masks,
    per-model query scales) reads nothing back to the host either."""
    from models.recall.shape_trainer import _start_shapes
    from tests.test_shape_stack import task_runs

    state = _start_shapes(task_runs("authors"), torch.device("cpu"))
    assert state.query_scale is not None  # every part of the padded step runs
    with _HostSyncs() as syncs:
        for _ in range(2):
            loss, = state.step_once()
    assert syncs.calls == [] and int(state.optimizer.t) == 2 and bool(loss.isfinite())


def test_override_refuses_unknown_fields():
    from models.cli import override
    from models.recall.config import ModelConfig
    assert override(ModelConfig(), {"n_heads": 2}).n_heads == 2
    with pytest.raises(ValueError, match="ModelConfig has no field 'freeze_ov'"):
        override(ModelConfig(), {"freeze_ov": True})


@pytest.mark.parametrize("K,B,O", [(1, 1024, 256), (64, 128, 16), (3, 37, 11)])
def test_the_summed_loss_is_cross_entropy_with_the_same_gradient_bits(K, B, O):
    """summed_loss: each model's mean cross-entropy, summed over models, equal to
    F.cross_entropy's; its gradient the same bits as cross_entropy's (the loss is written
    without CUDA's one-block nll_loss, the training must not change)."""
    g = torch.Generator().manual_seed(K)
    logits = (3 * torch.randn(K, B, O, generator=g)).requires_grad_()
    answers = torch.randint(0, O, (K, B), generator=g)
    ours = summed_loss(logits, answers)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    reference = F.cross_entropy(logits.flatten(0, 1), answers.flatten(), reduction="sum") / B
    (reference_grad,) = torch.autograd.grad(reference, logits)
    per_model = torch.stack([F.cross_entropy(logits[k], answers[k]) for k in range(K)]).sum()
    assert torch.allclose(ours, per_model, rtol=1e-6) and torch.allclose(ours, reference, rtol=1e-6)
    assert torch.equal(ours_grad, reference_grad)
