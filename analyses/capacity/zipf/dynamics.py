"""Gradient descent on small associative memories over steps (Cabannes, Simsek & Bietti, ICML
2024; the talk's "Optimization with imbalance and small capacity"), after the authors' code
(facebookresearch/pal, projects/gradient_descent):

  oscillation        two tokens with correlated embeddings e_1 = (1, 0), e_2 = (c, √(1-c²)),
                     imbalanced p = (p_1, 1 - p_1), f(z) = z, U = I: a large step oscillates,
                     yet reaches perfect accuracy sooner (exp_spike_2d.py, exp_learning_rates.py);
  overoptimisation   N tokens on the circle (d = 2, unit norm), Zipf p, f(z) = z mod 2, U = I:
                     under-parameterised, the cross-entropy's minimiser is not the best
                     classifier, and more steps can raise the error (exp_forgetting_2d.py).

Full-batch gradient descent on the population cross-entropy Σ_z p(z) ℓ(f(z), U W e_z) from
W = 0, several step sizes and problems at once: W [B, L, d, d] for B problems and L step sizes.
The loss and the error (memory.recall_error: exact, ties are errors) are recorded at W_t before
each step t = 0..T-1, as the authors record them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from analyses.capacity.zipf.memory import matrix_scores, recall_error, recall_wrong, zipf_law
from models.recall.weights import random_directions


def two_tokens(correlation: float, first: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The oscillation problem: E [1, 2, 2] with e_1·e_2 = correlation, U = I [1, 2, 2],
    p = (first, 1 - first) [2] float64, f(z) = z [1, 2]."""
    if not -1 < correlation < 1 or not 0 < first < 1:
        raise ValueError(f"two tokens need a correlation in (-1, 1) and p_1 in (0, 1), got {correlation} and {first}.")
    E = torch.tensor([[1.0, 0.0], [correlation, math.sqrt(1 - correlation ** 2)]], dtype=torch.float64)
    p = torch.tensor([first, 1 - first], dtype=torch.float64)
    return E[None], torch.eye(2, dtype=torch.float64)[None], p, torch.arange(2)[None]


def circle_tokens(tokens: int, alpha: float, seeds: list[int]) -> tuple[torch.Tensor, ...]:
    """The over-optimisation problem, one per seed: unit embeddings in d = 2 E [K, N, 2]
    (models.recall.weights.random_directions), U = I [K, 2, 2], Zipf p [N], f(z) = z mod 2 [K, N]."""
    if tokens < 2:
        raise ValueError(f"N (tokens) must be >= 2, got {tokens}.")
    E = torch.stack([random_directions(tokens, 2, "sphere", torch.Generator().manual_seed(s)) for s in seeds]).double()
    answers = (torch.arange(tokens) % 2).expand(len(seeds), tokens)
    return E, torch.eye(2, dtype=torch.float64).expand(len(seeds), 2, 2), zipf_law(alpha, tokens), answers


def descent(E: torch.Tensor, U: torch.Tensor, p: torch.Tensor, answers: torch.Tensor, lrs: list[float],
            steps: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Population loss and error [B, L, T] of gradient descent from W = 0 with each step size,
    for B problems E [B, N, d], U [B, M, d], answers [B, N] sharing p [N]."""
    if steps < 1 or not all(lr > 0 for lr in lrs):
        raise ValueError(f"descent needs steps >= 1 and step sizes > 0, got {steps} and {list(lrs)}.")
    E, U, p, answers = E.to(device), U.to(device), p.to(device), answers.to(device)
    B, N, d = E.shape
    L, outputs = len(lrs), U.shape[1]
    lr = torch.tensor(lrs, dtype=E.dtype, device=device)[None, :, None, None]
    W = torch.zeros(B, L, d, d, dtype=E.dtype, device=device)
    onehot = F.one_hot(answers, outputs).to(E.dtype)[:, None]  # [B, 1, N, M]
    losses, errors = [], []
    for _ in range(steps):
        scores = matrix_scores(W, E, U)  # [B, L, N, M]
        log_prob = scores.log_softmax(-1)
        losses.append(-(onehot * log_prob).sum(-1) @ p)
        errors.append(recall_error(scores, answers, p))
        weighted = p[:, None] * (log_prob.exp() - onehot)  # [B, L, N, M]: dL/dscores
        W = W - lr * (U.transpose(1, 2)[:, None] @ weighted.transpose(2, 3) @ E[:, None])
    return torch.stack(losses, -1), torch.stack(errors, -1)


def best_error(E: torch.Tensor, p: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """The smallest error any W reaches [B] on a d = 2 problem with two answers: W recalls 0
    where γ·e_z > 0 for γ = W^T (u_0 - u_1), any γ of the plane; the error only changes where γ
    crosses a line γ·e_z = 0, so every arc between those angles is tried at its middle."""
    if E.shape[-1] != 2:
        raise ValueError("best_error is for d = 2.")
    angle = torch.atan2(E[..., 1], E[..., 0])  # [B, N]
    cuts = torch.cat([angle + math.pi / 2, angle - math.pi / 2], -1).remainder(2 * math.pi).sort(-1).values
    middle = (cuts + torch.cat([cuts[:, 1:], cuts[:, :1] + 2 * math.pi], -1)) / 2  # [B, 2N]
    gamma = torch.stack([middle.cos(), middle.sin()], -1)  # [B, 2N, 2]
    scores = torch.stack([E @ gamma.transpose(1, 2), torch.zeros_like(E[..., 0])[..., None].expand(-1, -1,
                                                                                                   middle.shape[1])],
                         -1).transpose(1, 2)  # [B, 2N, N, 2]: (γ·e_z, 0)
    wrong = recall_wrong(scores, answers)  # [B, 2N, N]
    return (wrong.to(p.dtype) * p).sum(-1).amin(-1)
