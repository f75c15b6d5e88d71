"""What the attention core alone costs per training step, from its kernels' own arithmetic:
kernel launches, global atomic adds, bytes read and written, for each core at K models of H
heads of size e, B prompts of T tokens and vocabulary V, in training's case (the loss reads
z, not the pattern; softmax; no positional scores). A design is judged here before a GPU
sees it; bench/attention_cores.py prints it beside the measured time.

Each core is written out as its kernels in launch order, one `Kernel` each, read from the
code of models/cores/forward.py (VocabAttention) and models/cores/fused_kernels.py (FusedAttention). Bytes
follow bench/step_cost.py: fp32 tensors of 4 bytes, token indices of 8; a tensor a kernel
touches is counted once per kernel (a gather or scatter over a [.., V] row touches nearly
every cache line of it, so it counts as the row); what the programs of one kernel re-read
from cache is not counted again: the key and value tables ([e, V] per head, a few KB) read by
every block of prompts, the tokens re-read per head, and, in the fused tables' kernel, each
model's token order re-read per head and each prompt's q and d_z re-read once per position
(the programs of one model run side by side). A sort counts as one launch reading its input
and writing its two outputs once (CUDA's sort may pass over them several times). A global
atomic is one read-modify-write of one element in global memory: CUDA's scatter_add_, and
Triton's tl.atomic_add.

    .venv/bin/python bench/core_cost.py [--k 169] [--heads 32] [--d-head 8] [--batch 1024] [--vocab 129] [--seq-len 32]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

FLOAT, INDEX = 4, 8  # bytes per element


@dataclass(frozen=True)
class Kernel:
    """One kernel launch of a core: its name, the bytes it reads and writes, its global atomics."""
    name: str
    read: int
    written: int
    atomics: int = 0


def core_kernels(core: str, K: int, H: int, e: int, B: int, V: int, T: int) -> list[Kernel]:
    """The kernels of one forward and backward of `core` ("vocab" or "fused"), in launch order."""
    buffer, pattern = K * H * B * V * FLOAT, K * H * B * T * FLOAT  # [K, H, B, V], [K, H, B, T]
    heads, table = K * H * e * B * FLOAT, K * H * e * V * FLOAT  # [K, H, e, B], [K, H, e, V]
    tokens = K * B * T * INDEX  # [K, B, T]
    scattered = K * H * B * T  # one atomic add per prompt, head and token
    if core == "vocab":
        return [Kernel("scores_vocab = q^T key", heads + table, buffer),
                Kernel("scores: gather", buffer + tokens, pattern),
                Kernel("pattern: softmax", pattern, pattern),
                Kernel("buffer zeroed", 0, buffer),
                Kernel("pattern_vocab: scatter_add_", buffer + tokens + pattern, buffer, scattered),
                Kernel("z = value pattern_vocab^T", table + buffer, heads),
                Kernel("d_value = d_z pattern_vocab", heads + buffer, table),
                Kernel("d_pattern_vocab = d_z^T value", heads + table, buffer),
                Kernel("d_pattern: gather", buffer + tokens, pattern),
                Kernel("d_scores: softmax backward", 2 * pattern, pattern),
                Kernel("buffer zeroed", 0, buffer),
                Kernel("d_scores_vocab: scatter_add_", buffer + tokens + pattern, buffer, scattered),
                Kernel("d_q = key d_scores_vocab^T", table + buffer, heads),
                Kernel("d_key = q d_scores_vocab", heads + buffer, table)]
    if core == "fused":
        entries, starts = (V + 1) * INDEX, K * (V + 1) * INDEX  # [V + 1], [K, V + 1]
        return [Kernel("forward: scores, pattern, z", tokens + heads + 2 * table, pattern + heads),
                Kernel("backward: d_scores, d_q", tokens + pattern + heads + 2 * table, pattern + heads),
                Kernel("order: tokens sorted", tokens, 2 * tokens),
                Kernel("entries: arange", 0, entries),
                Kernel("entries: one row per model", entries, starts),
                Kernel("starts: searchsorted", tokens + starts, starts),
                Kernel("tables: d_key, d_value", tokens + starts + 2 * pattern + 2 * heads, 2 * table)]
    raise ValueError(f"core must be vocab or fused, got {core!r}")


def core_cost(core: str, K: int, H: int, e: int, B: int, V: int, T: int) -> dict[str, int]:
    """Kernel launches, global atomics, bytes read and bytes written of one forward and backward."""
    kernels = core_kernels(core, K, H, e, B, V, T)
    return {"launches": len(kernels), "atomics": sum(k.atomics for k in kernels),
            "read": sum(k.read for k in kernels), "written": sum(k.written for k in kernels)}


def cost_line(core: str, cost: dict[str, int], ms: float | None = None) -> str:
    """One printed line of a core's cost; with a measured `ms`, the bandwidth it implies."""
    moved = cost["read"] + cost["written"]
    line = (f"{core:>10}: {cost['launches']:>3} launches, {cost['atomics']:.3e} global atomics, "
            f"{cost['read'] / 1e9:.4g} GB read, {cost['written'] / 1e9:.4g} GB written")
    return line + ("" if ms is None else f"; {ms:.3f} ms measured = {moved / (ms * 1e-3):.3e} B/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=169, help="models stacked")
    parser.add_argument("--heads", type=int, default=32, help="heads per model")
    parser.add_argument("--d-head", type=int, default=8, help="head size e")
    parser.add_argument("--batch", type=int, default=1024, help="prompts per model")
    parser.add_argument("--vocab", type=int, default=129, help="vocabulary V")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per prompt T")
    args = parser.parse_args()
    shape = (args.k, args.heads, args.d_head, args.batch, args.vocab, args.seq_len)
    print(f"attention core, one forward and backward: K={args.k} H={args.heads} e={args.d_head} B={args.batch} "
          f"V={args.vocab} T={args.seq_len} (from the kernels' arithmetic, bench/core_cost.py)")
    for core in ("vocab", "fused"):
        print(cost_line(core, core_cost(core, *shape)))
        for kernel in core_kernels(core, *shape):
            print(f"{'':>14}{kernel.name:<32}{kernel.read / 1e9:>9.3f} GB read {kernel.written / 1e9:>9.3f} GB written"
                  + (f"  {kernel.atomics:.3e} atomics" if kernel.atomics else ""))


if __name__ == "__main__":
    main()
