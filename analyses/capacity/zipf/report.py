"""`zipf`'s tables from its cells: the error of every seed, size and memory (errors.csv), the
exponents measured against n and d beside the talk's (fits.csv, summary.json), the q(z) each
memory holds (profiles.csv), the figures, and the lines the CLI prints."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.capacity.zipf.figures import error_figure, profile_figure
from analyses.capacity.zipf.fits import (
    MIN_POINTS,
    exponent,
    infinite_memory_error,
    interval,
    local_exponents,
    theory,
    top_tokens_error,
)
from analyses.capacity.zipf.laws import ZipfSweep
from analyses.capacity.zipf.memory import zipf_law
from analyses.sweeps.output import write_csv, write_summary
from models.text import number


@dataclass
class ZipfResult:
    errors: pd.DataFrame  # one row per α, scheme, d, seed and n
    fits: pd.DataFrame  # one row per α, scheme, axis and the size held fixed
    profiles: pd.DataFrame  # q(z) / max q, mean over seeds, where d >= N
    summary: dict


def error_table(rows: list[dict]) -> pd.DataFrame:
    """The cells' rows as one row per (α, scheme, d, seed, n): error, tokens stored, threshold s."""
    out = []
    for row in rows:
        for k, seed in enumerate(row["seeds"]):
            for i, n in enumerate(row["n"]):
                out.append({"alpha": row["alpha"], "scheme": row["scheme"], "d": row["d"], "seed": seed,
                            "n": float("inf") if n is None else n, "error": row["errors"][k][i],
                            "stored": row["stored"][k][i] if row["stored"] else None,
                            "s": row["s"][k][i] if row["s"] else None})
    return pd.DataFrame(out, columns=["alpha", "scheme", "d", "seed", "n", "error", "stored", "s"])


FIT_COLUMNS = ["alpha", "scheme", "axis", "at", "exponent", "half_width", "seeds_fitted", "note", "theory", "law",
               "infinite_memory", "top_tokens", "local_exponents", "zero_error_seeds", "text"]


def fit_table(errors: pd.DataFrame, sweep: ZipfSweep) -> pd.DataFrame:
    """The exponent of the error against n (at each d) and against d (at each n), per α and
    scheme, beside the talk's; against n also the slope of the infinite-memory error over the
    same n (Hutter's rate at this N and range), and for the threshold scheme against d the slope
    of the error of a memory recalling exactly its budget's most frequent tokens."""
    fits = []
    for (alpha, scheme), group in errors.groupby(["alpha", "scheme"], sort=False):
        for axis, other in (("n", "d"), ("d", "n")):
            for at, g in group.groupby(other):
                table = g.pivot(index="seed", columns=axis, values="error")
                if table.shape[1] < 2 or not np.isfinite(table.columns.to_numpy(float)).all():
                    continue
                x = table.columns.to_numpy(float)
                measured = exponent(x, table.to_numpy())
                law, law_text = theory(scheme, axis, alpha, sweep.threshold is None)
                p = zipf_law(alpha, sweep.tokens).numpy()
                ideal = exponent(x, infinite_memory_error(p, x)).value if axis == "n" else None
                top = (exponent(x, top_tokens_error(p, [sweep.budget(int(d)) for d in x])).value
                       if axis == "d" and scheme == "threshold" and sweep.threshold is None else None)
                fits.append({"alpha": alpha, "scheme": scheme, "axis": axis, "at": f"{other}={at:g}",
                             "exponent": measured.value, "half_width": measured.half_width,
                             "seeds_fitted": measured.seeds, "note": measured.note, "theory": law, "law": law_text,
                             "infinite_memory": ideal, "top_tokens": top,
                             "local_exponents": json.dumps(local_exponents(x, table.to_numpy())),
                             "zero_error_seeds": json.dumps((table.to_numpy() == 0).sum(0).tolist()),
                             "text": measured.text()})
    return pd.DataFrame(fits, columns=FIT_COLUMNS)  # the columns also where no axis has two sizes


def profile_table(rows: list[dict]) -> pd.DataFrame:
    """q(z) / max q per α, scheme and d where it was read back (6 significant digits)."""
    return pd.DataFrame([{"alpha": r["alpha"], "scheme": r["scheme"], "d": r["d"], "z": z + 1, "q": float(f"{q:.6g}")}
                         for r in rows if r["q_profile"] for z, q in enumerate(r["q_profile"])],
                        columns=["alpha", "scheme", "d", "z", "q"])


def zipf_tables(rows: list[dict], sweep: ZipfSweep, extra: dict) -> ZipfResult:
    errors = error_table(rows)
    fits = fit_table(errors, sweep)
    q_exponents = [{"alpha": r["alpha"], "scheme": r["scheme"], "d": r["d"], **_exponent_fields(r["q_exponents"])}
                   for r in rows if r["q_exponents"]]
    summary = {"settings": sweep.recorded(), "fits": fits.drop(columns="text").to_dict("records"),
               "q_exponents": q_exponents, "cells": len(rows),
               "seconds": float(sum(r["seconds"] for r in rows)),
               "multiply_adds": int(sum(r["multiply_adds"] for r in rows)), **extra}
    return ZipfResult(errors, fits, profile_table(rows), summary)


def _exponent_fields(slopes: list[float | None]) -> dict:
    """The interval of the seeds' exponents of q(z) against z."""
    e = interval([s for s in slopes if s is not None], f"undetermined: no seed has {MIN_POINTS} tokens with q > 0")
    return {"exponent": e.value, "half_width": e.half_width, "seeds_fitted": e.seeds, "note": e.note}


def write_zipf(result: ZipfResult, sweep: ZipfSweep, out: Path) -> None:
    """errors.csv, fits.csv, profiles.csv, summary.json and the figures in `out`."""
    write_csv(out / "errors.csv", result.errors)
    write_csv(out / "fits.csv", result.fits)
    write_csv(out / "profiles.csv", result.profiles)
    write_summary(out / "summary.json", result.summary)
    for axis in ("n", "d"):
        if result.errors[axis].nunique() > 1:
            error_figure(result.errors, result.fits, axis, sweep.tokens, out / f"error_vs_{axis}.png")
    if len(result.profiles):
        profile_figure(result.profiles, out / "q_profiles.png")


def zipf_text(result: ZipfResult) -> str:
    """Per α and scheme: the exponent against n at the largest d and against d at the largest
    n, beside the talk's."""
    lines = []
    for axis, other in (("n", "d"), ("d", "n")):
        fits = result.fits[result.fits["axis"] == axis] if len(result.fits) else result.fits
        if not len(fits):
            continue
        largest = result.errors[other].max()
        lines.append(f"error against {axis} (at {other} = {largest:g}): measured exponent ± 95% interval over seeds "
                     f"[theory]")
        for f in fits[fits["at"] == f"{other}={largest:g}"].itertuples():
            law = number(f.theory, ".2f") if _number(f.theory) else f.law
            ideal = (f", infinite memory {number(f.infinite_memory, '.2f')}" if _number(f.infinite_memory) else
                     f", top d/8 tokens {number(f.top_tokens, '.2f')}" if _number(f.top_tokens) else "")
            lines.append(f"  α={f.alpha:g} {f.scheme:<9} {f.text:<24} [{law}{ideal}]")
    for q in result.summary["q_exponents"]:
        lines.append(f"  q(z) ∝ z^γ held by {q['scheme']} (α={q['alpha']:g}, d={q['d']}): γ = "
                     + (number(q["exponent"], ".2f") if q["exponent"] is not None else q["note"]))
    return "\n".join(lines or [f"no exponent: each needs {MIN_POINTS} sizes or more along its axis"])


def _number(value) -> bool:
    """A value to print: neither None nor NaN."""
    return value is not None and value == value
