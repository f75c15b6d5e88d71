"""Buckets: which runs share a padded stack (none below half its stack's size, each stack
within a memory budget), and the memory estimate they rest on."""
import itertools
import math
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from models.recall.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from models.recall.shape_stack import _activation_bytes, buckets, padded_section, run_section, stack_bytes
from models.recall.shape_trainer import _start_shapes, train_stacks
from models.recall.trainer import evaluate
from tests.test_shape_stack import task_runs


def cell(S: int, d: int, H: int, d_head: int, seq_len: int = 12, seed: int = 0, steps: int = 50) -> RunConfig:
    return RunConfig(task=TaskConfig(n_subjects=S, n_relations=S, answers_per_relation=4, n_noise=2 * S,
                                     seq_len=seq_len),
                     model=ModelConfig(d_model=d, n_heads=H, d_head=d_head, d_mlp=d, parameterisation="authors"),
                     train=TrainConfig(batch_size=64, steps=steps, eval_every=5, eval_size=64, seed=(seed,),
                                       sampler="counter", device="cpu"))


# parameters 6144, 3456, 1536, 3456, 1536; d 32, 24, 16, 24, 16; V 65, 49, 33, 49, 33
CELLS = [cell(16, 32, 4, 8), cell(12, 24, 4, 6), cell(8, 16, 4, 4), cell(12, 24, 4, 6, seq_len=10),
         cell(8, 16, 4, 4, seed=1)]


def test_buckets_keep_every_run_above_half_its_stack_and_apart_from_runs_it_cannot_share_with():
    assert buckets(CELLS) == [[0, 1], [2, 4], [3]]  # 2 has a quarter of 0's parameters; 3 another seq_len
    assert buckets(CELLS[::-1]) == [[0, 2], [1], [3, 4]]  # the same stacks whatever the order given


def test_a_stack_over_the_memory_budget_is_split_before_it_starts():
    pair = stack_bytes(CELLS[:2])
    assert pair == 2 * stack_bytes(CELLS[:1])  # two models at the larger one's size
    assert buckets(CELLS, memory_budget_bytes=pair) == [[0, 1], [2, 4], [3]]
    assert buckets(CELLS, memory_budget_bytes=pair - 1) == [[0], [1], [2, 4], [3]]
    with pytest.raises(ValueError, match=r"^run 0 alone needs an estimated 0\.\d+ GiB, more than the memory budget "
                                         r"of 0\.00 GiB\.$"):
        buckets(CELLS, memory_budget_bytes=stack_bytes(CELLS[:1]) - 1)


def test_train_stacks_trains_each_bucket_as_one_stack_and_returns_the_runs_in_order():
    runs = [replace(r, train=replace(r.train, steps=3)) for r in (CELLS[2], CELLS[0], CELLS[4])]
    results = train_stacks(runs, memory_budget_bytes=stack_bytes(runs[:1]) + stack_bytes(runs[1:2]), progress=False)
    assert [r.section.d_model for r in results] == [16, 32, 16] and [r.training["seed"] for r in results] == [0, 0, 1]
    assert [r.training["stack"]["models"] for r in results] == [2, 1, 2]
    with pytest.raises(ValueError, match="alone needs an estimated"):  # refused before any training
        train_stacks(runs, memory_budget_bytes=1000, progress=False)


def _peak_bytes(step) -> int:
    """The most bytes `step` holds at once beyond what existed before it (the CPU profiler's
    allocations and frees, in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def test_the_estimate_bounds_a_step_and_an_evaluation_from_above():
    """Measured on the CPU: the step's and the evaluation's transient memory lie below their
    estimates, and within a factor of three of them (about two, measured)."""
    runs = task_runs("authors")
    state = _start_shapes(runs, torch.device("cpu"))
    state.step_once()  # the first step allocates Adam's lazily-made buffers, if any
    padded, K, cfg = padded_section([run_section(r) for r in runs]), len(state.lr), runs[0].train
    step = _peak_bytes(state.step_once)
    held_out = _peak_bytes(lambda: evaluate(state.weights, state.held_out.tokens, state.held_out.answers, "softmax",
                                            state.positional, state.query_scale))
    for measured, estimated in ((step, _activation_bytes(padded, K, cfg.batch_size, backward=True)),
                                (held_out, _activation_bytes(padded, K, cfg.eval_size, backward=False))):
        assert measured <= estimated <= 3 * measured, (measured, estimated)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("members", [[0], [0, 1], [2, 4]], ids=["one run", "two shapes", "two seeds"])
def test_the_stack_estimate_bounds_what_a_training_stack_holds_at_once(members):
    """Measured on the CPU: what the stack keeps (weights, Adam's moments, gradients kept, the
    held-out prompts) plus a step's and an evaluation's transient memory lie below
    stack_bytes, and within a factor of three of it (about two, measured)."""
    runs = [CELLS[i] for i in members]
    state = _start_shapes(runs, torch.device("cpu"))
    state.step_once()  # Adam's moments exist from here on
    kept = _bytes([*state.weights.values(), *state.optimizer.m.values(), *state.optimizer.v.values(),
                   *(p.grad for p in state.params.values() if p.grad is not None), state.held_out.tokens,
                   state.held_out.answers])
    step = _peak_bytes(state.step_once)
    held_out = _peak_bytes(lambda: evaluate(state.weights, state.held_out.tokens, state.held_out.answers, "softmax",
                                            state.positional, state.query_scale))
    measured = kept + step + held_out
    assert measured <= stack_bytes(runs) <= 3 * measured, (measured, stack_bytes(runs))


@pytest.mark.parametrize("freeze_ov", [False, True])
def test_the_estimate_counts_the_buffers_it_names(freeze_ov):
    """stack_bytes as its docstrings account for it, buffer by buffer (the tests above check
    that this accounting bounds what a stack really holds): float32 weights, and for the
    trainable ones their gradients, two Adam moments, masks and three Adam temporaries of the
    largest; int64 held-out prompts; the step's and the evaluation's activations."""
    from models.recall.shape_stack import _estimate
    from models.recall.weights import trainable_keys
    from models.section import shapes

    run = replace(CELLS[0], train=replace(CELLS[0].train, lr=(1e-2, 3e-3), freeze_ov=freeze_ov))  # K = 2, authors
    section = run_section(run)
    K, B, E, T = 2, run.train.batch_size, run.train.eval_size, section.n_ctx
    H, e, V, d, m, O = (section.n_heads, section.d_head, section.d_vocab, section.d_model, section.mlp_width,
                        section.d_vocab_out)
    size = {key: math.prod(shape) for key, shape in shapes(section).items()}
    trained = [size[key] for key in trainable_keys(size, run.model, freeze_ov)]
    assert ("blocks.0.mlp.b_in" in trainable_keys(size, run.model)) and (len(trained) < 6) == freeze_ov

    def activations(prompts: int, backward: bool) -> int:
        passes = 2 if backward else 1  # a backward doubles every buffer but the [H, B, V] attention one
        floats = (H * prompts * V  # attention over the vocabulary
                  + passes * 2 * H * prompts * T  # scores and pattern
                  + passes * 2 * H * e * V  # key and value tables
                  + passes * prompts * (4 * d + 2 * m + 2 * O + 2 * H * e))  # per prompt: residual, MLP, logits, heads
        sampling = 4 * prompts * (T + 3) * 8 if backward else 0  # int64 counters and tokens, four at once
        return K * (4 * floats + sampling)

    assert _activation_bytes(section, K, B, backward=True) == activations(B, True)
    assert _activation_bytes(section, K, E, backward=False) == activations(E, False)
    weights = sum(size.values()) + 4 * sum(trained) + 3 * max(trained)
    expected = K * 4 * weights + K * E * T * 8 + activations(B, True) + activations(E, False)
    assert stack_bytes([run]) == expected == _estimate([section], [run])


def test_runs_are_taken_largest_first_whatever_the_order_given():
    """6144, 3456 and 2048 parameters: the middle run joins the largest (taken first), which
    leaves the smallest alone; taken smallest first, the middle one would join the smallest."""
    runs = [cell(16, 32, 4, 8), cell(12, 24, 4, 6), cell(8, 16, 4, 6)]
    for order in itertools.permutations(range(3)):
        given = [runs[i] for i in order]
        expected = sorted(sorted(order.index(i) for i in members) for members in ([0, 1], [2]))
        assert buckets(given) == expected, order


def test_a_run_of_exactly_half_the_stack_s_parameters_joins_it():
    half = cell(16, 32, 2, 4)  # 4 * 2 * 4 * 32 + 2 * 32 * 32 = 3072, half of cell(16, 32, 4, 8)'s
    assert buckets([CELLS[0], half]) == [[0, 1]]


def test_a_refusal_names_the_estimate_and_the_budget_in_gib():
    big = replace(CELLS[0], train=replace(CELLS[0].train, batch_size=1 << 18, eval_size=1 << 18))
    need = stack_bytes([big])
    assert need > 2 ** 31
    with pytest.raises(ValueError) as refused:
        buckets([big], memory_budget_bytes=need // 3)
    assert str(refused.value) == (f"run 0 alone needs an estimated {need / 2 ** 30:.2f} GiB, more than the memory "
                                  f"budget of {need // 3 / 2 ** 30:.2f} GiB.")


def test_runs_that_cannot_share_a_stack_are_named_with_every_difference():
    from models.recall.shape_stack import check_stackable

    with pytest.raises(ValueError, match=r"^train_shapes needs at least one run\.$"):
        check_stackable([])
    other = replace(CELLS[1], model=replace(CELLS[1].model, attention="linear"),
                    train=replace(CELLS[1].train, batch_size=8))
    with pytest.raises(ValueError, match=r"^run 1 cannot share a stack with run 0: they differ in model\.attention, "
                                         r"train\.batch_size\.$"):
        check_stackable([CELLS[0], other])


def test_a_run_below_half_the_stack_s_vocabulary_alone_starts_its_own():
    """Parameters (3360 of 6144) and d (20 of 32) above half, the vocabulary (25 of 65) below."""
    assert buckets([CELLS[0], cell(6, 20, 4, 8)]) == [[0], [1]]


def test_the_padding_s_pieces_one_by_one(monkeypatch):
    from models.recall.shape_stack import default_budget, gradient_masks, pad, query_scales, sizes

    narrow, wide = (run_section(c) for c in (cell(8, 16, 2, 4), cell(8, 16, 4, 4)))  # they differ in H alone
    assert set(gradient_masks([narrow, wide], ["embed.W_E", "blocks.0.attn.W_Q"])) == {"blocks.0.attn.W_Q"}
    assert query_scales([narrow, wide]) is None  # one d_h: the stack's own scale
    assert query_scales([narrow, run_section(cell(8, 16, 2, 8))]).tolist() == pytest.approx([0.5, 8 ** -0.5])
    assert "d_mlp" in sizes(narrow) and "d_mlp" not in sizes(replace(narrow, attn_only=True))
    bias = pad({"unembed.b_U": torch.zeros(narrow.d_vocab_out)}, replace(narrow, d_vocab_out=narrow.d_vocab_out + 2))
    assert bias["unembed.b_U"].tolist() == [0.0] * narrow.d_vocab_out + [-math.inf] * 2  # padded answers never win
    assert default_budget(torch.device("cpu")) is None
    free = {torch.device("cuda", 1): (10 * 2 ** 30, 80 * 2 ** 30)}  # (free, total) of the device asked about
    monkeypatch.setattr(torch.cuda, "mem_get_info", free.__getitem__)
    assert default_budget(torch.device("cuda", 1)) == 8 * 2 ** 30  # 80% of the free memory


def test_train_stacks_trains_each_bucket_with_the_defaults_of_train_shapes(monkeypatch, capsys):
    """Without a budget, the first run's device gives it; progress bars and flushed subnormals
    by default, as train_shapes; a bar per stack, counting the longest run's steps."""
    asked = []
    monkeypatch.setattr("models.recall.shape_trainer.default_budget", lambda device: asked.append(device))
    monkeypatch.setenv("FACTUAL_RECALL_PROGRESS", "1")
    runs = [replace(r, train=replace(r.train, steps=s)) for r, s in ((CELLS[2], 3), (CELLS[4], 4))]
    (alone,) = train_stacks(runs[:1])
    assert asked == [torch.device("cpu")] and alone.training["subnormals"] == "flushed"
    assert "training 1 model of 1 shape: 100%" in capsys.readouterr().err
    results = train_stacks(runs, memory_budget_bytes=2 ** 40)  # given: no default asked for
    assert [r.training["steps_run"] for r in results] == [3, 4] and len(asked) == 1
    bar = capsys.readouterr().err
    assert "training 2 models of 2 shapes: 100%" in bar and "4/4" in bar
    kept = train_stacks(runs, progress=False, flush_subnormals=False)
    assert capsys.readouterr().err == "" and [r.training["subnormals"] for r in kept] == ["kept", "kept"]
