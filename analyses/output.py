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


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(fig)
