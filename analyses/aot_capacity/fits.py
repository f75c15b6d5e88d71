"""The fits of capacity.csv: accuracy linear in H, a power of d_h, two linear pieces in d,
the per-head slope of the d = d_h sweep."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analyses.aot_capacity.sweep import AotSweep
from tasks.association import AssociationTask


def layout_fits(capacity: pd.DataFrame, task: AssociationTask, sweep: AotSweep) -> dict:
    """The fits and comparisons of one head layout's rows of capacity.csv."""
    fits = {}
    heads_rows = capacity[capacity.sweep == "heads"]
    if len(heads_rows) >= 2:
        fits["fit_H"] = fit_linear(heads_rows.n_heads.to_numpy(float), heads_rows.accuracy.to_numpy(float))
        fits["fit_H_r2"] = fits["fit_H"]["r2"]
        slope = per_head_slopes(heads_rows).slope
        if len(slope):  # associations per head (before saturation), per head dimension
            fits["per_head_slope"] = float(slope.iloc[0])
            fits["associations_per_head_dim"] = (float(slope.iloc[0]) * task.n_sequences / (1 - 1 / task.n_tokens)
                                                 / sweep.d_head)
    dh_rows = capacity[capacity.sweep == "d_head"]
    if len(dh_rows) >= 3:
        fits["fit_dh"] = fit_power(dh_rows.d_head.to_numpy(float), dh_rows.accuracy.to_numpy(float))
        fits["fit_dh_exponent"] = fits["fit_dh"]["exponent"]
        fits["fit_dh_quadratic"] = dict(zip(("c2", "c1", "c0"), map(float, np.polyfit(
            dh_rows.d_head.to_numpy(float), dh_rows.accuracy.to_numpy(float), 2))))
    d_rows = capacity[capacity.sweep == "d_model"]
    for side, rows in (("below", d_rows[d_rows.d_model <= sweep.d_head]),
                       ("above", d_rows[d_rows.d_model >= sweep.d_head])):
        if len(rows) >= 2:  # the paper's two linear pieces of Figure 2a, meeting at d = d_h
            fits[f"fit_d_{side}_dh"] = fit_linear(rows.d_model.to_numpy(float), rows.accuracy.to_numpy(float))
    slopes = per_head_slopes(capacity[capacity.sweep == "d_equal"])
    if len(slopes):
        fits["d_equal_slopes"] = slopes.to_dict("records")
        if len(slopes) >= 2 and (slopes.slope > 0).all():  # slope ~ d^k, least squares in log-log
            fits["fit_d_equal_exponent"] = float(np.polyfit(np.log(slopes.d), np.log(slopes.slope), 1)[0])
    fits["above_lower_bound_everywhere"] = bool(capacity.above_lower_bound.all())
    fits["min_margin_over_lower_bound"] = float((capacity.accuracy - capacity.lower_bound).min())
    fits["mlp_vs_attention_only"] = _matched(capacity)
    return fits


def headline(fits: dict) -> dict:
    """The scalar results of layout_fits: per-head slope (accuracy per head), the d_h exponent,
    the slopes of Figure 2a below and above d = d_h (accuracy per dimension), the d = d_h
    slope's exponent, the smallest margin over the lower bound (accuracy)."""
    values = {"slope_H": fits.get("fit_H", {}).get("slope"), "per_head_slope": fits.get("per_head_slope"),
              "fit_dh_exponent": fits.get("fit_dh_exponent"),
              "slope_d_below_dh": fits.get("fit_d_below_dh", {}).get("slope"),
              "slope_d_above_dh": fits.get("fit_d_above_dh", {}).get("slope"),
              "fit_d_equal_exponent": fits.get("fit_d_equal_exponent"),
              "min_margin_over_lower_bound": fits.get("min_margin_over_lower_bound")}
    return {name: value for name, value in values.items() if value is not None}


def _matched(capacity: pd.DataFrame) -> list[dict]:
    """Attention-only vs one-head-plus-MLP accuracy at equal parameter counts."""
    aot = capacity[(capacity.sweep == "heads")].set_index("parameters").accuracy
    mlp = capacity[(capacity.sweep == "mlp")].set_index("parameters").accuracy
    return [{"parameters": int(p), "attention_only": float(aot[p]), "mlp": float(mlp[p])}
            for p in mlp.index if p in aot.index]


def per_head_slopes(rows: pd.DataFrame, saturation: float = 0.95) -> pd.DataFrame:
    """For each d of the d_equal sweep: the slope of accuracy against H (least squares) over
    the H values up to and including the first with accuracy above `saturation` (the
    authors' rule, Figure 2b)."""
    out = []
    for d, group in rows.groupby("d_model"):
        group = group.sort_values("n_heads")
        above = np.flatnonzero(group.accuracy.to_numpy() > saturation)
        kept = group.iloc[: above[0] + 1] if len(above) else group
        if len(kept) >= 2:
            slope = fit_linear(kept.n_heads.to_numpy(float), kept.accuracy.to_numpy(float))["slope"]
            out.append({"d": int(d), "slope": slope, "points": len(kept)})
    return pd.DataFrame(out, columns=["d", "slope", "points"])


def fit_linear(x: np.ndarray, y: np.ndarray) -> dict:
    """Least squares y = a + b x: intercept, slope, R^2."""
    b, a = np.polyfit(x, y, 1)
    residual = y - (a + b * x)
    r2 = 1 - residual.var() / y.var() if y.var() > 0 else float("nan")
    return {"intercept": float(a), "slope": float(b), "r2": float(r2)}


def fit_power(x: np.ndarray, y: np.ndarray) -> dict:
    """Least squares y = a + b x^k, k on a grid of 0.1 .. 4 (step 0.01), (a, b) exact for
    each k: exponent, intercept, coefficient, R^2."""
    best = None
    for k in np.arange(0.1, 4.0001, 0.01):
        A = np.stack([np.ones_like(x), x ** k], 1)
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        sse = float(((A @ coef - y) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, k, coef)
    sse, k, (a, b) = best
    return {"exponent": round(float(k), 2), "intercept": float(a), "coefficient": float(b),
            "r2": float(1 - sse / ((y - y.mean()) ** 2).sum()) if y.var() > 0 else float("nan")}
