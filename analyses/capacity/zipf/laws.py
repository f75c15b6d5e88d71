"""`zipf`: the error of associative memories against n and d under Zipf data, for the talk's
memory schemes and the optimisers' memories: the sweep's settings, its cells (one per α,
scheme and d: every seed and sample size at once), and their cost."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from analyses.capacity.zipf import memory as mem
from analyses.capacity.zipf import optimisers as opt
from analyses.capacity.zipf.fits import seed_slope
from analyses.sweeps import cli
from models.bridge import resolve_device
from models.cli import setting

KINDS = mem.SCHEMES + opt.OPTIMISERS
CHUNK_BYTES = 2 ** 28  # the seeds of a cell are computed in chunks holding about this much
STEP_COST = 50_000  # multiply-adds that a sequential optimiser step's Python and dispatch cost (this CPU)
AUTOGRAD = 2 ** 27  # the resident memory autograd and Adam's first step add whatever the sizes (this CPU)
HELD = 1e-6  # q(z) / max q below this is read as not held: float32 memories read back ~1e-8 there


@dataclass(frozen=True)
class ZipfSweep:
    """The memories whose error under Zipf data is measured, against n and d."""

    alpha: tuple[float, ...] = setting((1.5, 2.0, 3.0), "Zipf exponents α of p(z) ∝ z^-α (the laws need α > 1: "
                                       "smaller ones are measured, their law not drawn)")
    tokens: int = setting(1000, "N, input tokens z (the authors: 1000)")
    outputs: int = setting(5, "M, answers y = f*(z), a random map (the authors: 5, f*(z) = z mod 5)")
    samples: tuple[int, ...] = setting((10, 100, 1000, 10000), "sample sizes n, nested: the first n of one sample "
                                       "per seed")
    population: bool = setting(False, "n = ∞ in place of --samples: memories built from p itself (counts -> p, "
                               "seen -> every token, threshold -> the most frequent tokens; the authors' figure "
                               "against d)")
    d: tuple[int, ...] = setting((32, 64, 128, 256, 512, 1024), "embedding dimensions d, nested: the first d "
                                 "coordinates of one draw per seed")
    schemes: tuple[str, ...] = setting(mem.SCHEMES, "memory schemes q(z): counts | seen | threshold; and the "
                                       "memories optimisers learn from the samples: gd (one step, the whole sample "
                                       "one batch) | sgd (batch one) | adam")
    threshold: int | None = setting(None, "threshold scheme: store the tokens seen at least s times (default: per n "
                                    "and d the smallest s that stores at most --stored-per-d × d tokens)")
    stored_per_d: float = setting(0.125, "threshold scheme without --threshold: tokens stored per dimension (the "
                                  "authors: 1/8)")
    seeds: tuple[int, ...] = setting(tuple(range(10)), "seeds: each its map f*, sample and embeddings")
    sgd_lr: float = setting(10.0, "sgd: the step size (the talk's large step)")
    sgd_batch: int = setting(1, "sgd: samples per step (the talk's: 1; one pass over the sample)")
    adam_lr: float = setting(5.0, "adam: the step size times d (the authors take lr/d)")
    adam_batch: int = setting(100, "adam: samples per step (one pass over the sample)")
    adam_betas: tuple[float, ...] = setting((0.0, 0.0), "adam: β1,β2 (the authors: 0,0)", repeats=True)

    def __post_init__(self):
        cli.at_least(self, tokens=2, outputs=2, samples=1, d=1, threshold=1, sgd_batch=1, adam_batch=1)
        cli.require(self, "alpha", all(0 <= a < math.inf for a in self.alpha), "finite and >= 0")
        cli.require(self, "seeds", len(self.seeds) > 0, "at least one seed")
        cli.require(self, "samples", max(self.samples) <= 2 ** 24, "at most 2^24 (counts kept exact in float32)")
        cli.require(self, "schemes", set(self.schemes) <= set(KINDS), "among " + ", ".join(KINDS))
        cli.require(self, "stored_per_d", self.stored_per_d > 0, "> 0")
        cli.require(self, "sgd_lr", self.sgd_lr > 0, "> 0")
        cli.require(self, "adam_lr", self.adam_lr > 0, "> 0")
        cli.require(self, "adam_betas", len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
                    "two values in [0, 1)")
        if self.population and (self.threshold is not None or {"sgd", "adam"} & set(self.schemes)):
            raise ValueError("--population builds memories from p: it takes neither --threshold (no counts to "
                             "threshold) nor sgd or adam (no samples to train on).")
        object.__setattr__(self, "samples", tuple(sorted(self.samples)))  # recorded increasing, as they are used

    def sizes(self) -> list[int]:
        """The sample sizes, increasing ([0]: the population)."""
        return [0] if self.population else sorted(set(self.samples))

    def budget(self, d: int) -> int:
        """Tokens the threshold scheme stores at most at dimension d."""
        return max(1, math.floor(self.stored_per_d * d))

    def cells(self) -> list[tuple[float, str, int]]:
        return [(alpha, scheme, d) for alpha in self.alpha for scheme in self.schemes for d in sorted(set(self.d))]

    def recorded(self) -> dict:
        """What every cell shares (settings.json): α, the schemes and d are in the cell keys, so a
        sweep can grow."""
        return {"analysis": "capacity zipf", **{k: v for k, v in asdict(self).items()
                                                 if k not in ("alpha", "schemes", "d")}}

    def seed_chunks(self, d: int) -> list[list[int]]:
        """The seeds in chunks of about CHUNK_BYTES of embeddings and memories each."""
        per_seed = 4 * (self.tokens * d * (1 + len(self.sizes())) + len(self.sizes()) * d * d * ("adam" in
                                                                                              self.schemes))
        size = max(1, CHUNK_BYTES // per_seed)
        return [list(self.seeds[i:i + size]) for i in range(0, len(self.seeds), size)]


def cell_key(alpha: float, scheme: str, d: int) -> str:
    return f"alpha{alpha:g}_{scheme}_d{d}"


@dataclass
class Memory:
    """A scheme's (or optimiser's) memory at each sample size: `weights` A [K, S, M, d] for
    W = Σ_y u_y a_y^T, or W [K, S, d, d] itself (`square`, Adam's); a scheme's q [K, S, N] and
    the threshold's cut [K, S]."""

    weights: torch.Tensor
    square: bool = False
    q: torch.Tensor | None = None
    cut: torch.Tensor | None = None

    def scores(self, E: torch.Tensor, U: torch.Tensor, last: bool = False) -> torch.Tensor:
        """u_y^T W e_z [K, S, N, M] (the largest size only with `last`), in E's dtype."""
        weights = (self.weights[:, -1:] if last else self.weights).to(E.dtype)
        return (mem.matrix_scores if self.square else mem.span_scores)(weights, E, U)


def build_memory(sweep: ZipfSweep, scheme: str, data: mem.Draw, counts: torch.Tensor, d: int) -> Memory:
    """The memory of `scheme` from the counts [K, S, N] (or p) or the samples of `data`."""
    if scheme in mem.SCHEMES:
        cut = None
        if scheme == "threshold":
            cut = (torch.full(counts.shape[:2], sweep.threshold - 1, device=counts.device) if sweep.threshold
                   else mem.threshold_cut(counts, sweep.budget(d)))
        q = mem.memory_q(counts, scheme, cut)
        return Memory(mem.outer_memory(q, data.answers, data.E, sweep.outputs), q=q, cut=cut)
    if scheme == "gd":
        return Memory(opt.gd_memory(counts, data.answers, data.E, sweep.outputs))
    if scheme == "sgd":
        return Memory(opt.sgd_memories(data, sweep.sizes(), sweep.sgd_lr, sweep.sgd_batch))
    return Memory(opt.adam_memories(data, sweep.sizes(), sweep.adam_lr, sweep.adam_batch, tuple(sweep.adam_betas)),
                  square=True)


def zipf_row(sweep: ZipfSweep, alpha: float, scheme: str, d: int, device: str) -> dict:
    """One cell: the error of every seed at every sample size [K][S] (exact), the tokens stored
    and the threshold s where the scheme has them, and where d >= N the q(z) the memory holds at
    the largest n (memory.effective_q: mean over seeds of q / max q, and each seed's exponent
    of q against z over the tokens seen)."""
    start, device = time.perf_counter(), resolve_device(device)
    sizes, N = sweep.sizes(), sweep.tokens
    errors, stored, s, profiles, exponents = [], [], [], [], []
    for chunk in sweep.seed_chunks(d):
        data = mem.draw(alpha, N, sweep.outputs, sizes[-1], d, chunk, device)
        counts = (data.p.expand(len(chunk), 1, N) if sweep.population
                  else mem.prefix_counts(data.samples, sizes, N))  # [K, S, N]
        memory = build_memory(sweep, scheme, data, counts, d)
        errors += mem.recall_error(memory.scores(data.E, data.U), data.answers, data.p).tolist()
        if memory.q is not None:
            stored += (memory.q > 0).sum(-1).tolist()
        if memory.cut is not None:
            s += (memory.cut + 1).tolist() if not sweep.population else [[None]] * len(chunk)
        if d >= N:  # read back in float64 (the pseudo-inverse of E E^T)
            E, U = data.E.double(), data.U.double()
            held = mem.effective_q(memory.scores(E, U, last=True), data.answers, E, U)[:, 0]  # [K, N]
            held = held / held.amax(-1, keepdim=True)
            profiles.append(held.where(held > HELD, 0))
            z, seen = np.arange(1, N + 1), counts[:, -1].cpu().numpy() > 0
            exponents += [seed_slope(z[c], h[c]) for h, c in zip(profiles[-1].cpu().numpy(), seen)]
    return {"alpha": alpha, "scheme": scheme, "d": d, "seeds": list(sweep.seeds),
            "n": [None] if sweep.population else sizes, "errors": errors, "stored": stored or None,
            "s": s or None, "q_profile": torch.cat(profiles).mean(0).tolist() if profiles else None,
            "q_exponents": exponents or None, "seconds": time.perf_counter() - start,
            "multiply_adds": cell_cost(sweep, scheme, d)}


def cell_cost(sweep: ZipfSweep, scheme: str, d: int) -> int:
    """Multiply-adds of a cell (the plan's unit): the memories' scores at every size, the
    training of sgd and adam, and the read-back of q where d >= N."""
    K, S, N, M, n = len(sweep.seeds), len(sweep.sizes()), sweep.tokens, sweep.outputs, sweep.sizes()[-1]
    cost = 2 * K * S * N * d * M + K * n
    if scheme == "sgd":
        cost += 3 * K * n * M * d + n // sweep.sgd_batch * STEP_COST
    if scheme == "adam":
        cost += 3 * K * n * (d * d + d * M) + K * S * N * d * d + n // sweep.adam_batch * STEP_COST
    if d >= N:
        cost += K * N ** 3
    return int(cost)


def cell_bytes(sweep: ZipfSweep, scheme: str, d: int, device: torch.device) -> dict[torch.device, dict[str, int]]:
    """A cell's estimated peak memory (bytes) by where it lies and by part, from the settings
    alone, for its largest chunk of K seeds (seed_chunks): the embeddings E [K, N, d] (drawn on
    the host, one seed built there 3 times over, the last chunk's kept while the next is drawn),
    the samples and counts, the scores [K, S, N, M], Adam's W [K, S, d, d] with its state and
    snapshots (and autograd's own), and where d >= N the float64 read-back ((E E^T)^+ [K, N, N]). Measured on this
    CPU, the estimate is 1-1.6 times the peak resident memory above the imports."""
    K, S, N, M, n = (max(map(len, sweep.seed_chunks(d))), len(sweep.sizes()), sweep.tokens, sweep.outputs,
                     sweep.sizes()[-1])
    host = torch.device("cpu")
    computed = {"samples": 8 * K * (n + N * (2 * S + 1)), "scores": 16 * K * S * N * M}
    if scheme == "adam":
        computed["adam"] = 4 * K * d * d * (2 * S + 12) + AUTOGRAD
    if d >= N:
        computed["read-back"] = 8 * K * (N * d + 4 * N * N + 3 * S * N * M)
    if device.type == "cpu":
        return {host: {"embeddings": 4 * N * d * (2 * K + 3), **computed,
                       "samples": computed["samples"] + 16 * K * n}}
    return {host: {"embeddings": 4 * N * d * (2 * K + 2), "samples": 24 * K * n},
            device: {"embeddings": 4 * N * d * K * (1 + S), **computed}}


HINTS = {"embeddings": "--tokens, --d", "samples": "--samples, --tokens", "scores": "--tokens, --samples, --outputs",
         "adam": "--d, or adam left out of --schemes", "read-back": "--d below --tokens, or --tokens"}


def check_fits(sweep: ZipfSweep, device: torch.device, available: int | None = None) -> None:
    """Refuse (ValueError, one line) a sweep whose largest cell needs more memory than is
    available now (models.training.memory.available_bytes; `available` bytes in its place), naming
    the largest part and the flags that shrink it, before anything is drawn or written."""
    from models.training.memory import GIB, available_bytes

    free = {}
    for cell in sweep.cells():
        for where, parts in cell_bytes(sweep, cell[1], cell[2], device).items():
            if where not in free:
                free[where] = available_bytes(where) if available is None else available
            need = sum(parts.values())
            if free[where] is not None and need > free[where]:
                largest = max(parts, key=parts.get)
                raise ValueError(f"the cell {cell_key(*cell)} needs an estimated {need / GIB:.1f} GiB of memory on "
                                 f"{where.type} ({largest} {parts[largest] / GIB:.1f} GiB), more than the "
                                 f"{free[where] / GIB:.1f} GiB available; make it smaller ({HINTS[largest]}).")
