"""Every rate or share comes with a 95% percentile-bootstrap interval (TransformerLens's
`utilities.statistics.bootstrap_ci`, the one behind PatchingResult.bootstrap_ci)."""
from __future__ import annotations

import torch
from transformer_lens.utilities.statistics import bootstrap_ci, derive_generator

N_RESAMPLES = 500


def with_interval(name: str, values: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """Columns `name`, `name_low`, `name_high`: mean over the last axis of `values`
    [..., samples] and its 95% bootstrap interval (NaN samples are dropped)."""
    values = values.float().cpu()
    if torch.isnan(values).any():
        mean = values.nanmean(-1)
        filled = torch.where(torch.isnan(values), mean[..., None], values)  # neutral for the interval
    else:
        mean, filled = values.mean(-1), values
    low, high = bootstrap_ci(filled, dim=-1, n_resamples=N_RESAMPLES,
                             generator=derive_generator(seed, "bootstrap", name))
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
