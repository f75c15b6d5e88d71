"""Adam's update of every trainable weight as one Triton kernel (models.training.optimizer launches it on
CUDA): the weights, gradients and moments of all parameters lie in flat buffers, and each
program updates one block of one parameter, whose models' learning rates it reads from the
[K] tensor (each parameter is [K, ...]: element i belongs to model i // (its elements / K)).
The step count is read from the device, so a replayed CUDA graph takes the next correction.

The arithmetic is models.training.optimizer's torch form, operation by operation in float32 and with
its roundings: torch.lerp rounds m + w (g - m) once (an fma), addcmul rounds v + (c g) g once,
divisions and the square root are correctly rounded (`div_rn`, `sqrt_rn`: Triton's `/` is an
approximation on CUDA), and nothing else is fused (the launch turns fp fusion off). In
Triton's interpreter it equals the torch form on the CPU bit for bit
(tests/test_adam_kernel.py)."""
import triton
import triton.language as tl


@triton.jit
def adam(weights, grads, m, v, lr, step, corrections, n_corrections, blocks, w1, b2, w2, eps,
         BLOCK: tl.constexpr):
    """One block: `blocks` row pid (int64) = the block's first element, the end of its
    parameter, the parameter's first element and its elements per model (flat indices);
    `step` points at the step count t (already counted up), `corrections` at the [n, 2] table
    (1 - b1^t, sqrt(1 - b2^t)); w1 = 1 - b1 and w2 = 1 - b2 as the torch form rounds them."""
    row = blocks + tl.program_id(0) * 4
    start, end, first, per_model = tl.load(row), tl.load(row + 1), tl.load(row + 2), tl.load(row + 3)
    i = start + tl.arange(0, BLOCK)  # [BLOCK] flat indices
    inside = i < end
    t = tl.minimum(tl.load(step), n_corrections) - 1  # later steps read the table's last row
    c1 = tl.load(corrections + 2 * t)
    c2 = tl.load(corrections + 2 * t + 1)
    rate = tl.load(lr + (i - first) // per_model, mask=inside, other=0.0)
    g = tl.load(grads + i, mask=inside, other=0.0)
    first = tl.load(m + i, mask=inside, other=0.0)
    second = tl.load(v + i, mask=inside, other=0.0)
    first = tl.fma(w1, g - first, first)  # torch.lerp(m, g, w1) at a weight below 0.5
    second = tl.fma(w2 * g, g, second * b2)  # v * b2, then torch.addcmul(v, g, g, value=w2)
    denom = tl.div_rn(tl.sqrt_rn(second), c2) + eps
    update = tl.div_rn(tl.div_rn(rate, c1) * first, denom)
    tl.store(m + i, first, mask=inside)
    tl.store(v + i, second, mask=inside)
    tl.store(weights + i, tl.load(weights + i, mask=inside, other=0.0) - update, mask=inside)
