"""Associative memories under Zipf data (Cabannes, Dohmatob & Bietti, ICLR 2024; Bietti's talk,
"Scaling laws and optimization"): the data, the memory schemes q(z) and the exact error.

Tokens z = 1..N (index z - 1) are drawn from p(z) ∝ z^(-α); each has the answer y = f*(z), a
random map to M answers; n samples z_1..z_n. Input and output embeddings e_z, u_y have
N(0, 1/d) entries (models.recall.weights.random_directions). A memory W = Σ_z q(z) u_f*(z) e_z^T
recalls f̂(z) = argmax_y u_y^T W e_z, and its error is L = Σ_z p(z) 1{f̂(z) ≠ f*(z)}, summed
over the N tokens, never sampled. A tie for the argmax counts as an error: a memory that
stores nothing recalls nothing.

K seeds are computed at once ([K, ...] tensors) and S sample sizes at once ([K, S, ...]): the
sizes are nested (the first n of one sample per seed), and so are the dimensions (the first d
coordinates of an embedding are the same for every d, up to the 1/√d scale), as the authors'
code truncates one draw; so a seed's curves against n and d are smooth and its slopes
comparable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.recall.weights import random_directions

SCHEMES = ("counts", "seen", "threshold")
BLOCK = 16  # embedding coordinates drawn per generator: nested in d whatever the largest d


def zipf_law(alpha: float, tokens: int, device="cpu") -> torch.Tensor:
    """p(z) ∝ z^(-alpha) over z = 1..N [N], float64."""
    if tokens < 1:
        raise ValueError(f"N (tokens) must be >= 1, got {tokens}.")
    if not alpha >= 0:
        raise ValueError(f"the Zipf exponent α must be >= 0, got {alpha}.")
    p = torch.arange(1, tokens + 1, dtype=torch.float64, device=device) ** -alpha
    return p / p.sum()


def nested_embeddings(count: int, d: int, seed: int, stream: int) -> torch.Tensor:
    """`count` embeddings with N(0, 1/d) entries [count, d] (CPU): blocks of BLOCK coordinates,
    each from its own generator, so the first d coordinates do not depend on the largest d."""
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}.")
    blocks = [random_directions(count, BLOCK, "gaussian",
                                torch.Generator().manual_seed((3 * seed + stream) * 100_003 + j))
              for j in range(math.ceil(d / BLOCK))]
    return torch.cat(blocks, 1)[:, :d] * math.sqrt(BLOCK / d)


@dataclass
class Draw:
    """K seeds' data and embeddings, on one device."""

    p: torch.Tensor  # [N] float64
    answers: torch.Tensor  # [K, N] f*(z)
    samples: torch.Tensor  # [K, n] token indices z - 1
    E: torch.Tensor  # [K, N, d] input embeddings e_z
    U: torch.Tensor  # [K, M, d] output embeddings u_y


def draw(alpha: float, tokens: int, outputs: int, n: int, d: int, seeds: list[int], device="cpu") -> Draw:
    """Per seed: the map f* and n samples (one generator, so they do not depend on d) and the
    embeddings at dimension d; drawn on the CPU, so a seed is the same on every device."""
    if outputs < 2:
        raise ValueError(f"M (outputs) must be >= 2, got {outputs}.")
    p = zipf_law(alpha, tokens)
    answers, samples = [], []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        answers.append(torch.randint(outputs, (tokens,), generator=g))
        samples.append(torch.multinomial(p, n, replacement=True, generator=g) if n else torch.zeros(0, dtype=int))
    E = torch.stack([nested_embeddings(tokens, d, seed, 1) for seed in seeds])
    U = torch.stack([nested_embeddings(outputs, d, seed, 2) for seed in seeds])
    return Draw(p.to(device), torch.stack(answers).to(device), torch.stack(samples).to(device), E.to(device),
                U.to(device))


def prefix_counts(samples: torch.Tensor, sizes: list[int], tokens: int) -> torch.Tensor:
    """How often each token is among the first n samples, for each n of `sizes` (increasing):
    [K, S, N] from samples [K, n_max]."""
    K = samples.shape[0]
    offset = torch.arange(K, device=samples.device)[:, None] * tokens  # one bincount for the K seeds
    counts = torch.zeros(K * tokens, dtype=torch.long, device=samples.device)
    out, start = [], 0
    for n in sizes:
        counts = counts + torch.bincount((samples[:, start:n] + offset).flatten(), minlength=K * tokens)
        out.append(counts.view(K, tokens))
        start = n
    return torch.stack(out, 1)


def threshold_cut(counts: torch.Tensor, budget: int) -> torch.Tensor:
    """The threshold scheme's cut [...] per row of counts [..., N]: tokens counted more than
    the cut are stored, at most `budget` of them (the (budget+1)-th largest count, never below
    0: an unseen token is never stored). For integer counts, s = cut + 1."""
    if budget < 1:
        raise ValueError(f"the threshold scheme stores at least 1 token, got a budget of {budget}.")
    if budget >= counts.shape[-1]:
        return torch.zeros(counts.shape[:-1], dtype=counts.dtype, device=counts.device)
    kth = counts.sort(-1, descending=True).values[..., budget]
    return kth.clamp(min=0)


def memory_q(counts: torch.Tensor, scheme: str, cut: torch.Tensor | float | None = None) -> torch.Tensor:
    """q(z) [..., N] of a memory scheme from the counts [..., N]: `counts` the count itself,
    `seen` 1 if seen, `threshold` 1 if counted more than `cut` (a number, or one per row [...]),
    i.e. seen at least s = cut + 1 times."""
    if scheme == "counts":
        return counts.float()
    if scheme == "seen":
        return (counts > 0).float()
    if scheme == "threshold":
        cut = torch.as_tensor(cut, device=counts.device)
        if (cut < 0).any():
            raise ValueError("the threshold scheme needs s >= 1 (a cut >= 0).")
        return (counts > cut[..., None]).float()
    raise ValueError(f"unknown memory scheme {scheme!r}: choose {', '.join(SCHEMES)}.")


def outer_memory(q: torch.Tensor, answers: torch.Tensor, E: torch.Tensor, outputs: int) -> torch.Tensor:
    """W = Σ_z q(z) u_f*(z) e_z^T written as Σ_y u_y a_y^T: the rows a_y = Σ_{z: f*(z)=y} q(z) e_z,
    A [K, S, M, d] from q [K, S, N], answers [K, N], E [K, N, d]."""
    onehot = F.one_hot(answers, outputs).to(E.dtype)  # [K, N, M]
    return torch.einsum("kzm,ksz,kzd->ksmd", onehot, q.to(E.dtype), E)


def span_scores(A: torch.Tensor, E: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """u_y^T W e_z [K, S, N, M] for W = Σ_y u_y a_y^T (A [K, S, M, d])."""
    gram_u = U @ U.transpose(1, 2)  # [K, M, M]
    return (E[:, None] @ A.transpose(2, 3)) @ gram_u[:, None]


def matrix_scores(W: torch.Tensor, E: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """u_y^T W e_z [K, S, N, M] for any W [K, S, d, d]."""
    return (E[:, None] @ W.transpose(2, 3)) @ U.transpose(1, 2)[:, None]


def recall_wrong(scores: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """1{f̂(z) ≠ f*(z)} [K, S, N] (bool) from scores [K, S, N, M]: the answer's score is not
    strictly above every other answer's."""
    index = answers[:, None, :, None].expand(*scores.shape[:3], 1)
    true = scores.gather(-1, index)[..., 0]
    rivals = scores.scatter(-1, index, -math.inf).amax(-1)
    return ~(true > rivals)


def recall_error(scores: torch.Tensor, answers: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """L = Σ_z p(z) 1{f̂(z) ≠ f*(z)} [K, S] (float64), exact: summed over every token."""
    return (recall_wrong(scores, answers).to(p.dtype) * p).sum(-1)


def effective_q(scores: torch.Tensor, answers: torch.Tensor, E: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The q(z) a memory W holds [K, S, N] (float64): the coefficient of u_f*(z) e_z^T when W is
    written on the pairs u_y e_z^T, B = (U U^T)^-1 (U W E^T) (E E^T)^+, read at (f*(z), z). Its
    right-hand side U W E^T is the scores' transpose (the diagonal of U^T W E is what it reads),
    so with orthonormal embeddings it is that diagonal; exact while d >= N (else the
    least-squares coefficients)."""
    gram_u = (U @ U.transpose(1, 2)).double()  # [K, M, M]
    gram_e = torch.linalg.pinv((E @ E.transpose(1, 2)).double(), hermitian=True)  # [K, N, N]
    B = torch.linalg.solve(gram_u[:, None], scores.transpose(2, 3).double()) @ gram_e[:, None]  # [K, S, M, N]
    index = answers[:, None, None, :].expand(B.shape[0], B.shape[1], 1, B.shape[3])
    return B.gather(2, index)[:, :, 0]
