"""Kernels per training step (bench/step_kernels.py), counted on the CPU: the graphed GPU
step's time goes with their number."""

from bench.step_kernels import step_kernels
from tests.conftest import triton_on


@triton_on("cpu")
def test_on_cuda_the_batch_and_adam_are_one_kernel_each_and_a_step_at_most_60():
    cpu, cuda = (step_kernels("config-a", 16, on_cuda) for on_cuda in (False, True))
    assert sum(sum(ops.values()) for ops in cuda.values()) <= 60  # the graphed GPU step's kernels
    assert dict(cuda.pop("batch (one Triton kernel)")) == {"triton::counter_kernel.prompts": 1}
    assert sum(cpu.pop("batch").values()) > 60  # the torch form: the hash, pass by pass
    assert dict(cuda.pop("optimizer (adam, 6 parameters, one Triton kernel)")) == {
        "aten::add_": 1, "aten::cat": 1, "factual_recall::adam_step": 1}  # the step count, the gradients, Adam
    assert sum(cpu.pop("optimizer (adam, 6 parameters)").values()) == 14
    assert cuda == cpu  # the forward and the backward


def test_only_the_query_is_scaled():
    """The forward multiplies the query's weight and bias by 1/sqrt(d_head) and nothing by 1.0."""
    forward = step_kernels("config-a", 16)["forward and loss"]
    assert forward["aten::mul"] == 2
