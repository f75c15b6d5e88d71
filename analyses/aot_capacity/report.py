"""What a sweep writes (the tables, summary.json, the figures) and the report it prints."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.aot_capacity.figures import figure, roles_figure
from analyses.aot_capacity.sweep import AotSweep
from analyses.aot_capacity.tables import AotCapacity
from analyses.least_squares import LINE, POWER, Fit
from analyses.sweeps.output import write_csv, write_summary
from models.text import count, number


def write(result: AotCapacity, sweep: AotSweep, out: Path) -> None:
    """The tables, summary.json, capacity.png and (with head roles) head_roles.png in `out`."""
    if result.distribution is not None:
        write_csv(out / "distribution.csv", result.distribution)
    write_csv(out / "runs.csv", result.runs)
    write_csv(out / "capacity.csv", result.capacity)
    figure(result.capacity, result.summary["layouts"], sweep.task(), sweep, out / "capacity.png")
    if result.heads is not None:
        write_csv(out / "heads.csv", result.heads)
        if result.head_tokens is not None:
            write_csv(out / "head_tokens.csv", result.head_tokens.reset_index())
        roles_figure(result.heads, result.head_tokens, out / "head_roles.png")
    write_summary(out / "summary.json", result.summary)


def _seeds_alone(fits: dict, name: str, fmt: str) -> str:
    """"; seeds alone: v0, v1": a headline value of each seed fitted alone ("" with one seed)."""
    values = [format(f[name], fmt) for f in fits.get("by_seed", {}).values() if name in f]
    return f"; seeds alone: {', '.join(values)}" if values else ""


def _fitted(fit: dict, names: tuple[str, ...], name: str, fmt: str, unit: str = "") -> str:
    """'0.1107 [95% CI 0.02, 0.2] per head (R^2 0.985, 3 points)', or 'undetermined (3 points, 3 parameters)'."""
    fit = Fit.from_json(fit, names)
    if not fit.determined:
        return fit.undetermined()
    r2 = "" if fit.r2 is None else f"R^2 {fit.r2:.3f}, "
    return f"{fit.show(name, fmt)}{unit} ({r2}{count(fit.points, 'point')})"


def report(summary: dict, capacity: pd.DataFrame, out: Path) -> str:
    lines = [f"task      {summary['task']}"]
    for layout, fits in summary["layouts"].items():
        lines.append(f"-- {layout} head layout")
        rows_of = capacity[capacity.head_layout == layout]
        for sweep, x in (("heads", "n_heads"), ("d_head", "d_head"), ("d_model", "d_model"), ("mlp", "d_mlp")):
            rows = rows_of[rows_of.sweep == sweep].sort_values(x)
            if not rows.empty:
                lines.append(f"{sweep:<9} "
                             + "  ".join(f"{x}={getattr(r, x)}:{r.accuracy:.3f}" for r in rows.itertuples()))
        if "fit_H" in fits:
            lines.append("fit       accuracy linear in H: slope " + _fitted(fits["fit_H"], LINE, "slope", ".4f",
                                                                           " per head")
                         + _seeds_alone(fits, "slope_H", ".4f"))
        if "fit_dh" in fits:
            lines.append("fit       accuracy = a + b d_h^k: k = " + _fitted(fits["fit_dh"], POWER, "exponent", ".2f")
                         + _seeds_alone(fits, "fit_dh_exponent", ".2f"))
        for side in ("below", "above"):
            if f"fit_d_{side}_dh" in fits:
                lines.append(f"fit       accuracy per unit of d {side} d_h: "
                             + _fitted(fits[f"fit_d_{side}_dh"], LINE, "slope", ".4f")
                             + _seeds_alone(fits, f"slope_d_{side}_dh", ".4f"))
        if "d_equal_slopes" in fits:
            lines.append("d = d_h   per-head slope "
                         + "  ".join(f"d={r['d']}:" + ("undetermined" if r["slope"] is None else
                                                       number(r["slope"], ".4f")) for r in fits["d_equal_slopes"])
                         + ("; ~ d^" + _fitted(fits["fit_d_equal"], LINE, "slope", ".2f") if "fit_d_equal" in fits
                            else "")
                         + _seeds_alone(fits, "fit_d_equal_exponent", ".2f"))
        lines.append(f"bound     above the lower bound everywhere: {fits['above_lower_bound_everywhere']} "
                     f"(smallest margin {number(fits['min_margin_over_lower_bound'], '+.3f')})")
    if "distribution" in summary:
        d = summary["distribution"]
        lines.append(f"KL        floor of rank d: {d['kl_floor_rank_d']:.4f} nats; trained: "
                     + ", ".join(f"{k}: {v:.4f}" for k, v in d["kl_by_model"].items()))
    if "head_roles" in summary:
        r = summary["head_roles"]
        lines.append(f"heads     {r['position_heads']} position heads, {r['token_heads']} token heads of {r['heads']}; "
                     f"variance of the attention explained by the key token {r['mean_var_key_token']:.2f}, "
                     f"the query token {r['mean_var_query_token']:.2f}, "
                     f"their interaction {r['mean_var_interaction']:.2f}")
    lines.append(f"wrote     {out}/ in {summary['seconds']:.0f} s")
    return "\n".join(lines)
