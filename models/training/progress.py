"""Progress: a bar on a terminal, a status line now and then in a log.

Where stderr is a terminal, a progress bar is drawn. Where it is not (a command piped to a
log, a notebook), a job that runs longer than STATUS_SECONDS writes one plain status line to
stderr every STATUS_SECONDS (what the bar would say: done / total, elapsed, time left, its
numbers) and a last one when it ends; a shorter job writes nothing.
FACTUAL_RECALL_PROGRESS=1 draws bars wherever stderr goes, =0 shows nothing. A command's
--quiet (progress=False) hides both in any case. Every bar of the toolkit is made by
`progress_bar`.
"""
from __future__ import annotations

import os
import sys
import time

from tqdm.auto import tqdm

from models.text import plural

ENV = "FACTUAL_RECALL_PROGRESS"
STATUS_SECONDS = 30.0  # a status line at most this often where no bar is drawn


def bars_shown() -> bool:
    """Whether progress bars are shown: FACTUAL_RECALL_PROGRESS=1 or 0, else whether stderr is a terminal."""
    setting = os.environ.get(ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


def progress_bar(iterable=None, *, disable: bool = False, **kwargs):
    """tqdm(iterable, **kwargs) where bars are shown (bars_shown); else, unless `disable` or
    FACTUAL_RECALL_PROGRESS=0, a StatusLines with tqdm's interface (update, set_postfix, close)."""
    if disable or bars_shown():
        return tqdm(iterable, disable=disable, **kwargs)
    if os.environ.get(ENV, "").strip() == "0":
        return tqdm(iterable, disable=True, **kwargs)
    return StatusLines(iterable, **kwargs)


class StatusLines:
    """What a bar shows, as one line on stderr at most every STATUS_SECONDS, e.g.
    `training 1 model: 2400/5000 steps (48%), 31 s, about 34 s left, acc=0.412`; a last line
    when it closes, if it wrote any. The arguments of tqdm that draw a bar are ignored."""

    def __init__(self, iterable=None, *, desc: str | None = None, total: int | None = None, initial: int = 0,
                 unit: str = "it", **_bar_drawing):
        self.iterable, self.desc, self.unit = iterable, desc or "progress", unit
        self.total = len(iterable) if total is None and hasattr(iterable, "__len__") else total
        self.n = self.initial = initial
        self.postfix, self.lines = "", 0
        self.start = self.last = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= STATUS_SECONDS:
            self._write()

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in {**(ordered_dict or {}), **kwargs}.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if self.lines:
            self._write()
            self.lines = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _write(self) -> None:
        now = time.monotonic()
        elapsed, done = now - self.start, self.n - self.initial
        text = f"{self.desc}: {self.n}" + (f"/{self.total}" if self.total else "") + " " + plural(
            self.unit, self.total or self.n)
        if self.total:
            text += f" ({100 * self.n / self.total:.0f}%)"
        text += f", {elapsed:.0f} s"
        if self.total and 0 < done and self.n < self.total:
            text += f", about {elapsed / done * (self.total - self.n):.0f} s left"
        print(text + (f", {self.postfix}" if self.postfix else ""), file=sys.stderr, flush=True)
        self.last, self.lines = now, self.lines + 1
