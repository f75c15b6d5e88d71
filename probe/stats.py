"""95% intervals of every measurement over facts or contexts.

A share (of 0/1 outcomes: a fact answered, a fact labelled mlp; or a mean of such shares)
gets Wilson's score interval, which stays honest at 0 and 1: 0 of 64 is [0, 5.7%], where a
bootstrap of 64 zeros collapses to [0, 0]. Any other mean (a margin, a restored share of a
logit difference, an attention mass) gets a 95% percentile-bootstrap interval: the interval
of TransformerLens's `utilities.statistics.bootstrap_ci` (the one behind
PatchingResult.bootstrap_ci), computed from the same resamples as a product of resample
counts and values, which is much faster for thousands of facts."""
from __future__ import annotations

from statistics import NormalDist

import torch
from transformer_lens.utilities.statistics import derive_generator

N_RESAMPLES = 500
RESAMPLES_PER_DRAW = 256  # resamples drawn at a time, as bootstrap_ci draws them


def bootstrap_ci(x: torch.Tensor, n_resamples: int, generator: torch.Generator,
                 confidence: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Percentile bootstrap interval of the mean over the last axis of x [..., n]: the
    draws of TransformerLens's bootstrap_ci (resample indices [resample, n] shared by every
    leading cell), each resample's mean as counts @ x, and torch.quantile's linear
    interpolation on the sorted means."""
    n = x.shape[-1]
    idx = torch.cat([torch.randint(0, n, (min(RESAMPLES_PER_DRAW, n_resamples - start), n), generator=generator)
                     for start in range(0, n_resamples, RESAMPLES_PER_DRAW)])  # [resample, n]
    counts = torch.zeros(n_resamples, n).scatter_add_(1, idx, torch.ones(n_resamples, n))  # [resample, n]
    means = (x.float() @ counts.T / n).sort(-1).values  # [..., resample]
    alpha = (1 - confidence) / 2

    def quantile(q):  # linear interpolation between order statistics
        position = q * (n_resamples - 1)
        below, frac = int(position), position - int(position)
        above = min(below + 1, n_resamples - 1)
        return means[..., below] + frac * (means[..., above] - means[..., below])
    return quantile(alpha).to(x.dtype), quantile(1 - alpha).to(x.dtype)


def wilson_interval(share: torch.Tensor, n: torch.Tensor | int,
                    confidence: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Wilson's score interval of a proportion `share` (in [0, 1]) of `n` outcomes. For a mean of
    n values in [0, 1] that are not all 0 or 1 it is conservative: their variance is at most
    share (1 - share), the binomial one. A share of 0 starts at exactly 0, a share of 1 ends at
    exactly 1, on every CPU."""
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    n = torch.as_tensor(n, dtype=torch.float32)
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * torch.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    # 0 of n starts at 0 and n of n ends at 1 exactly (centre - half cancels to float noise there)
    low = torch.where(share <= 0, 0.0, (centre - half).clamp(min=0.0))
    high = torch.where(share >= 1, 1.0, (centre + half).clamp(max=1.0))
    return low, high


def share_with_interval(name: str, outcomes: torch.Tensor) -> dict[str, torch.Tensor]:
    """Columns `name`, `name_low`, `name_high`: the share over the last axis of `outcomes`
    [..., samples] (0/1, or values in [0, 1]; NaN samples are dropped) and its Wilson 95% interval."""
    outcomes = outcomes.float().cpu()
    if ((outcomes < 0) | (outcomes > 1)).any():
        raise ValueError(f"{name}: a share is a mean of values in [0, 1]; use with_interval for other means.")
    n = (~torch.isnan(outcomes)).sum(-1)  # [...]
    share = outcomes.nanmean(-1)
    low, high = wilson_interval(share, n)
    return {name: share, f"{name}_low": low, f"{name}_high": high}


def with_interval(name: str, values: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """Columns `name`, `name_low`, `name_high`: mean over the last axis of `values`
    [..., samples] and its 95% bootstrap interval (NaN samples are dropped). A share of 0/1
    outcomes takes share_with_interval."""
    values = values.float().cpu()
    if torch.isnan(values).any():
        mean = values.nanmean(-1)
        filled = torch.where(torch.isnan(values), mean[..., None], values)  # neutral for the interval
    else:
        mean, filled = values.mean(-1), values
    low, high = bootstrap_ci(filled, N_RESAMPLES, derive_generator(seed, "bootstrap", name))
    return {name: mean, f"{name}_low": low, f"{name}_high": high}


def ratio_with_interval(name: str, numerator: torch.Tensor, denominator: torch.Tensor,
                        seed: int = 0) -> dict[str, torch.Tensor]:
    """mean(numerator) / mean(denominator) over the last axis [..., samples], with a 95%
    bootstrap interval from resampling the samples jointly."""
    numerator, denominator = numerator.float().cpu(), denominator.float().cpu()
    n = numerator.shape[-1]
    g = derive_generator(seed, "ratio", name)
    idx = torch.randint(0, n, (N_RESAMPLES, n), generator=g)  # [resample, n]
    ratios = numerator[..., idx].mean(-1) / denominator[..., idx].mean(-1)  # [..., resample]
    low, high = torch.nanquantile(ratios, torch.tensor([0.025, 0.975]), dim=-1)
    return {name: numerator.mean(-1) / denominator.mean(-1), f"{name}_low": low, f"{name}_high": high}
