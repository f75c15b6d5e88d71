"""What one training step of K stacked models costs: its FLOPs and the bytes it moves, by
tensor, as the code of models/cores/forward.py and the trainer around it does them; and the
machine's ceilings to hold them against (fp32 FLOP/s, memory bandwidth). As a script: both
attention cores' costs for a configuration and a measured step time, against an H200.

    .venv/bin/python bench/step_cost.py --preset paper-tradeoff --n-heads 32 --d-mlp 128 --k 169 --step-ms 22

Bytes are an estimate from counted passes (fp32 tensors of 4 bytes, token indices of 8), with
no positional embedding (our models have none). A pass is one read or one write of a whole
tensor; a gather or scatter over a [.., V] row touches nearly every cache line of it (32 of
129 entries per row), so it counts as a pass over the row. The token index [K, B, T] is
counted once per pass, not once per head (the heads re-read it from cache).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from models.cli import override
from models.recall.config import RunConfig
from models.recall.presets import preset

FLOAT, INDEX = 4, 8  # bytes per element
# Ceilings by the vendors' datasheets: fp32 FLOP/s without tensor cores, memory bytes/s; looked
# up by the words of torch.cuda.get_device_name, the first entry whose words all occur in it.
# (A device-to-device copy measured on the H200 moved about 4.3 TB/s.)
KNOWN_PEAKS = ((("H200",), (67e12, 4.8e12)), (("H100", "PCIe"), (51e12, 2.0e12)), (("H100", "NVL"), (60e12, 3.9e12)),
               (("H100",), (67e12, 3.35e12)), (("A100",), (19.5e12, 2.0e12)))
H200_FP32_FLOPS, H200_BANDWIDTH = KNOWN_PEAKS[0][1]


def known_peaks(device_name: str) -> tuple[float, float] | None:
    """The datasheet's (fp32 FLOP/s, bytes/s) of the device named `device_name`, or None."""
    return next((peaks for words, peaks in KNOWN_PEAKS if all(w in device_name for w in words)), None)


def device_peaks(device: torch.device, measured_flops: float, measured_bandwidth: float,
                 flags: tuple[float | None, float | None] = (None, None)) -> tuple[float, float, str]:
    """The ceilings to hold a step against on `device`, and where they come from: the flags
    where given, else the datasheet's peaks of a known GPU (by its name), else the rates
    measured on the device (matmul, copy)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    known = known_peaks(name)
    if known:
        peaks, source = known, f"the datasheet's peaks of the {name}"
    else:
        peaks, source = (measured_flops, measured_bandwidth), f"the measured matmul and copy rates of {name or device}"
    if any(f is not None for f in flags):
        return flags[0] or peaks[0], flags[1] or peaks[1], f"flags (else {source})"
    return peaks[0], peaks[1], source

# Passes over the [K, H, B, V] buffer in VocabAttention (one buffer reused):
# forward: scores written by q^T key (1), gathered (1), zeroed (1), scattered into (read and
# write: 2), read by the value product (1); backward: read by d_value (1), written by
# d_pattern_vocab (1), gathered (1), zeroed (1), scattered into (2), read by d_query (1) and
# d_key (1). 14 in all.
VOCAB_BUFFER_PASSES = 14
# Passes over [K, H, B, T] (pattern, scores and their gradients). Vocabulary core: forward
# gather out (1), softmax in and out (2), scatter source (1); backward gather out (1), softmax
# backward two in and one out (3), scatter source (1). Fused core (bench/core_cost.py): the
# pattern written by the forward, read by the backward and the tables' kernel; the scores'
# gradient written by the backward, read by the tables' kernel.
PATTERN_PASSES = {"vocab": 9, "fused": 5}
# Passes over [K, B, T] token indices: the gathers and scatters (vocabulary); the forward, the
# backward, the sort (read, and its sorted tokens and order written), searchsorted and the
# tables' kernel (fused).
INDEX_PASSES = {"vocab": 4, "fused": 7}
# q, z and their gradients [K, H, e, B]: q written, read; z written, read by W_O; d_z written,
# read (twice by the vocabulary core's products; by the backward and the tables' kernel in the
# fused core); d_q written, read; q read again by d_key (the tables' kernel).
HEAD_PASSES = {"vocab": 10, "fused": 10}
# Activations of the rest of the step, forward and backward (written, read, their gradients
# written and read): [K, B, d] x_last, attention out, residual (two), MLP out; [K, B, m] the
# hidden layer (ReLU in place); [K, B, O] logits, log-probabilities and their gradient.
ACTIVATION_PASSES = {"d": 12, "m": 8, "O": 6}
# Each trainable weight: read by the forward, gradient written and read, Adam's two moments
# read and written, the weight read and written.
WEIGHT_PASSES = 8


@dataclass(frozen=True)
class StepShape:
    """The sizes of one training step: K models, B prompts of T tokens, vocabulary V, O
    answers, width d, H heads of size e, MLP width m (0: attention only), and how many
    weights each model trains."""
    K: int
    B: int
    T: int
    V: int
    O: int
    d: int
    H: int
    e: int
    m: int
    trained: int

    @classmethod
    def of(cls, run: RunConfig, batch: int, k: int) -> StepShape:
        task = run.task.build()
        model = run.model.for_task(task)
        d, H, e = model.d_model, model.n_heads, model.d_head
        m = 0 if model.attn_only else model.d_mlp
        trained = 4 * d * H * e + 2 * d * m  # W_Q, W_K, W_V, W_O; W_in, W_out (biases are small)
        return cls(k, batch, task.seq_len, task.d_vocab, task.d_vocab_out, d, H, e, m, trained)


def step_flops(s: StepShape, core: str = "vocab") -> int:
    """FLOPs (2 per multiply-add) of the matrix products of one step of all K models: the
    last-position forward (query, key and value tables, the scores and the value mix, W_O,
    MLP, unembedding) and the backward products for the trainable weights and the
    activations upstream of them (the frozen W_E and W_U get no gradient). The attention's
    products run over the vocabulary (V entries per prompt) in the vocabulary core, over the
    prompt's tokens (T) in the fused core. Elementwise work (softmax, ReLU, Adam, sampling)
    is not counted."""
    B, d, H, e, m, O = s.B, s.d, s.H, s.e, s.m, s.O
    entries = s.V if core == "vocab" else s.T
    tables = 2 * s.V * d * H * e  # key and value tables
    mix = 2 * B * H * entries * e  # scores, and the value mix
    forward = B * d * H * e + tables + mix + B * H * e * d + 2 * B * d * m + B * d * O
    backward = (B * O * d  # d(resid) through the frozen unembedding
                + 4 * B * d * m  # MLP: both weights, hidden and input
                + 2 * B * H * e * d  # W_O and z
                + 2 * mix  # both operands of both attention products
                + tables  # W_K and W_V from their tables
                + B * d * H * e)  # W_Q (the embedding is frozen)
    return 2 * s.K * (forward + backward)


def step_bytes(s: StepShape, core: str = "vocab") -> dict[str, int]:
    """Bytes one step moves to and from memory, by tensor group (module docstring)."""
    K, B = s.K, s.B
    attention = K * s.H * B  # rows of the attention's per-prompt tensors
    cost = {"[K, H, B, V] attention buffer": VOCAB_BUFFER_PASSES * attention * s.V * FLOAT if core == "vocab" else 0,
            "[K, H, B, T] pattern and gradients": PATTERN_PASSES[core] * attention * s.T * FLOAT,
            "[K, B, T] tokens (sampled, then indices)": (1 + INDEX_PASSES[core]) * K * B * s.T * INDEX,
            "[K, H, e, B] queries, head outputs and gradients": HEAD_PASSES[core] * attention * s.e * FLOAT,
            "[K, B, d | m | O] activations": K * B * FLOAT * sum(
                passes * size for passes, size in zip(ACTIVATION_PASSES.values(), (s.d, s.m, s.O))),
            "weights, gradients, Adam moments": WEIGHT_PASSES * K * s.trained * FLOAT}
    return cost


def copy_bandwidth(device: torch.device, mib: int = 256, rounds: int = 5) -> float:
    """Bytes per second of a large tensor copy on `device` (read and write counted), best of
    a few rounds."""
    src = torch.ones(mib * 2**20 // FLOAT, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda _: None
    best = 0.0
    for _ in range(rounds):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = max(best, 2 * src.numel() * FLOAT / (time.perf_counter() - start))
    return best


def cost_lines(s: StepShape, core: str, steps_per_second: float, peak_flops: float, peak_bandwidth: float) -> list[str]:
    """The step's FLOPs and bytes, and the rates achieved at `steps_per_second` against the
    ceilings, as printed lines."""
    flops, moved = step_flops(s, core), step_bytes(s, core)
    total = sum(moved.values())
    lines = [f"  {name}: {b / 1e9:.3f} GB" for name, b in moved.items() if b]
    return [f"core {core}: flops_per_step {flops:.3e}, bytes_per_step {total:.3e} (estimate)", *lines,
            f"  achieved {flops * steps_per_second:.3e} FLOP/s = {100 * flops * steps_per_second / peak_flops:.1f}% "
            f"of {peak_flops:.3e}; {total * steps_per_second:.3e} B/s = "
            f"{100 * total * steps_per_second / peak_bandwidth:.1f}% of {peak_bandwidth:.3e}",
            f"  floor {1e3 * max(flops / peak_flops, total / peak_bandwidth):.3f} ms/step "
            f"(the larger of FLOPs at the peak rate and bytes at the peak bandwidth), "
            f"step {1e3 / steps_per_second:.3f} ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="paper-tradeoff", help="models.recall.config preset (task + model)")
    parser.add_argument("--n-heads", type=int, default=None, help="replace the preset model's head count")
    parser.add_argument("--d-mlp", type=int, default=None, help="replace the preset model's MLP width")
    parser.add_argument("--k", type=int, default=1, help="models stacked")
    parser.add_argument("--batch", type=int, default=1024, help="prompts per step per model")
    parser.add_argument("--step-ms", type=float, required=True, help="a measured step time, ms")
    parser.add_argument("--peak-flops", type=float, default=H200_FP32_FLOPS, help="fp32 FLOP/s (default an H200)")
    parser.add_argument("--peak-bandwidth", type=float, default=H200_BANDWIDTH, help="bytes/s (default an H200)")
    args = parser.parse_args()
    run = preset(args.preset)
    fields = {key: value for key, value in (("n_heads", args.n_heads), ("d_mlp", args.d_mlp)) if value is not None}
    shape = StepShape.of(RunConfig(run.task, override(run.model, fields), run.train), args.batch, args.k)
    print(shape)
    for core in ("vocab", "fused"):
        print("\n".join(cost_lines(shape, core, 1e3 / args.step_ms, args.peak_flops, args.peak_bandwidth)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
