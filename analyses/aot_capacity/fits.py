"""The fits of capacity.csv: accuracy linear in H, a power of d_h, two linear pieces in d,
the per-head slope of the d = d_h sweep. Each fit of a sweep of two or more points is
recorded as analyses.least_squares writes it: its parameters with 95% intervals, or
`undetermined` when it has no more points than parameters."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analyses.aot_capacity.sweep import AotSweep
from analyses.least_squares import fit_line, fit_log_log, fit_polynomial, fit_power
from tasks.association import AssociationTask


def layout_fits(capacity: pd.DataFrame, task: AssociationTask, sweep: AotSweep) -> dict:
    """The fits and comparisons of one head layout's rows of capacity.csv."""
    fits = {}
    heads_rows = capacity[capacity.sweep == "heads"]
    if len(heads_rows) >= 2:
        fit_H = fit_line(heads_rows.n_heads, heads_rows.accuracy)
        fits["fit_H"] = fit_H.to_json()
        if fit_H.determined:
            fits["fit_H_r2"] = fit_H.r2
        slope = per_head_slopes(heads_rows).slope.dropna()
        if len(slope):  # associations per head (before saturation), per head dimension
            fits["per_head_slope"] = float(slope.iloc[0])
            fits["associations_per_head_dim"] = (float(slope.iloc[0]) * task.n_sequences / (1 - 1 / task.n_tokens)
                                                 / sweep.d_head)
    dh_rows = capacity[capacity.sweep == "d_head"]
    if len(dh_rows) >= 2:
        fit_dh = fit_power(dh_rows.d_head, dh_rows.accuracy)
        fits["fit_dh"] = fit_dh.to_json()
        if fit_dh.determined:
            fits["fit_dh_exponent"] = fit_dh.get("exponent")
        fits["fit_dh_quadratic"] = fit_polynomial(dh_rows.d_head, dh_rows.accuracy, 2).to_json()
    d_rows = capacity[capacity.sweep == "d_model"]
    for side, rows in (("below", d_rows[d_rows.d_model <= sweep.d_head]),
                       ("above", d_rows[d_rows.d_model >= sweep.d_head])):
        if len(rows) >= 2:  # the paper's two linear pieces of Figure 2a, meeting at d = d_h
            fits[f"fit_d_{side}_dh"] = fit_line(rows.d_model, rows.accuracy).to_json()
    slopes = per_head_slopes(capacity[capacity.sweep == "d_equal"])
    if len(slopes):
        fits["d_equal_slopes"] = [{k: (None if k == "slope" and pd.isna(v) else v) for k, v in r.items()}
                                  for r in slopes.to_dict("records")]
        growing = slopes.dropna()
        if len(growing) >= 2 and (growing.slope > 0).all():  # slope ~ d^k, least squares in log-log
            fit = fit_log_log(growing.d, growing.slope)
            fits["fit_d_equal"] = fit.to_json()
            if fit.determined:
                fits["fit_d_equal_exponent"] = fit.get("slope")
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
    authors' rule, Figure 2b), and how many points it had."""
    out = []
    for d, group in rows.groupby("d_model"):
        group = group.sort_values("n_heads")
        above = np.flatnonzero(group.accuracy.to_numpy() > saturation)
        kept = group.iloc[: above[0] + 1] if len(above) else group
        if len(kept) >= 2:  # the slope is NaN where the fit is undetermined (two points)
            slope = fit_line(kept.n_heads, kept.accuracy).get("slope")
            out.append({"d": int(d), "slope": float("nan") if slope is None else slope, "points": len(kept)})
    return pd.DataFrame(out, columns=["d", "slope", "points"])
