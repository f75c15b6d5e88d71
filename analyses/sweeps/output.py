"""Results written to disk atomically (temporary name, then rename)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from models.checkpoint import atomic_write, write_json


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """`frame` as CSV; a cell holding a list or a dict (a sweep row's runs, say) written as JSON."""
    nested = {c: frame[c].map(_json_if_nested) for c in frame.columns
              if frame[c].dtype == object and frame[c].map(lambda v: isinstance(v, (list, dict, tuple))).any()}
    frame = frame.assign(**nested) if nested else frame
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def _json_if_nested(value):
    return json.dumps(value) if isinstance(value, (list, dict, tuple)) else value


def write_summary(path: Path, summary: dict) -> None:
    """JSON with NaN written as null."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return None if isinstance(x, float) and math.isnan(x) else x
    write_json(path, clean(summary))


def subplots(nrows: int = 1, ncols: int = 1, figsize=None, **kw):
    """(figure, axes) of a figure that only writes files: made without pyplot, so importing or
    calling an analysis never changes matplotlib's backend (a notebook keeps showing its own
    figures inline)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def save_figure(fig, path: Path | None = None):
    """`fig` itself (a matplotlib Figure: a notebook shows it), written to `path` as PNG
    when one is given."""
    if path is not None:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    return fig
