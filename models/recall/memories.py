"""Associative memories over frozen random embeddings (paper section 3, Figure 1).

N inputs with embeddings e_z and M outputs with embeddings u_y (random, frozen, [N, d] and
[M, d]) and the map f(z) = floor(z * M / N); M grows with N (M = ceil(outputs_per_input * N))
or is fixed (`n_outputs`, the paper's Figure 6). A memory scores output y for input z by
  linear       u_y^T W e_z                 W [d, d]              d^2 parameters
  low rank     u_y^T A B^T e_z             A, B [d, m]          2 m d parameters
  MLP          u_y^T W_1 relu(W_2^T e_z)   W_1, W_2 [d, m]      2 m d parameters
and recalls argmax_y. `fit` trains K memories at once (one per seed, each with its own
embeddings) with Adam on the full cross-entropy over the N inputs (uniform p(z)), and
reports each one's best accuracy over training (the paper's protocol). `one_step_memory`
is the one-gradient-step construction W = sum_z p(z) (u_f(z) - mean_y u_y) e_z^T.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.recall.weights import random_directions

KINDS = ("linear", "mlp")


@dataclass(frozen=True)
class MemoryConfig:
    kind: str = "linear"  # linear | mlp
    d: int = 16  # embedding dimension
    m: int | None = None  # linear: rank (None = full d x d); mlp: width
    embedding: str = "sphere"  # sphere (unit norm) | gaussian (N(0, 1/d) entries)
    outputs_per_input: float = 1.0  # M = ceil(outputs_per_input * N)
    steps: int = 2000  # maximum Adam steps
    lr: float = 1e-2
    target_accuracy: float = 0.99  # stop once every model has reached it
    n_outputs: int | None = None  # M fixed whatever N (None: M = ceil(outputs_per_input * N))
    eval_every: int = 1  # accuracy measured every this many steps (best over the measurements)

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}.")
        if self.d < 1 or (self.m is not None and self.m < 1):
            raise ValueError(f"d and m must be >= 1, got d={self.d}, m={self.m}.")
        if self.kind == "mlp" and self.m is None:
            raise ValueError("an MLP memory needs its width m.")
        if not 0 < self.outputs_per_input <= 1 or self.steps < 1 or not self.lr > 0:
            raise ValueError("outputs_per_input must be in (0, 1], steps >= 1 and lr > 0.")
        if self.n_outputs is not None and self.n_outputs < 2:
            raise ValueError(f"n_outputs must be >= 2, got {self.n_outputs}.")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}.")

    def outputs(self, n: int) -> int:
        """M, the number of outputs for N = n inputs."""
        return self.n_outputs if self.n_outputs is not None else math.ceil(self.outputs_per_input * n)

    @property
    def parameters(self) -> int:
        return self.d * self.d if self.kind == "linear" and self.m is None else 2 * self.m * self.d

    @property
    def theory(self) -> int:
        """The capacity scale of the theory: d^2 (full linear), m*d otherwise (up to logs)."""
        return self.d * self.d if self.kind == "linear" and self.m is None else self.m * self.d


def memory_data(n: int, cfg: MemoryConfig, seeds: list[int], device="cpu"):
    """Per seed, frozen embeddings E [K, N, d], U [K, M, d] and targets f [N]."""
    n_out = cfg.outputs(n)
    E, U = [], []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        E.append(random_directions(n, cfg.d, cfg.embedding, g))
        U.append(random_directions(n_out, cfg.d, cfg.embedding, g))
    targets = torch.arange(n) * n_out // n  # f(z) = floor(z M / N)
    return torch.stack(E).to(device), torch.stack(U).to(device), targets.to(device)


def init_memory(cfg: MemoryConfig, seeds: list[int], device="cpu") -> dict[str, torch.Tensor]:
    """K memories' trainable weights, N(0, 1/fan_in) entries (standard initialisation)."""
    d, m = cfg.d, cfg.m
    shapes = {"W": (d, d)} if cfg.kind == "linear" and m is None else {"W_1": (d, m), "W_2": (d, m)}
    params = {}
    for name, shape in shapes.items():
        fan_in = m if name == "W_1" and cfg.kind == "mlp" else d
        rows = [torch.randn(shape, generator=torch.Generator().manual_seed(10_000 + s)) / math.sqrt(fan_in)
                for s in seeds]
        params[name] = torch.stack(rows).to(device)
    return params


def memory_logits(params: dict, E: torch.Tensor, U: torch.Tensor, kind: str) -> torch.Tensor:
    """Scores [K, N, M] of every output for every input."""
    if "W" in params:  # full linear: (W e_z)
        out = E @ params["W"].transpose(1, 2)  # [K, N, d]
    elif kind == "linear":  # low rank: A B^T e_z with A = W_1, B = W_2
        out = (E @ params["W_2"]) @ params["W_1"].transpose(1, 2)  # [K, N, d]
    else:  # MLP: W_1 relu(W_2^T e_z)
        out = F.relu(E @ params["W_2"]) @ params["W_1"].transpose(1, 2)  # [K, N, d]
    return out @ U.transpose(1, 2)  # [K, N, M]


def fit(cfg: MemoryConfig, n: int, seeds: list[int], device="cpu") -> dict:
    """Train one memory per seed on N associations; each one's best accuracy over training
    (a share of the N inputs) and the steps run."""
    cfg.validate()
    E, U, targets = memory_data(n, cfg, seeds, device)
    params = {k: p.requires_grad_() for k, p in init_memory(cfg, seeds, device).items()}
    optimizer = torch.optim.Adam(params.values(), lr=cfg.lr)
    best = torch.zeros(len(seeds), device=device)
    step = 0
    for step in range(1, cfg.steps + 1):
        logits = memory_logits(params, E, U, cfg.kind)  # [K, N, M]
        if (step - 1) % cfg.eval_every == 0:  # the weights after step - 1 updates
            with torch.no_grad():
                best = torch.maximum(best, (logits.argmax(-1) == targets).float().mean(-1))
            if bool((best >= cfg.target_accuracy).all()):
                break
        # sum over models of each model's mean cross-entropy: K independent problems
        loss = F.cross_entropy(logits.flatten(0, 1), targets.repeat(len(seeds)), reduction="sum") / n
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {"accuracy": best.tolist(), "steps_run": step}


def one_step_memory(E: torch.Tensor, U: torch.Tensor, targets: torch.Tensor,
                    p: torch.Tensor | None = None) -> torch.Tensor:
    """W [d, d] after one gradient step of size 1 on the population cross-entropy from W = 0:
    sum_z p(z) (u_f(z) - mean_y u_y) e_z^T (at W = 0 every output is equally likely).
    E [N, d], U [M, d], targets [N], p [N] (uniform when None)."""
    p = torch.full((len(E),), 1.0 / len(E)) if p is None else p
    centred = U[targets] - U.mean(0)  # [N, d]
    return (p[:, None] * centred).T @ E  # [d, d]


def recall_accuracy(W: torch.Tensor, E: torch.Tensor, U: torch.Tensor, targets: torch.Tensor) -> float:
    """Share of inputs z with argmax_y u_y^T W e_z = f(z)."""
    return float(((E @ W.T @ U.T).argmax(-1) == targets).float().mean())
