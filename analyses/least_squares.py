"""Least-squares fits with their degrees of freedom: every fit an analysis reports is made here.

A fit with no more points than parameters (or whose points cannot tell its parameters apart,
e.g. a line through several points at one x) passes through its points whatever they are: it
is *undetermined*, reported as "undetermined (n points, p parameters)" and never as a number.
With at least one degree of freedom each parameter comes with a 95% interval (Student's t on
the least-squares standard errors, its quantile exact; for the exponent of a + b x^k, the profile
interval). The Zipf laws' exponents (analyses/capacity/zipf) rest on the same slopes and t."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from models.text import count, number

CONFIDENCE = 0.95
LINE = ("intercept", "slope")
POWER = ("exponent", "intercept", "coefficient")


@dataclass(frozen=True)
class Fit:
    """One least-squares fit: its parameters by name (None when undetermined), how many points
    it had, R^2 and each parameter's 95% interval (None where it has none)."""

    names: tuple[str, ...]
    points: int
    values: tuple[float, ...] | None = None  # None: undetermined
    intervals: tuple[tuple[float, float] | None, ...] | None = None
    r2: float | None = None
    distinct_x: int | None = None  # set when the points sit at too few x values to fit

    @property
    def parameters(self) -> int:
        return len(self.names)

    @property
    def dof(self) -> int:
        """Degrees of freedom: points minus parameters."""
        return self.points - self.parameters

    @property
    def determined(self) -> bool:
        return self.values is not None

    def get(self, name: str) -> float | None:
        """The parameter `name`, or None when the fit is undetermined."""
        return self.values[self.names.index(name)] if self.determined else None

    def interval(self, name: str) -> tuple[float, float] | None:
        return self.intervals[self.names.index(name)] if self.determined else None

    def undetermined(self) -> str:
        """'undetermined (3 points, 3 parameters)' (or '... (3 points at 1 x value, 2 parameters)')."""
        at = f" at {count(self.distinct_x, 'x value')}" if self.distinct_x is not None else ""
        return f"undetermined ({count(self.points, 'point')}{at}, {count(self.parameters, 'parameter')})"

    def show(self, name: str, fmt: str = ".2f") -> str:
        """'1.71 [95% CI 1.20, 2.22]', or the undetermined text."""
        if not self.determined:
            return self.undetermined()
        text = number(self.get(name), fmt)
        ci = self.interval(name)
        return text if ci is None else text + f" [95% CI {_bound(ci[0], fmt)}, {_bound(ci[1], fmt)}]"

    def to_json(self) -> dict:
        """{name: value, ..., r2, ci95: {name: [low, high]}, points, parameters}, or, undetermined,
        {undetermined: true, points, parameters} (and distinct_x where the points sit at too few
        x values). An interval's unbounded end is null."""
        shape = {"points": self.points, "parameters": self.parameters}
        if not self.determined:
            return {"undetermined": True, **shape, **({"distinct_x": self.distinct_x} if self.distinct_x else {})}
        ci = {n: [None if math.isinf(b) else b for b in c] for n, c in zip(self.names, self.intervals) if c is not None}
        return {**dict(zip(self.names, self.values)), "r2": self.r2, "ci95": ci, **shape}

    @classmethod
    def from_json(cls, data: dict, names: tuple[str, ...]) -> Fit:
        """The fit `to_json` wrote (its parameters `names`, in order)."""
        if data.get("undetermined"):
            return cls(names, data["points"], distinct_x=data.get("distinct_x"))
        ci = data.get("ci95", {})
        unbounded = (-math.inf, math.inf)
        intervals = tuple(tuple(unbounded[i] if b is None else b for i, b in enumerate(ci[n])) if n in ci else None
                          for n in names)
        return cls(names, data["points"], tuple(data[n] for n in names), intervals, data.get("r2"))


def _bound(x: float, fmt: str) -> str:
    return "-inf" if x == -math.inf else "inf" if x == math.inf else number(x, fmt)


def t_cdf(t: float, dof: int) -> float:
    """Student's t distribution function at t >= 0 for an integer `dof`, exact: the finite sums of
    Abramowitz & Stegun 26.7.3-4 in θ = atan(t/√dof)."""
    theta = math.atan(t / math.sqrt(dof))
    c, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if dof % 2 == 0:
        for k in range(1, dof // 2):
            term *= c * (2 * k - 1) / (2 * k)
            total += term
        return 0.5 + 0.5 * math.sin(theta) * total
    if dof == 1:
        return 0.5 + theta / math.pi
    for k in range(1, (dof - 1) // 2):
        term *= c * (2 * k) / (2 * k + 1)
        total += term
    return 0.5 + (theta + math.sin(theta) * math.cos(theta) * total) / math.pi


def t_quantile(q: float, dof: int) -> float:
    """The q-quantile of Student's t with `dof` degrees of freedom (q in (0.5, 1)), by bisection
    on t_cdf to 1e-12."""
    if dof < 1 or not 0.5 < q < 1:
        raise ValueError(f"t_quantile needs dof >= 1 and q in (0.5, 1), got {dof} and {q}.")
    low, high = 0.0, 1.0
    while t_cdf(high, dof) < q:
        low, high = high, 2 * high
    while high - low > 1e-12 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, dof) < q else (low, mid)
    return (low + high) / 2


def linear_least_squares(design: np.ndarray, y: np.ndarray, names: tuple[str, ...],
                         distinct_x: int | None = None) -> Fit:
    """y ~ design @ beta (design [n, p]): beta, R^2 and t intervals; undetermined when n <= p or
    the design's columns cannot be told apart (rank < p)."""
    n, p = design.shape
    if n <= p or np.linalg.matrix_rank(design) < p:
        return Fit(names, n, distinct_x=distinct_x if n > p else None)
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ beta
    sse, sst = float(residual @ residual), float(((y - y.mean()) ** 2).sum())
    se = np.sqrt(sse / (n - p) * np.diag(np.linalg.inv(design.T @ design)))
    t = t_quantile((1 + CONFIDENCE) / 2, n - p)
    intervals = tuple((float(b - t * s), float(b + t * s)) for b, s in zip(beta, se))
    return Fit(names, n, tuple(map(float, beta)), intervals, 1 - sse / sst if sst > 0 else None)


def fit_line(x, y) -> Fit:
    """y = intercept + slope x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return linear_least_squares(np.stack([np.ones_like(x), x], 1), y, LINE,
                                len(np.unique(x)))


def fit_log_log(x, y) -> Fit:
    """log y = intercept + slope log x: the slope is the exponent of y ~ x^slope, over the
    points with x, y > 0 (a log has no other; `points` counts those)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    positive = (x > 0) & (y > 0)
    return fit_line(np.log(x[positive]), np.log(y[positive]))


def fit_polynomial(x, y, degree: int) -> Fit:
    """y = c0 + c1 x + ... + c_degree x^degree."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return linear_least_squares(np.stack([x ** i for i in range(degree + 1)], 1), y,
                                tuple(f"c{i}" for i in range(degree + 1)), len(np.unique(x)))


def fit_power(x, y, grid: np.ndarray | None = None) -> Fit:
    """y = intercept + coefficient x^exponent: the exponent on a grid (default 0.1 .. 4, step
    0.01), (intercept, coefficient) exact for each; the exponent's 95% interval is the profile
    one, the grid's exponents whose SSE is within F(1, n - 3) of the best (an end of the grid
    inside it is written as -inf or inf: the data do not bound it there)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) <= 3 or len(np.unique(x)) < 3:
        return Fit(POWER, len(x), distinct_x=len(np.unique(x)) if len(x) > 3 else None)
    grid = np.round(np.arange(0.1, 4.0001, 0.01), 2) if grid is None else grid
    sse = np.empty(len(grid))
    coefs = []
    for i, k in enumerate(grid):
        A = np.stack([np.ones_like(x), x ** k], 1)
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        sse[i] = float(((A @ coef - y) ** 2).sum())
        coefs.append(coef)
    best = int(np.argmin(sse))
    dof = len(x) - 3
    inside = np.flatnonzero(sse <= sse[best] * (1 + t_quantile((1 + CONFIDENCE) / 2, dof) ** 2 / dof))
    low = -math.inf if inside[0] == 0 else float(grid[inside[0]])
    high = math.inf if inside[-1] == len(grid) - 1 else float(grid[inside[-1]])
    sst = float(((y - y.mean()) ** 2).sum())
    a, b = map(float, coefs[best])
    return Fit(POWER, len(x), (float(grid[best]), a, b), ((low, high), None, None),
               float(1 - sse[best] / sst) if sst > 0 else None)
