"""Results written to disk atomically (temporary name, then rename)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from models.checkpoint import atomic_write, write_json


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_summary(path: Path, summary: dict) -> None:
    """JSON with NaN written as null."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return None if isinstance(x, float) and math.isnan(x) else x
    write_json(path, clean(summary))


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend: the one place that chooses it, so
    figures are written the same way on a headless machine, in a worker, or a notebook."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path) -> None:
    plt = pyplot()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(fig)
