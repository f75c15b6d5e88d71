"""Counter-based random numbers: 32-bit values that are a hash of (seed, step, index).

A value depends on its seed, the step and its index alone, so a model's data is the same
whether it is drawn alone or in a stack of K seeds, and on every device: the hash is
integer tensor arithmetic only (int64 holding 32-bit values, every product below 2^63, so
nothing overflows), drawn for all K seeds in a fixed number of torch calls.
"""
from __future__ import annotations

import torch

MASK = 0xFFFFFFFF  # 2^32 - 1
GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: separates a seed's two keys


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective avalanche mix of 32-bit values held in int64, in place (xor-shift-multiply,
    hash-prospector's [16 21f0aaad 15 735a2d97 15]; both multipliers below 2^31)."""
    x.bitwise_xor_(x >> 16)
    x.mul_(0x21F0AAAD).bitwise_and_(MASK)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x735A2D97).bitwise_and_(MASK)
    return x.bitwise_xor_(x >> 15)


def keys(seeds: torch.Tensor, step: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit keys [K, 1] per seed [K] (any int64) at `step` (0 <= step < 2^32, an int
    or an int64 tensor of one element on the seeds' device)."""
    low = mix32(seeds & MASK)
    key = mix32(mix32(low ^ ((seeds >> 32) & MASK)) ^ step)  # [K]
    return key[:, None], mix32(key ^ GOLDEN)[:, None]


def bits(seeds: torch.Tensor, step: int | torch.Tensor, n: int) -> torch.Tensor:
    """Uniform 32-bit values [K, n] (int64 in 0..2^32-1): value i of seed k at `step` is
    mix32(mix32(i ^ key1) ^ key2) with the keys of (seed k, step); n <= 2^32."""
    key1, key2 = keys(seeds, step)  # [K, 1] each
    index = torch.arange(n, device=seeds.device)  # [n]
    return mix32(mix32(index ^ key1).bitwise_xor_(key2))  # [K, n]


def below(values: torch.Tensor, n: int) -> torch.Tensor:
    """Uniform integers in 0..n-1 from uniform 32-bit values (n < 2^31): floor(value * n / 2^32)."""
    return (values * n) >> 32


def thresholds(probs: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF table of a distribution [n]: its cumulative probabilities in units of
    2^-32 (int64 [n], the last exactly 2^32), computed in float64."""
    cdf = probs.double().cumsum(0)
    ticks = (cdf / cdf[-1] * 2.0 ** 32).round().long()
    ticks[-1] = 2 ** 32
    return ticks


def inverse_cdf(values: torch.Tensor, ticks: torch.Tensor) -> torch.Tensor:
    """Draws from the distribution of `ticks` (thresholds()) given uniform 32-bit values:
    i where ticks[i-1] <= value < ticks[i], so P(i) = (ticks[i] - ticks[i-1]) / 2^32."""
    return torch.searchsorted(ticks, values, right=True)
