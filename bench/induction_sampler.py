"""The induction task's sampler against the authors' per-token loop: sequences per second, side by side.

Ours: tasks.induction.InductionTask.sample_counter, one batch of --batch sequences of T = --seq-len
inputs drawn at once (a loop over the T positions, each a few tensor operations on the whole
batch), on --device. Theirs: BENCHMARK BASELINE, a re-implementation written here of the loop of
`Dataset.gen_seq` in albietz/transformer-birth (ihead_data.py), one token at a time with numpy's
`rng.choice(p=...)`: the triggers (fixed, or drawn with rng.choice(size=K, replace=False, p=pi_u)),
one output per trigger, the first token from pi_u, then a Python while-loop that appends the
trigger's output or draws from pi_b. The authors run it in 60 worker processes; here it runs in
one, so its rate is per process (their 60 workers multiply it by at most the cores they get).

The two take turns in --rounds rounds; each prints its median sequences per wall-clock second and
per CPU second of this process (time.process_time: what a shared, loaded machine takes away from the
wall-clock rate it leaves in this one), and the share of in-context positions (counter >= 2), which
must agree between the two (same distribution).

    .venv/bin/python bench/induction_sampler.py [--batch 512] [--seq-len 256] [--triggers fixed] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tasks.induction import InductionTask  # noqa: E402


class AuthorsLoop:
    """BENCHMARK BASELINE (not the toolkit's sampler): the authors' per-token sampling loop,
    re-implemented from their public code's description, on our task's counts."""

    def __init__(self, task: InductionTask):
        self.n, self.k, self.T = task.n_tokens, task.n_triggers, task.seq_len
        self.tok_range = list(range(self.n))
        self.marginal = task.marginal.double().numpy()
        self.marginal /= self.marginal.sum()
        self.cond = [row / row.sum() for row in task.conditionals.double().numpy()]
        self.idxs = task.fixed_triggers.tolist() if task.triggers == "fixed" else None

    def sequence(self, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        idxs = self.idxs if self.idxs is not None else list(
            rng.choice(self.tok_range, p=self.marginal, size=self.k, replace=False))
        outs = [rng.choice(self.tok_range) for _ in idxs]
        seq, counter, fired = [rng.choice(self.tok_range, p=self.marginal)], [], {}
        while len(seq) < self.T + 1:
            last = seq[-1]
            if last in idxs:
                seq.append(outs[idxs.index(last)])
                fired[last] = fired.get(last, 0) + 1
                counter.append(fired[last])
            else:
                counter.append(0)
                seq.append(rng.choice(self.tok_range, p=self.cond[last]))
        return seq, counter + [0]

    def batch(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        seqs, counters = zip(*(self.sequence(rng) for _ in range(batch_size)))
        return np.array(seqs), np.array(counters)  # [B, T + 1] each


CLOCKS = {"wall_s": time.perf_counter, "cpu_s": time.process_time}  # wall-clock, and this process's CPU time


def timed(run, *args) -> tuple[object, dict[str, float]]:
    """run(*args)'s value and the seconds it took on each clock of CLOCKS."""
    start = {name: clock() for name, clock in CLOCKS.items()}
    value = run(*args)
    return value, {name: CLOCKS[name]() - start[name] for name in CLOCKS}


def measure(batch: int, seq_len: int, triggers: str, n_triggers: int, rounds: int, device: str) -> dict:
    """Median sequences per second of each sampler over `rounds` interleaved rounds, by the wall clock
    (`sequences_per_wall_s`) and by this process's CPU time (`sequences_per_cpu_s`), and each one's
    share of in-context positions (counter >= 2 among the T inputs)."""
    task = InductionTask(n_triggers=n_triggers, seq_len=seq_len, triggers=triggers)
    loop, dev = AuthorsLoop(task), torch.device(device)
    seeds = torch.tensor([7], device=dev)
    task.sample_counter(2, seeds, 0)  # tables on the device, kernels warm

    def ours(r):
        drawn = task.sample_counter(batch, seeds, r)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return (drawn.counts >= 2).float().mean().item()

    def theirs(r):
        _, counters = loop.batch(np.random.default_rng([7, r]), batch)
        return float((counters[:, :-1] >= 2).mean())
    rates = {name: {clock: [] for clock in CLOCKS} for name in ("ours", "loop")}
    share = {"ours": [], "loop": []}
    for r in range(rounds):
        for name, run in (("ours", ours), ("loop", theirs)):
            value, seconds = timed(run, r)
            share[name].append(value)
            for clock, s in seconds.items():
                rates[name][clock].append(batch / max(s, 1e-9))  # a clock that did not tick: no division by 0
    return {name: {"sequences_per_wall_s": statistics.median(rates[name]["wall_s"]),
                   "sequences_per_cpu_s": statistics.median(rates[name]["cpu_s"]),
                   "in_context_share": statistics.mean(share[name])} for name in rates}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/induction_sampler.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=512, help="sequences per batch (default 512, the authors')")
    p.add_argument("--seq-len", type=int, default=256, help="T, inputs per sequence (default 256)")
    p.add_argument("--triggers", choices=("fixed", "random"), default="fixed", help="(default fixed)")
    p.add_argument("--n-triggers", type=int, default=5, help="K (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--device", default="cpu", help="our sampler's device (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for ours (default 1, as the loop's one)")
    args = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = measure(args.batch, args.seq_len, args.triggers, args.n_triggers, args.rounds, args.device)
    finally:
        torch.set_num_threads(threads)  # called in-process (the tests), it leaves torch as it found it
    print(f"B = {args.batch}, T = {args.seq_len}, K = {args.n_triggers} {args.triggers} triggers, "
          f"{args.rounds} rounds; ours on {args.device} ({args.threads} torch threads), the loop in one process")
    for name, label in (("ours", "ours (vectorised)"), ("loop", "authors' loop (baseline)")):
        r = result[name]
        print(f"  {label:26s} {r['sequences_per_wall_s']:12,.0f} sequences per wall-clock s "
              f"{r['sequences_per_cpu_s']:12,.0f} per CPU s   in-context share {r['in_context_share']:.4f}")
    ratio = {clock: result["ours"][f"sequences_per_{clock}"] / result["loop"][f"sequences_per_{clock}"]
             for clock in CLOCKS}
    print(f"ours_over_loop {ratio['wall_s']:.1f} (wall clock), {ratio['cpu_s']:.1f} (CPU time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
