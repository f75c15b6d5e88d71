"""Sweep plumbing shared by the capacity and trade-off analyses: the binary search for the
largest size that still passes a test, and a resumable on-disk record of finished cells."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from models.checkpoint import write_json


def largest_passing(passes: Callable[[int], bool], start: int, *, lowest: int = 1,
                    highest: int | None = None, grow: float = 2.0, rel_tol: float = 0.0) -> int:
    """The largest integer n >= `lowest` with passes(n), assuming passes is (nearly) monotone
    decreasing in n; `lowest - 1` when even `lowest` fails.

    From `start`, halve until a size passes and double (`grow`) until one fails, then bisect
    the bracket until its width is <= max(1, rel_tol * lower end). Every call is a fresh
    question: a noisy oracle gives an answer near its threshold, not a reproducible one."""
    if start < lowest:
        raise ValueError(f"start must be >= lowest ({lowest}), got {start}.")
    if grow <= 1:
        raise ValueError(f"grow must be > 1, got {grow}.")
    lo, hi = None, None  # lo passes, hi fails
    n = start
    while lo is None:  # shrink until a size passes
        if passes(n):
            lo = n
        else:
            hi = n
            if n == lowest:
                return lowest - 1
            n = max(lowest, n // 2)
    while hi is None:  # grow until a size fails
        if highest is not None and lo >= highest:
            return lo
        n = max(lo + 1, int(lo * grow))
        n = n if highest is None else min(n, highest)
        if passes(n):
            lo = n
        else:
            hi = n
    while hi - lo > max(1, int(rel_tol * lo)):
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo


class Cells:
    """One JSON file per finished cell in DIR/cells/, written atomically: a re-run with the
    same settings reads a recorded cell instead of recomputing it. DIR/settings.json holds
    the settings; another sweep's directory is refused."""

    def __init__(self, out: Path, settings: dict):
        self.dir = Path(out) / "cells"
        path = Path(out) / "settings.json"
        if path.is_file():
            try:
                recorded = json.loads(path.read_text())
            except json.JSONDecodeError:
                recorded = None
            if recorded != json.loads(json.dumps(settings)):
                raise ValueError(f"{out} holds a sweep with other settings ({path}); "
                                 "choose another --out, or delete it to start over.")
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json(path, settings)
        self.computed = 0  # cells computed (not read back) by this process

    def path(self, key: str) -> Path:
        return self.dir / (re.sub(r"[^A-Za-z0-9_.=,+-]", "_", key) + ".json")

    def get(self, key: str, compute: Callable[[], dict]) -> dict:
        """The recorded row of `key`, or compute() recorded now."""
        path = self.path(key)
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass  # not ours (atomic writes never leave half a file): recompute it
        row = compute()
        write_json(path, row)
        self.computed += 1
        return row

    def rows(self) -> list[dict]:
        """Every recorded row, in file-name order."""
        return [json.loads(p.read_text()) for p in sorted(self.dir.glob("*.json"))]
