"""Models of different shapes trained as one zero-padded stack equal each model trained alone."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from models.cores.forward import last_position_logits
from models.recall.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from models.recall.shape_stack import gradient_masks, pad, padded_section, query_scales, unpad
from models.recall.shape_trainer import _cell_result, _loop_shapes, _start_shapes, train_shapes
from models.recall.trainer import train
from models.recall.weights import init_weights, stack, trainable_keys
from tests.conftest import TEST_DEVICE

SHAPES = [(4, 8, 64), (2, 4, 32), (1, 6, 16)]  # (H, d_h, m): every size differs somewhere


def models(parameterisation: str) -> list[ModelConfig]:
    return [ModelConfig(n_heads=H, d_head=dh, d_mlp=m, parameterisation=parameterisation) for H, dh, m in SHAPES]


@pytest.mark.parametrize("parameterisation", ["standard", "authors"])
def test_padded_models_compute_what_they_compute_alone(parameterisation):
    """Logits equal each model's own; the backward gives the padding exactly zero gradient
    with no mask (W_pos and the trained biases perturbed, so every path carries a value)."""
    task = RunConfig().task.build()
    g = torch.Generator().manual_seed(0)
    alone = [init_weights(model, task, seed) for seed, model in enumerate(models(parameterisation))]
    for w in alone:
        w["pos_embed.W_pos"] = 0.1 * torch.randn(w["pos_embed.W_pos"].shape, generator=g)
        w["blocks.0.mlp.b_in"] = 0.1 * torch.randn(w["blocks.0.mlp.b_in"].shape, generator=g)
    sections = [model.checkpoint_section(task) for model in models(parameterisation)]
    padded = stack([pad(w, padded_section(sections)) for w in alone])
    batch = task.sample(64, g)
    tokens = batch.tokens.expand(len(alone), -1, -1)
    params = {k: padded[k].requires_grad_() for k in trainable_keys(padded, models(parameterisation)[0])}
    logits = last_position_logits(padded, tokens, query_scale=query_scales(sections))  # [K, B, O]
    for k, w in enumerate(alone):
        torch.testing.assert_close(logits[k], last_position_logits(stack([w]), batch.tokens[None])[0],
                                   rtol=1e-5, atol=1e-5)
    F.cross_entropy(logits.flatten(0, 1), batch.answers.repeat(len(alone))).backward()
    masks = gradient_masks(sections, list(params))
    assert {"blocks.0.attn.W_Q", "blocks.0.attn.W_O", "blocks.0.mlp.W_in", "blocks.0.mlp.W_out"} <= masks.keys()
    assert ("blocks.0.mlp.b_in" in masks) == (parameterisation == "authors")  # trained only there
    for key, mask in masks.items():
        assert torch.equal(params[key].grad * (1 - mask), torch.zeros_like(mask)), key
        assert params[key].grad[mask.bool()].abs().sum() > 0, key  # the models' own entries learn


def runs(parameterisation: str) -> list[RunConfig]:
    """Three shapes: an lr sweep, another seed, and one that stops early."""
    train_ = TrainConfig(batch_size=256, steps=50, eval_every=10, eval_size=512, target_accuracy=2.0,
                         device=str(TEST_DEVICE))
    a, b, c = models(parameterisation)
    return [RunConfig(model=a, train=replace(train_, lr=(1e-2, 3e-3))),
            RunConfig(model=b, train=replace(train_, seed=(1,), steps=40)),
            RunConfig(model=c, train=replace(train_, lr=(3e-2,), eval_every=5, target_accuracy=0.3))]


@pytest.mark.parametrize("parameterisation", ["standard", "authors"])
def test_each_shape_equals_its_run_alone(parameterisation):
    together = train_shapes(runs(parameterisation), progress=False)
    assert 0 < together[2].training["steps_run"] < 50  # it stopped early, the others went on
    for run, result in zip(runs(parameterisation), together):
        alone = train(run, progress=False)
        assert result.section == alone.section
        assert result.training["steps_run"] == alone.training["steps_run"]
        assert result.training["stack"] == {"models": 4, "d_model": 32, "n_heads": 4, "d_head": 8, "d_mlp": 64,
                                            "d_vocab": 37, "d_vocab_out": 16}
        assert result.snapshots.keys() == alone.snapshots.keys()
        assert [row["step"] for row in result.metrics] == [row["step"] for row in alone.metrics]
        # Equal up to the summation order of the padded products, which Adam amplifies where a
        # gradient entry is near zero (m / sqrt(v) of a rounding error is O(1)): up to 8e-5 after
        # 40 steps on an AMD EPYC; a wrong mask, batch or learning rate moves weights by 1e-2.
        for key, value in alone.stacked.items():
            torch.testing.assert_close(result.stacked[key], value, rtol=1e-3, atol=2e-4,
                                       msg=lambda m, key=key: f"{key}: {m}")
        for mine, theirs in zip(result.metrics, alone.metrics):
            for m, t in zip(mine["models"], theirs["models"]):
                assert abs(m["loss"] - t["loss"]) < 1e-5 and abs(m["accuracy"] - t["accuracy"]) <= 1 / 512


def test_unpad_gives_back_what_pad_padded():
    task = RunConfig().task.build()
    sections = [model.checkpoint_section(task) for model in models("authors")]
    for model, section in zip(models("authors"), sections):
        w = init_weights(model, task, 0)
        padded = pad(w, padded_section(sections))
        assert padded["blocks.0.attn.W_O"].shape == (4, 8, 32) and padded["blocks.0.mlp.b_in"].shape == (64,)
        back = unpad(padded, section)
        assert all(torch.equal(back[key], t) for key, t in w.items())


def test_runs_that_differ_in_more_than_shape_and_task_are_refused():
    base = runs("standard")
    with pytest.raises(ValueError, match=r"run 1 cannot share a stack with run 0: they differ in model.attention\.$"):
        train_shapes([base[0], replace(base[1], model=replace(base[1].model, attention="linear"))], progress=False)
    with pytest.raises(ValueError, match="train.batch_size"):
        train_shapes([base[0], replace(base[1], train=replace(base[1].train, batch_size=8))], progress=False)
    with pytest.raises(ValueError, match="they differ in task.seq_len"):
        train_shapes([base[0], replace(base[1], task=replace(base[1].task, seq_len=9))], progress=False)
    generator = [replace(run, train=replace(run.train, sampler="generator")) for run in base[:2]]
    other_task = replace(generator[1], task=replace(generator[1].task, n_subjects=8))
    with pytest.raises(ValueError, match=r"a stack of tasks needs the counter sampler\)\.$"):
        train_shapes([generator[0], other_task], progress=False)


# ------------------------------------------------------------ stacks of tasks and sizes
def task_runs(parameterisation: str) -> list[RunConfig]:
    """Three cells of the capacity sweep's kind (S = R, N = S + R) that differ in S, d, H, d_h,
    m, lr and seed; the smallest task stops early."""
    train_ = TrainConfig(batch_size=256, steps=50, eval_every=10, eval_size=512, target_accuracy=2.0,
                         device=str(TEST_DEVICE), sampler="counter")
    cells = [(8, 32, 2, 8, 32, dict(lr=(1e-2, 3e-3))),
             (5, 24, 4, 4, 48, dict(lr=(3e-3,), seed=(1,), steps=40)),
             (3, 16, 1, 6, 16, dict(lr=(3e-2,), eval_every=5, target_accuracy=0.6))]
    return [RunConfig(task=TaskConfig(n_subjects=S, n_relations=S, answers_per_relation=4, n_noise=2 * S),
                      model=ModelConfig(d_model=d, n_heads=H, d_head=dh, d_mlp=m, parameterisation=parameterisation),
                      train=replace(train_, **fields_))
            for S, d, H, dh, m, fields_ in cells]


@pytest.mark.parametrize("parameterisation", ["standard", "authors"])
def test_each_task_and_size_equals_its_run_alone(parameterisation):
    together = train_shapes(task_runs(parameterisation), progress=False)
    assert 0 < together[2].training["steps_run"] < 50  # it stopped early, the others went on
    for run, result in zip(task_runs(parameterisation), together):
        alone = train(run, progress=False)
        assert result.section == alone.section and result.task.to_config() == alone.task.to_config()
        assert result.training["steps_run"] == alone.training["steps_run"]
        assert result.training["stack"] == {"models": 4, "d_model": 32, "n_heads": 4, "d_head": 8, "d_mlp": 48,
                                            "d_vocab": 33, "d_vocab_out": 32}
        assert [row["step"] for row in result.metrics] == [row["step"] for row in alone.metrics]
        for key, value in alone.stacked.items():  # frozen ones exactly: each model's own initialisation
            tolerance = dict(rtol=0, atol=0) if key not in result.training["trainable"] else dict(rtol=1e-3, atol=2e-4)
            torch.testing.assert_close(result.stacked[key], value, **tolerance, msg=lambda m, key=key: f"{key}: {m}")
        for mine, theirs in zip(result.metrics, alone.metrics):
            for m, t in zip(mine["models"], theirs["models"]):
                assert abs(m["loss"] - t["loss"]) < 1e-5 and abs(m["accuracy"] - t["accuracy"]) <= 1 / 512


@pytest.mark.parametrize("cells", [runs, task_runs], ids=["shapes", "tasks and sizes"])
def test_padding_and_its_adam_moments_stay_zero(cells):
    state = _start_shapes(cells("authors"), TEST_DEVICE)
    _loop_shapes(state, progress=False)
    sections = [c.section for c in state.cells for _ in c.run.train.runs]
    masks = gradient_masks(sections, list(state.params))
    for key, mask in masks.items():
        padding = ~mask.bool()
        for name, t in (("weight", state.params[key]), ("m", state.optimizer.m[key]), ("v", state.optimizer.v[key])):
            assert not t.detach().cpu()[padding].any(), (name, key)
    assert {"blocks.0.attn.W_Q", "blocks.0.mlp.W_out"} <= masks.keys()
    stopped = state.cells[2]
    result = _cell_result(state, stopped, "kept")  # frozen since it stopped: the weights of its last snapshot
    assert stopped.stopped == max(result.snapshots)
    for key, value in result.snapshots[stopped.stopped].items():
        assert torch.equal(result.weights[key], value), key


def test_the_padding_s_gradient_is_masked_whatever_reaches_it():
    """The trainable padding's gradients are zero in exact arithmetic; the hooks make them
    zero whatever arrives: a gradient of random values everywhere is kept on each model's own
    entries and zeroed on its padding."""
    state = _start_shapes(runs("authors"), TEST_DEVICE)
    sections = [c.section for c in state.cells for _ in c.run.train.runs]
    masks = gradient_masks(sections, list(state.params))
    g = torch.Generator().manual_seed(0)
    noise = {k: torch.rand(p.shape, generator=g).add(0.5).to(p.device) for k, p in state.params.items()}
    sum((p * noise[k]).sum() for k, p in state.params.items()).backward()
    assert {"blocks.0.attn.W_Q", "blocks.0.mlp.W_out"} <= masks.keys()
    for key, p in state.params.items():
        mask = masks.get(key, torch.ones(p.shape)).to(p.device)
        assert torch.equal(p.grad, noise[key] * mask), key


def small_runs(sampler: str) -> list[RunConfig]:
    """Three small runs, 12 steps: two shapes of one task (the generator sampler) or of three
    tasks (the counter sampler); the last stops at its first evaluation."""
    train_ = TrainConfig(batch_size=32, steps=12, eval_every=4, eval_size=64, target_accuracy=2.0,
                         snapshots_per_octave=1, device=str(TEST_DEVICE), sampler=sampler)
    cells = [(6, 16, 2, 4, 16, dict(lr=(1e-2, 3e-3))), (4, 12, 1, 6, 8, dict(seed=(1,), steps=8, eval_every=3)),
             (3, 8, 2, 2, 4, dict(lr=(3e-2,), target_accuracy=0.0))]
    return [RunConfig(task=TaskConfig(n_subjects=S if sampler == "counter" else 6, n_relations=3,
                                      answers_per_relation=4, n_noise=6, seq_len=6),
                      model=ModelConfig(d_model=d, n_heads=H, d_head=dh, d_mlp=m), train=replace(train_, **fields_))
            for S, d, H, dh, m, fields_ in cells]


# A stack pads each model to the stack's shape, so its products sum over more (zero) terms, in
# the order of another matmul blocking: torch promises the same bits for the same code and shapes
# only. Each product then rounds a few float32 ulps apart, and twelve Adam steps carry that into
# the weights (measured under three CPU personalities: one ulp of a loss near 2.4, 2.4e-7, and
# weights within a tenth of WEIGHTS): LOSS is 40 ulps of such a loss, WEIGHTS one part in 1e4; a
# wrong mask, batch or learning rate moves a loss by 1e-3 and weights by 1e-2. An accuracy may
# differ by one prediction of the evaluation batch (one whose two top logits lie within the noise).
LOSS, WEIGHTS = 1e-5, dict(rtol=1e-4, atol=1e-5)


def _within(mine, theirs, eval_size: int, where: str = "") -> None:
    """Nested training records equal: every key, count, label and setting exactly, a loss within
    LOSS, an accuracy within one prediction of `eval_size`."""
    if isinstance(theirs, dict):
        assert mine.keys() == theirs.keys(), where
        for key in theirs:
            tolerance = LOSS if "loss" in key else 1 / eval_size if "accuracy" in key else 0.0
            if tolerance and isinstance(theirs[key], float):
                assert abs(mine[key] - theirs[key]) <= tolerance, f"{where}.{key}: {mine[key]} vs {theirs[key]}"
            else:
                _within(mine[key], theirs[key], eval_size, f"{where}.{key}")
    elif isinstance(theirs, list):
        assert len(mine) == len(theirs), where
        for n, (a, b) in enumerate(zip(mine, theirs)):
            _within(a, b, eval_size, f"{where}[{n}]")
    else:
        assert mine == theirs, f"{where}: {mine!r} vs {theirs!r}"


@pytest.mark.parametrize("sampler", ["generator", "counter"], ids=["shapes", "tasks"])
def test_a_small_stack_equals_its_runs_alone(sampler):
    """As test_each_shape_equals_its_run_alone, in a few seconds: curves, early stops, snapshots and
    weights, within the padded products' rounding (LOSS, WEIGHTS)."""
    together = train_shapes(small_runs(sampler), progress=False)
    assert [r.training["steps_run"] for r in together] == [12, 8, 0]
    for run, result in zip(small_runs(sampler), together):
        alone = train(run, progress=False)
        assert result.section == alone.section and result.task.to_config() == alone.task.to_config()
        assert result.training["stack"]["models"] == 4 and result.training["stack"]["d_model"] == 16
        _within({k: v for k, v in result.training.items() if k not in ("stack", "seconds")},
                {k: v for k, v in alone.training.items() if k != "seconds"}, run.train.eval_size, "training")
        assert [row["step"] for row in result.metrics] == [row["step"] for row in alone.metrics]
        for mine, theirs in zip(result.metrics, alone.metrics):
            assert 0 <= mine["seconds"] < 600 and round(mine["seconds"], 3) == mine[
                "seconds"]  # seconds since the stack started, to the millisecond
            _within({**mine, "seconds": 0}, {**theirs, "seconds": 0}, run.train.eval_size, "metrics")
        assert result.snapshots.keys() == alone.snapshots.keys()
        for step, snapshot in alone.snapshots.items():
            for key, value in snapshot.items():
                torch.testing.assert_close(result.snapshots[step][key], value, **WEIGHTS)
        for key, value in alone.stacked.items():
            torch.testing.assert_close(result.stacked[key], value, **WEIGHTS)


@pytest.mark.parametrize("sampler", ["generator", "counter"], ids=["shapes", "tasks"])
def test_a_stack_of_one_shape_equals_its_runs_alone_bit_for_bit(sampler):
    """No padding, the same code and the same products as alone: the same bits, losses, accuracies
    and weights (whatever the number of models beside them in the stack)."""
    base = small_runs(sampler)[0]
    same = [base, replace(base, train=replace(base.train, seed=(5,), lr=(2e-2,)))]
    together = train_shapes(same, progress=False)
    for run, result in zip(same, together):
        alone = train(run, progress=False)
        assert result.training["stack"]["models"] == 3 and result.training["stack"]["d_head"] == 4
        assert {k: v for k, v in result.training.items() if k not in ("stack", "seconds")} == {
            k: v for k, v in alone.training.items() if k != "seconds"}
        assert [{**row, "seconds": 0} for row in result.metrics] == [{**row, "seconds": 0} for row in alone.metrics]
        for step, snapshot in alone.snapshots.items():
            assert all(torch.equal(result.snapshots[step][key], value) for key, value in snapshot.items()), step
        assert all(torch.equal(result.stacked[key], value) for key, value in alone.stacked.items())


def test_a_small_stack_that_diverges_stops_naming_the_step_the_model_and_the_last_snapshot():
    from models.training.divergence import TrainingDiverged

    runs = small_runs("counter")
    runs[1] = replace(runs[1], train=replace(runs[1].train, lr=(1e30,)))
    with pytest.raises(TrainingDiverged, match=r"^step \d+: model 0 of 1 \(lr=1e\+30, seed=1\) has a non-finite "
                                               r"(loss|weight [\w.]+); training stopped, the last good snapshot is "
                                               r"step \d+\.$"):
        train_shapes(runs, progress=False)
