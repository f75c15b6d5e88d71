"""The fused attention core (Triton, interpreted on the CPU) equals the vocabulary core and
autograd: outputs and every gradient, in float64 and float32."""
import json
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from bench.core_cost import core_cost
from bench.step_kernels import Kernels
from models.cores import forward, fused_attention
from models.cores.forward import VocabAttention, choose_core, last_position_logits
from models.cores.fused_attention import FusedAttention
from models.recall.config import ModelConfig
from models.recall.weights import init_weights, stack
from tasks.factual_recall import FactualRecallTask
from tests.conftest import TEST_DEVICE, triton_on

needs_fused = triton_on(TEST_DEVICE)
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


def _inputs(dtype, positional, K=2, H=3, E=5, B=21, V=6, T=7):
    """q [K, H, e, B], tables [K, H, e, V], index [K, H, B, T] (tokens expanded over heads, as
    models.cores.forward passes them), positional scores [K, H, B, T] or None; B not a multiple of
    the kernel's block and T not a power of two, so the masks are exercised; each size its own, so
    no two axes can be confused (small: Triton's interpreter runs each program in Python)."""
    g = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).to(TEST_DEVICE).requires_grad_()
    tokens = torch.randint(0, V, (K, B, T), generator=g).to(TEST_DEVICE)
    score_pos = leaf(K, H, B, T) if positional else None
    return leaf(K, H, E, B), leaf(K, H, E, V), leaf(K, H, E, V), tokens[:, None].expand(K, H, B, T), score_pos


def _outputs_and_gradients(core, inputs, linear, use_pattern, use_z=True):
    """z, pattern and the gradients of every input under a fixed weighted sum of the outputs
    (the pattern's term left out unless `use_pattern`, z's unless `use_z`: then that output's
    gradient is None); an input the loss does not reach has a zero gradient."""
    leaves = [x for x in inputs if x is not None and x.requires_grad]
    for x in leaves:
        x.grad = None
    z, pattern = core(*inputs, linear)

    def weighted(output, start, end):
        return (output * torch.linspace(start, end, output.numel(), dtype=z.dtype, device=z.device)
                .view_as(output)).sum()
    terms = ([weighted(z, -1, 1)] if use_z else []) + ([weighted(pattern, 2, -1)] if use_pattern else [])
    sum(terms).backward()
    return [z.detach(), pattern.detach()] + [torch.zeros_like(x) if x.grad is None else x.grad.clone()
                                             for x in leaves]


@needs_fused
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("positional", [False, True], ids=["no-pos", "pos"])
@pytest.mark.parametrize("linear", [False, True], ids=["softmax", "linear"])
@pytest.mark.parametrize("use_pattern", [False, True], ids=["z", "z+pattern"])
def test_fused_core_equals_vocabulary_core_and_autograd(dtype, positional, linear, use_pattern):
    inputs = _inputs(dtype, positional)
    fused = _outputs_and_gradients(fused_attention.FusedAttention.apply, inputs, linear, use_pattern)
    references = {"vocabulary core": _outputs_and_gradients(VocabAttention.apply, inputs, linear, use_pattern),
                  "autograd": _outputs_and_gradients(fused_attention.per_token_attention, inputs, linear, use_pattern)}
    for name, reference in references.items():
        assert len(fused) == len(reference)
        for ours, theirs in zip(fused, reference):
            scale = max(1.0, theirs.abs().max().item())
            assert (ours - theirs).abs().max().item() <= TOLERANCE[dtype] * scale, name


@needs_fused
@pytest.mark.parametrize("linear", [False, True], ids=["softmax", "linear"])
def test_fused_core_with_a_loss_on_the_pattern_alone(linear):
    """z unused (its gradient None in the backward): the query's, the key table's and the
    positional scores' gradients come from the pattern's alone, the value table's are zero,
    as the vocabulary core's and autograd's."""
    inputs = _inputs(torch.float64, True)
    fused = _outputs_and_gradients(fused_attention.FusedAttention.apply, inputs, linear, True, use_z=False)
    assert fused[2].abs().max() > 0 and fused[4].abs().max() == 0  # q moves, the value table does not
    for core in (VocabAttention.apply, fused_attention.per_token_attention):
        reference = _outputs_and_gradients(core, inputs, linear, True, use_z=False)
        for ours, theirs in zip(fused, reference, strict=True):
            assert (ours - theirs).abs().max().item() <= 1e-12 * max(1.0, theirs.abs().max().item())


def test_the_fused_core_refuses_a_device_it_cannot_run_on_in_one_line():
    q = torch.zeros(1, 1, 2, 3, device="meta")
    with pytest.raises(ValueError) as refused:
        fused_attention._launch("forward", (1, 1, 1), q)
    assert str(refused.value) == ("the fused attention core cannot run on meta here (it needs Triton, and CUDA "
                                  "tensors, or CPU tensors in a process without a GPU)")


@needs_fused
@pytest.mark.parametrize("per_head", [False, True], ids=["tokens-shared-by-heads", "tokens-per-head"])
def test_fused_core_is_exact_over_long_runs_of_one_entry_and_absent_entries(per_head):
    """The tables' kernel walks each entry's positions in blocks of BLOCK_N: an entry held at
    more positions than two blocks, entries held nowhere, heads of size 8, and tokens either
    shared by every head (one order per model) or drawn per head; the table gradients equal
    the vocabulary core's and autograd's."""
    K, H, B, T, V = 2, 3, 70, 9, 13
    q, key, value, index, score_pos = _inputs(torch.float64, True, K=K, H=H, E=8, B=B, V=V, T=T)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V - 5, (K, H if per_head else 1, B, T), generator=g)  # the last 5 entries absent
    tokens[..., ::2] = 7  # entry 7 at about half of all positions: B * T / 2 > 2 * BLOCK_N
    assert (tokens == 7).sum(dim=(-2, -1)).min() > 2 * fused_attention.BLOCK_N
    index = tokens.to(TEST_DEVICE).expand(K, H, B, T)
    inputs = (q, key, value, index, score_pos)
    fused = _outputs_and_gradients(fused_attention.FusedAttention.apply, inputs, False, True)
    for core in (VocabAttention.apply, fused_attention.per_token_attention):
        for ours, theirs in zip(fused, _outputs_and_gradients(core, inputs, False, True), strict=True):
            assert (ours - theirs).abs().max().item() <= 1e-12 * max(1.0, theirs.abs().max().item())


@needs_fused
def test_token_order_lists_each_entrys_positions_in_order():
    """token_order: entry v's positions b * T + t, ascending, at order[starts[v]:starts[v + 1]];
    one order per model when the tokens are shared by every head, one per head otherwise."""
    tokens = torch.tensor([[[[2, 0, 2], [1, 2, 0]]]])  # [K=1, 1, B=2, T=3]
    order, starts = fused_attention.token_order(tokens.expand(1, 4, 2, 3), V=4)
    assert order.shape == (1, 1, 6) and starts.tolist() == [[[0, 2, 3, 6, 6]]]
    assert order[0, 0].tolist() == [1, 5, 3, 0, 2, 4]  # entry 0 at 1, 5; entry 1 at 3; entry 2 at 0, 2, 4
    per_head = torch.stack([tokens[0, 0], 3 - tokens[0, 0]])[None]  # [1, 2, 2, 3]: two heads, own tokens
    order, starts = fused_attention.token_order(per_head, V=4)
    assert order.shape == (1, 2, 6) and starts[0, 1].tolist() == [0, 0, 3, 4, 6]


class _Launches(Kernels):
    """Kernels (bench/step_kernels.py) that also counts the fused core's Triton launches (not
    the aten operations Triton's interpreter runs inside one), and global atomics: CUDA's
    scatter_add_ (one per source element) and the elements of every tl.atomic_add."""

    def __init__(self):
        super().__init__()
        self.atomics, self.inside = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.inside:
            return func(*args, **(kwargs or {}))
        if func._schema.name == "aten::scatter_add_":
            self.atomics += args[3].numel()
        return super().__torch_dispatch__(func, types, args, kwargs)

    def launch(self, real):
        def counted(kernel, *args, **meta):
            self.ops[f"triton::{kernel}"] += 1
            self.inside = True
            try:
                return real(kernel, *args, **meta)
            finally:
                self.inside = False
        return counted

    def atomic_rmw(self, real):
        def counted(builder, op, ptr, val, mask, *rest):
            self.atomics += int(mask.data.sum())
            return real(builder, op, ptr, val, mask, *rest)
        return counted


@needs_fused
@pytest.mark.parametrize("core", ["vocab", "fused"])
def test_the_cost_report_counts_the_kernels_launched_and_their_atomics(core):
    """bench/core_cost.py's launches and global atomics of each core equal those counted while
    the core runs a forward and backward on the CPU (the fused kernels in Triton's
    interpreter): the fused core adds no atomics, the vocabulary core one per scatter_add_
    source element."""
    from triton.runtime.interpreter import InterpreterBuilder

    K, H, E, B, V, T = 2, 3, 5, 21, 6, 7
    inputs = _inputs(torch.float32, False, K, H, E, B, V, T)
    apply = VocabAttention.apply if core == "vocab" else fused_attention.FusedAttention.apply
    z, _ = apply(*inputs, False)
    d_z = torch.ones_like(z)
    counter = _Launches()
    with mock.patch.object(fused_attention, "_launch", counter.launch(fused_attention._launch)), \
            mock.patch.object(InterpreterBuilder, "create_atomic_rmw", counter.atomic_rmw(
                InterpreterBuilder.create_atomic_rmw)), counter:
        z, _ = apply(*inputs, False)
        z.backward(d_z)
    cost = core_cost(core, K, H, E, B, V, T)
    assert sum(counter.ops.values()) == cost["launches"], counter.ops
    assert counter.atomics == cost["atomics"]


@needs_fused
def test_fused_core_gives_the_model_the_same_logits_and_gradients():
    """last_position_logits with either core: the same logits and weight gradients, with a
    positional embedding (so the positional scores' gradient is used too)."""
    task = FactualRecallTask(12, 4, 3, 10, 9)
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40)
    g = torch.Generator().manual_seed(1)
    w = stack([{k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in init_weights(model, task, s).items()}
               for s in (0, 1)])
    batch = task.sample(40, torch.Generator().manual_seed(2))
    results = []
    for core in ("vocab", "fused"):
        params = {k: v.to(TEST_DEVICE).requires_grad_() for k, v in w.items()}
        tokens = batch.tokens.to(TEST_DEVICE).expand(2, -1, -1)
        logits = last_position_logits(params, tokens, positional=True, attention_core=core)  # [2, B, O]
        F.cross_entropy(logits.flatten(0, 1), batch.answers.to(TEST_DEVICE).repeat(2)).backward()
        results.append({"logits": logits.detach(), **{k: p.grad for k, p in params.items() if p.grad is not None}})
    assert results[0].keys() == results[1].keys() and "blocks.0.attn.W_K" in results[0]
    for key, vocab in results[0].items():
        assert torch.allclose(results[1][key], vocab, atol=1e-5, rtol=1e-4), key


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """A GPU's measured record: the fused core faster at a big stack, slower at a small step."""
    record = tmp_path / "measured.json"
    record.write_text(json.dumps({
        "big": {"buffer_elements": 10**9, "steps_per_second": {"vocab": 40.0, "fused": 80.0}},
        "small": {"buffer_elements": 10**6, "steps_per_second": {"vocab": 2700.0, "fused": 900.0}},
        "one core": {"buffer_elements": 10**8, "steps_per_second": {"vocab": 1.0}},
        "a rate": {"model_steps_per_second": 6827}}))
    monkeypatch.setattr(forward, "MEASURED", record)
    monkeypatch.setattr(forward.fused_attention, "runs_on", lambda device: True)
    forward.measured_cores.cache_clear()
    yield
    forward.measured_cores.cache_clear()


def test_auto_takes_the_core_a_gpu_measured_faster_at_the_nearest_line(measured):
    """On CUDA, `auto` follows the measured record at the line nearest the step's [K, H, B, V]
    elements (lines that timed one core only do not count); the CPU keeps the vocabulary core."""
    cuda = torch.device("cuda")
    assert choose_core("auto", cuda, 5 * 10**8) is FusedAttention
    assert choose_core("auto", cuda, 2 * 10**6) is VocabAttention
    assert choose_core("auto", cuda) is VocabAttention  # the step's size not given
    assert choose_core("auto", torch.device("cpu"), 10**9) is VocabAttention
    assert choose_core("vocab", cuda, 10**9) is VocabAttention


def test_the_core_is_chosen_by_device(monkeypatch):
    """Without a measured record every device keeps the vocabulary core unless the fused one
    is asked for; names are checked."""
    monkeypatch.setattr(forward, "measured_cores", lambda: ())
    assert choose_core("auto", torch.device("cpu")) is VocabAttention
    assert choose_core("auto", torch.device("cuda"), 10**9) is VocabAttention
    assert choose_core("vocab", torch.device("cpu")) is VocabAttention
    with pytest.raises(ValueError, match="attention core must be one of auto, vocab, fused, got 'flash'"):
        choose_core("flash", torch.device("cpu"))
