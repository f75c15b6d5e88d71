"""Adam's update as one Triton kernel (models/training/adam_kernel.py, run by Triton's interpreter on the
CPU) equals the torch form of models.training.optimizer bit for bit where the square root is correctly
rounded and lerp and addcmul round once (torch's own square root on the CPU is not correctly rounded:
one ulp off on about 0.7% of inputs; a CPU without FMA rounds lerp and addcmul twice; there the two
agree within the ulps that follow): weights and both moments, several parameters of odd sizes, a learning rate
per model (one of them zero), and steps past the end of the bias-correction table; the weights
keep their tensors; the capture check sees the kernel."""
import pytest
import torch

from models.training import optimizer as optim
from models.training.capture_check import CaptureHazard, check_capturable
from models.training.optimizer import Optimizer
from tests.conftest import TEST_DEVICE, triton_on

needs_triton = triton_on(TEST_DEVICE)
SHAPES = {"W_Q": (3, 2, 5, 7), "b_Q": (3, 1), "W_in": (3, 700), "W_out": (3, 33, 41)}  # [K, ...], K = 3


def _pair(device=TEST_DEVICE):
    """Two optimizers on equal copies of the same weights: the torch form and the kernel."""
    g = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(shape, generator=g).to(device) for k, shape in SHAPES.items()}
    lr = torch.tensor([1e-2, 3e-3, 0.0], device=device)
    made = []
    for kernel in (False, True):
        params = {k: w.clone().requires_grad_() for k, w in weights.items()}
        made.append((params, Optimizer(params, lr.clone(), "adam", kernel=kernel)))
    return made, g


def _step(made, g):
    grads = {k: torch.randn(shape, generator=g) * 10.0 ** torch.randint(-6, 1, (), generator=g) for k, shape in
             SHAPES.items()}
    for params, opt in made:
        for k, p in params.items():
            p.grad = grads[k].to(p.device)
        opt.step()


def _rounded_sqrt(tensors):
    """Correctly rounded float32 square roots (float64's, rounded: exact for a square root)."""
    return [t.double().sqrt().float() for t in tensors]


def _fma(a, b, c):
    """a b + c of float32 tensors rounded once to float32: a b is exact in float64, the sum is
    rounded to odd there (its exact error by TwoSum), and 53 >= 2 * 24 + 2 bits make the
    final rounding to float32 correct."""
    p, c = a.double() * b.double(), c.double()
    s = p + c
    back = s - p
    error = (p - (s - back)) + (c - back)  # p + c = s + error exactly
    inexact_even = (error != 0) & (s.view(torch.int64) % 2 == 0)
    toward = torch.where(error > 0, torch.inf, -torch.inf).double()
    return torch.where(inexact_even, torch.nextafter(s, toward), s).float()


def _fused_lerp_(tensors, ends, weight):
    """torch.lerp at a weight below 0.5 as one fma, m + w (g - m), whatever the CPU's vector unit
    (without FMA, ATen's default kernel rounds the product and the sum apart)."""
    w = torch.tensor(weight, dtype=torch.float32)
    for m, g in zip(tensors, ends):
        m.copy_(_fma(w.expand_as(m), g - m, m))


def _fused_addcmul_(tensors, t1, t2, value):
    """addcmul as v + (c g) g rounded once (see _fused_lerp_)."""
    c = torch.tensor(value, dtype=torch.float32)
    for v, a, b in zip(tensors, t1, t2):
        v.copy_(_fma(c * a, b, v))


@needs_triton
@pytest.mark.skipif(TEST_DEVICE.type != "cpu", reason="Triton's interpreter against the CPU's torch form")
def test_the_kernel_equals_the_torch_form_with_a_rounded_square_root_bit_for_bit(monkeypatch):
    for name, form in (("_foreach_sqrt", _rounded_sqrt), ("_foreach_lerp_", _fused_lerp_),
                       ("_foreach_addcmul_", _fused_addcmul_)):
        monkeypatch.setattr(torch, name, form)
    made, g = _pair()
    (torch_params, torch_opt), (kernel_params, kernel_opt) = made
    kept = {k: p for k, p in kernel_params.items()}
    for _ in range(4):
        _step(made, g)
    for opt in (torch_opt, kernel_opt):  # on past the table's last row (t = 38,105): it stays there
        opt.t.fill_(len(opt.corrections) - 2)
        opt.stop(1)  # model 1 dropped (models.training.divergence): frozen from here
    stopped = {k: p[1].clone() for k, p in kernel_params.items()}
    for _ in range(3):
        _step(made, g)
    assert all(torch.equal(kernel_params[k][1], w) for k, w in stopped.items())
    assert torch_opt.kernel is False and kernel_opt.kernel is True
    for k in SHAPES:
        for a, b in ((torch_params[k], kernel_params[k]), (torch_opt.m[k], kernel_opt.m[k]),
                     (torch_opt.v[k], kernel_opt.v[k])):
            assert torch.equal(a, b), k
        assert kernel_params[k] is kept[k] and kernel_params[k].grad is None  # the same tensors, gradients released
        assert kernel_params[k].untyped_storage().data_ptr() == kernel_opt.flat.untyped_storage().data_ptr()
    assert not torch.equal(kernel_params["W_in"][0], _pair()[0][1][0]["W_in"][0])  # it trained
    assert torch.equal(kernel_params["W_in"][2], _pair()[0][1][0]["W_in"][2])  # lr 0: untouched


@needs_triton
def test_the_kernel_agrees_with_torch_s_own_form_to_its_square_root_s_ulp():
    """Against the torch form as it runs (the CPU's square root, one ulp off at times; a CPU
    without FMA rounds lerp's and addcmul's product and sum apart; on CUDA, foreach addcmul rounds
    c (g g) where the CPU and the kernel round (c g) g). Each step's update then differs by a few
    ulps of itself (|update| <= lr (1 - b1) / sqrt(1 - b2) < 4 lr) and the new weight by one ulp
    of itself: after t steps, |Δw| <= t eps (|w| + 4 lr), and the second moment, two roundings a
    step, |Δv| <= 2 t eps |v|."""
    steps, eps = 7, torch.finfo(torch.float32).eps
    made, g = _pair()
    for _ in range(steps):
        _step(made, g)
    (torch_params, torch_opt), (kernel_params, kernel_opt) = made
    lr = torch_opt.lr
    for k in SHAPES:
        w, rate = torch_params[k].detach(), lr[k].to(TEST_DEVICE)  # [K, ...], [K, 1, ...]
        assert ((kernel_params[k].detach() - w).abs() <= steps * eps * (w.abs() + 4 * rate)).all(), k
        assert ((kernel_opt.v[k] - torch_opt.v[k]).abs() <= 2 * steps * eps * torch_opt.v[k]).all(), k
        assert torch.equal(kernel_params[k][2], w[2]), k  # lr 0: exactly untouched


@needs_triton
def test_the_kernel_is_one_operation_the_capture_check_sees():
    from bench.step_kernels import Kernels

    made, g = _pair()
    params, opt = made[1]
    for p in params.values():
        p.grad = torch.ones_like(p)
    with Kernels() as counted:
        opt.step()
    assert dict(counted.ops) == {"aten::add_": 1, "aten::cat": 1, "factual_recall::adam_step": 1}


def _meta_step(table_on_host: bool):
    meta = torch.device("meta")
    params = {k: torch.zeros(shape, device=meta).requires_grad_() for k, shape in SHAPES.items()}
    opt = Optimizer(params, torch.full((3,), 1e-2, device=meta), "adam", kernel=True)
    if table_on_host:
        opt.corrections = optim.bias_corrections()

    def step():
        loss = sum((p * 2).square().sum() for p in params.values())
        loss.backward()
        opt.step()
        return (loss.detach(),)
    return step


def test_the_kernel_s_step_passes_the_capture_check_and_a_table_left_on_the_host_is_refused():
    check_capturable(_meta_step(table_on_host=False))
    hazard = r"factual_recall\.adam_step.* at models/training/optimizer\.py:\d+: a CPU tensor"
    with pytest.raises(CaptureHazard, match=hazard):
        check_capturable(_meta_step(table_on_host=True))


def test_the_kernel_is_the_default_on_cuda_only(monkeypatch):
    assert not optim.uses_kernel(torch.device("cpu"))  # on the CPU the torch form: nothing changes there
    monkeypatch.setattr(optim.triton_kernels, "runs_on", lambda device: True)
    assert optim.uses_kernel(torch.device("cuda")) and not optim.uses_kernel(torch.device("cpu"))


def test_adamw_asked_for_the_kernel_equals_torch_s_adamw():
    """The Adam kernel has no weight decay: AdamW must keep the torch form even where the kernel is asked
    for. Each model (its own learning rate) against torch.optim.AdamW on its slice, five steps, weight
    decay 0.5: the same to an ulp or two (5e-7; the Adam kernel, no decay, would be 0.13 off). No Triton
    needed: the torch form runs anywhere (a kernel taking AdamW would fail without Triton, or differ)."""
    g = torch.Generator().manual_seed(0)
    shapes = {"W_in": (3, 40), "W_out": (3, 7, 5)}
    weights = {k: torch.randn(shape, generator=g) for k, shape in shapes.items()}
    lr = [1e-2, 3e-3, 2e-2]
    params = {k: w.clone().to(TEST_DEVICE).requires_grad_() for k, w in weights.items()}
    opt = Optimizer(params, torch.tensor(lr, device=TEST_DEVICE), "adam", weight_decay=0.5, kernel=True)
    reference = [{k: w[i].clone().requires_grad_() for k, w in weights.items()} for i in range(3)]
    torch_opts = [torch.optim.AdamW(list(r.values()), lr=lr[i], betas=optim.ADAM_BETAS, eps=optim.ADAM_EPS,
                                    weight_decay=0.5) for i, r in enumerate(reference)]
    for _ in range(5):
        grads = {k: torch.randn(shape, generator=g) for k, shape in shapes.items()}
        for k, p in params.items():
            p.grad = grads[k].to(TEST_DEVICE)
        opt.step()
        for i, (r, torch_opt) in enumerate(zip(reference, torch_opts)):
            for k, p in r.items():
                p.grad = grads[k][i].clone()
            torch_opt.step()
    for k in shapes:
        torch.testing.assert_close(params[k].detach().cpu(), torch.stack([r[k].detach() for r in reference]),
                                   rtol=1e-5, atol=1e-6)
