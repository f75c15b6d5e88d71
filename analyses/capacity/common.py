"""What the capacity modules share: the accuracy target, the facts window of the paper's figure, a
sweep's results and the log-log slope."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analyses.least_squares import fit_log_log

TARGET = 0.99
PAPER_FACTS_WINDOW = (64, 11000)  # the facts range the paper's Figure 4 left shows


@dataclass
class Capacity:
    """A capacity sweep's results: one row per size (and seed), every probe, summary.json."""

    table: pd.DataFrame  # capacity.csv
    probes: pd.DataFrame  # probes.csv: every recorded probe
    summary: dict


def fitted_slope(x, y) -> float | None:
    """Least-squares slope of log y against log x; None when undetermined (two points or fewer,
    analyses.least_squares: `fit_log_log` gives its interval)."""
    return fit_log_log(x, y).get("slope")

