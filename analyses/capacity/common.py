"""What the capacity modules share: the accuracy target, the facts window of the paper's figure, a
sweep's results and the log-log slope."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

TARGET = 0.99
PAPER_FACTS_WINDOW = (64, 11000)  # the facts range the paper's Figure 4 left shows


@dataclass
class Capacity:
    """A capacity sweep's results: one row per size (and seed), every probe, summary.json."""

    table: pd.DataFrame  # capacity.csv
    probes: pd.DataFrame  # probes.csv: every recorded probe
    summary: dict


def fitted_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])

