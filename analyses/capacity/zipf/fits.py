"""The exponents of the Zipf scaling laws: measured per seed (the log-log slope of the error
against n or d), their mean with a 95% Student-t interval over seeds, the talk's exponent for
each scheme, and the infinite-memory error the n-law is Hutter's rate of."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analyses.least_squares import fit_log_log, t_quantile
from models.text import number

MIN_POINTS = 3  # a slope needs three points with a non-zero error: two always lie on a line
LEVEL = 0.95


@dataclass(frozen=True)
class Exponent:
    """A measured exponent: the mean of the seeds' slopes and the half-width of its interval
    (None when undetermined), the seeds it rests on, and why it is missing where it is."""

    value: float | None
    half_width: float | None
    seeds: int
    note: str = ""

    def text(self) -> str:
        if self.value is None:
            return self.note
        interval = f" ± {self.half_width:.2f}" if self.half_width is not None else f" ({self.note})"
        return number(self.value, ".2f") + interval


def seed_slope(x, errors) -> float | None:
    """The least-squares slope of log error against log x over the points with an error > 0,
    or None with fewer than MIN_POINTS of them."""
    return fit_log_log(x, errors).get("slope")  # analyses.least_squares: undetermined (None) below MIN_POINTS


def interval(values: list[float], missing: str) -> Exponent:
    """The mean of per-seed values and its 95% interval mean ± t·sd/√k over the k values;
    `missing` says why there is none when the list is empty."""
    if not values:
        return Exponent(None, None, 0, missing)
    if len(values) == 1:
        return Exponent(values[0], None, 1, "one seed: no interval")
    sd = float(np.std(values, ddof=1))
    half = t_quantile((1 + LEVEL) / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return Exponent(float(np.mean(values)), half, len(values))


def exponent(x, errors) -> Exponent:
    """The exponent of errors [K, P] against x [P]: the interval of the seeds' slopes."""
    slopes = [s for s in (seed_slope(x, row) for row in np.atleast_2d(errors)) if s is not None]
    return interval(slopes, f"undetermined: no seed has {MIN_POINTS} points with an error > 0")


def local_exponents(x, errors) -> list[float | None]:
    """The slope between consecutive points of the mean error (None where it is 0): how a
    decay faster than any power shows, its slope steepening with d."""
    x, mean = np.log(x), np.atleast_2d(errors).mean(0)
    return [float((math.log(b) - math.log(a)) / (x1 - x0)) if a > 0 and b > 0 else None
            for a, b, x0, x1 in zip(mean[:-1], mean[1:], x[:-1], x[1:])]


def theory(scheme: str, axis: str, alpha: float, auto_threshold: bool = True) -> tuple[float | None, str]:
    """The talk's exponent of the error against n or d for a scheme or optimiser, and its law.
    Against n every estimator has Hutter's n^-(α-1)/α (its d-term aside); against d: counts
    (and one gradient step, q ≈ p) d^-(α-1)/(2α), the threshold scheme d^-(α-1) (s chosen with n
    and d), seen-once (and SGD with a large step, q ≈ 1) faster than any power once d >> N."""
    if alpha <= 1:
        return None, "none drawn: the laws need α > 1"
    if axis == "n":
        return -(alpha - 1) / alpha, "n^-(α-1)/α (Hutter; where the d-term is small)"
    if scheme in ("counts", "gd"):
        return -(alpha - 1) / (2 * alpha), "d^-(α-1)/(2α)"
    if scheme == "threshold":
        return (-(alpha - 1), "d^-(α-1)") if auto_threshold else (None, "none: the law chooses s with n and d")
    if scheme in ("seen", "sgd"):
        return None, "faster than any power of d once d >> N"
    return None, "none given by the talk"


def infinite_memory_error(p: np.ndarray, n) -> np.ndarray:
    """Σ_z p(z) (1 - p(z))^n for each n: the expected error of a memory that recalls every token
    seen once and nothing else (Hutter's estimator), whose slope is the n-law at this N."""
    with np.errstate(divide="ignore"):  # p(z) = 1 (one token, or the rest underflowed): (1 - p)^n = 0
        return np.array([float((p * np.exp(k * np.log1p(-p))).sum()) for k in np.atleast_1d(n)])


def top_tokens_error(p: np.ndarray, stored) -> np.ndarray:
    """Σ_{z > P} p(z) for each P of `stored`: the error of a memory that recalls the P most
    frequent tokens and nothing else (the threshold scheme at its budget), whose slope against d
    is the d-law at this N."""
    tail = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])  # tail[P] = Σ_{z > P} p(z)
    return tail[np.minimum(np.atleast_1d(stored).astype(int), len(p))]
