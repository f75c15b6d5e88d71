"""Progress bars, shown on a terminal only: a command piped to a log writes none.

FACTUAL_RECALL_PROGRESS=1 shows them wherever stderr goes (a log, a notebook), =0 never;
unset, they are shown where stderr is a terminal. A command's --quiet (progress=False) hides
them in any case. Every bar of the toolkit is made by `progress_bar`.
"""
from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm

ENV = "FACTUAL_RECALL_PROGRESS"


def bars_shown() -> bool:
    """Whether progress bars are shown: FACTUAL_RECALL_PROGRESS=1 or 0, else whether stderr is a terminal."""
    setting = os.environ.get(ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


def progress_bar(iterable=None, *, disable: bool = False, **kwargs) -> tqdm:
    """tqdm(iterable, **kwargs), disabled when `disable` or when bars are not shown (bars_shown)."""
    return tqdm(iterable, disable=disable or not bars_shown(), **kwargs)
