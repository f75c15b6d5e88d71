"""Kernels per training step (bench/step_kernels.py), counted on the CPU: the graphed GPU
step's time goes with their number."""

from bench.step_kernels import step_kernels
from tests.conftest import triton_on


@triton_on("cpu")
def test_the_batch_is_one_kernel_on_cuda_and_the_rest_of_the_step_is_unchanged():
    cpu, cuda = (step_kernels("config-a", 16, cuda_sampler) for cuda_sampler in (False, True))
    assert dict(cuda.pop("batch (one Triton kernel)")) == {"triton::counter_kernel.prompts": 1}
    assert sum(cpu.pop("batch").values()) > 60  # the torch form: the hash, pass by pass
    assert cuda == cpu


def test_only_the_query_is_scaled():
    """The forward multiplies the query's weight and bias by 1/sqrt(d_head) and nothing by 1.0."""
    forward = step_kernels("config-a", 16)["forward and loss"]
    assert forward["aten::mul"] == 2
