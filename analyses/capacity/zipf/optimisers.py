"""The memories that optimisers learn from the samples of analyses.capacity.zipf.memory, from
W = 0 on the cross-entropy of softmax_y(u_y^T W e_z), each a snapshot after the first n samples
for every n of `sizes` (one pass over one sample per seed, the K seeds at once):

  gd    one gradient step over the whole sample as one batch: the talk's q(z) ≈ p(z);
  sgd   SGD, by default with batch one and a large step: the talk's q(z) ≈ 1 once d >> N;
  adam  Adam over batches, step size lr/d (the authors' scaling), by default with the authors'
        β1 = β2 = 0 (a normalised sign step).

A gradient of this loss is Σ_y c_y u_y e^T, so gd and sgd stay in the form W = Σ_y u_y a_y^T
and are kept as A [K, S, M, d] (memory.span_scores); Adam's step is taken entry by entry, so its
W [K, S, d, d] is kept whole (memory.matrix_scores). memory.effective_q reads any of them back
as the q(z) it holds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from analyses.capacity.zipf.memory import Draw, outer_memory

OPTIMISERS = ("gd", "sgd", "adam")


def gd_memory(counts: torch.Tensor, answers: torch.Tensor, E: torch.Tensor, outputs: int) -> torch.Tensor:
    """One gradient step of size 1 from W = 0 on the mean cross-entropy over the n samples:
    W = Σ_z (c(z)/n) (u_f*(z) - ū) e_z^T (at W = 0 every answer has probability 1/M), as
    A [K, S, M, d] from counts [K, S, N] (or p itself for the population)."""
    n = counts.sum(-1, keepdim=True).clamp(min=1)
    A = outer_memory(counts / n, answers, E, outputs)
    return A - A.mean(2, keepdim=True)


def sgd_memories(data: Draw, sizes: list[int], lr: float, batch: int = 1) -> torch.Tensor:
    """SGD with step size `lr` from W = 0 over consecutive batches of `batch` samples, one pass
    (the talk's: batch one): after each batch, a_y -= lr · mean over it of (softmax_y - 1{y = f*(z)}) e_z.
    The snapshot for n samples is after ⌊n / batch⌋ steps. A [K, S, M, d]."""
    if not lr > 0 or batch < 1:
        raise ValueError(f"SGD needs a step size > 0 and a batch >= 1, got {lr} and {batch}.")
    K, _, d = data.E.shape
    outputs = data.U.shape[1]
    seeds = torch.arange(K, device=data.E.device)[:, None]
    gram_u = data.U @ data.U.transpose(1, 2)  # [K, M, M]
    A = torch.zeros(K, outputs, d, dtype=data.E.dtype, device=data.E.device)
    wanted = {n // batch for n in sizes}
    snapshots = {0: A}
    for step in range(1, max(sizes) // batch + 1):
        z = data.samples[:, (step - 1) * batch: step * batch]  # [K, B]
        e = data.E[seeds, z]  # [K, B, d]
        logits = e @ A.transpose(1, 2) @ gram_u  # [K, B, M]: u_y^T W e_z
        residual = logits.softmax(-1) - F.one_hot(data.answers[seeds, z], outputs).to(logits.dtype)  # [K, B, M]
        A = A - lr / batch * residual.transpose(1, 2) @ e
        if step in wanted:
            snapshots[step] = A
    return torch.stack([snapshots[n // batch] for n in sizes], 1)


def adam_memories(data: Draw, sizes: list[int], lr: float, batch: int,
                  betas: tuple[float, float] = (0.0, 0.0)) -> torch.Tensor:
    """Adam with step size lr/d and `betas` from W = 0 over consecutive batches of `batch`
    samples, one pass; the snapshot for n samples is W after ⌊n / batch⌋ steps. W [K, S, d, d].
    The loss is the sum over seeds of each seed's mean over its batch: K independent runs."""
    if not lr > 0 or batch < 1:
        raise ValueError(f"Adam needs a step size > 0 and a batch >= 1, got {lr} and {batch}.")
    K, _, d = data.E.shape
    seeds = torch.arange(K, device=data.E.device)[:, None]
    W = torch.zeros(K, d, d, dtype=data.E.dtype, device=data.E.device, requires_grad=True)
    optimizer = torch.optim.Adam([W], lr=lr / d, betas=betas)
    wanted = {n // batch for n in sizes}
    snapshots = {0: W.detach().clone()}
    for step in range(1, max(sizes) // batch + 1):
        z = data.samples[:, (step - 1) * batch: step * batch]  # [K, B]
        logits = data.E[seeds, z] @ W.transpose(1, 2) @ data.U.transpose(1, 2)  # [K, B, M]
        loss = F.cross_entropy(logits.flatten(0, 1), data.answers[seeds, z].flatten(), reduction="sum") / batch
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step in wanted:
            snapshots[step] = W.detach().clone()
    return torch.stack([snapshots[n // batch] for n in sizes], 1)
