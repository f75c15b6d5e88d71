"""The rank-d floor of the distribution task (Dana et al., Propositions 1-2).

Any model whose logits are W_U E(t) with W_U in R^{d x N} and no output bias (every
Transformer of embedding size d) is a *sequence encoder* of rank d, so its mean KL is at
least  min over A [T_0, d], B [d, N] of  mean_t KL(pi_t || softmax(A_t B)).  When d >= N - 1
the floor is 0 (softmax ignores a per-row shift, so N - 1 dimensions reach every target).
"""
from __future__ import annotations

import torch


def kl_of_logits(log_targets: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of KL(pi_t || softmax(logits_t)), nats: [T_0, N] x [T_0, N] -> []."""
    return (log_targets.exp() * (log_targets - logits.log_softmax(-1))).sum(-1).mean()


def rank_d_kl_floor(log_targets: torch.Tensor, d: int, restarts: int = 4, iterations: int = 300,
                    seed: int = 0) -> float:
    """The best mean KL (nats) of a rank-d sequence encoder on targets log pi [T_0, N].

    Exact 0 when d >= N - 1. Otherwise the KL is minimised over both factors with L-BFGS in
    float64 from several starts (the truncated SVD of the row-centred log-targets, the best
    rank-d fit in squared error and exact when those have rank <= d, and `restarts` random
    ones), keeping the best. A numerical optimum of a non-convex problem, so an upper bound
    on the true infimum; tests compare it with a brute-force search on a small case."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}.")
    T0, N = log_targets.shape
    if d >= N - 1:
        return 0.0
    log_pi = log_targets.detach().double().cpu()
    centred = log_pi - log_pi.mean(-1, keepdim=True)
    U, S, Vh = torch.linalg.svd(centred, full_matrices=False)
    scale = S[:d].sqrt()
    starts = [(U[:, :d] * scale, scale[:, None] * Vh[:d])]
    g = torch.Generator().manual_seed(seed)
    starts += [(torch.randn(T0, d, generator=g, dtype=torch.float64),
                torch.randn(d, N, generator=g, dtype=torch.float64)) for _ in range(restarts)]
    return min(_minimise(log_pi, A, B, iterations) for A, B in starts)


def _minimise(log_pi: torch.Tensor, A: torch.Tensor, B: torch.Tensor, iterations: int) -> float:
    """L-BFGS on mean KL(pi || softmax(A B)) from (A [T_0, d], B [d, N]); the final KL."""
    A, B = A.contiguous().requires_grad_(), B.contiguous().requires_grad_()
    optimizer = torch.optim.LBFGS([A, B], lr=1, max_iter=iterations, tolerance_grad=1e-12,
                                  tolerance_change=1e-14, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = kl_of_logits(log_pi, A @ B)
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(kl_of_logits(log_pi, A @ B))
