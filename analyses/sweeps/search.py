"""The search for the largest size that passes (`bisection`), answered here (`largest_passing`)
or as a job of a sweep (`search`, `stacked_search`: analyses.sweeps.cells), one round of sizes at a
time."""
from __future__ import annotations

from collections.abc import Callable, Generator

from analyses.sweeps.cells import Cell, Job


def bisection(start: int, *, lowest: int = 1, highest: int | None = None, grow: float = 2.0,
              rel_tol: float = 0.0, probes: int = 1,
              fill: bool = False) -> Generator[tuple[int, ...], tuple[bool, ...], int]:
    """The search for the largest integer n >= `lowest` that passes, assuming passing is
    (nearly) monotone decreasing in n: yields the sizes it wants tested, receives whether each
    passed, returns the answer (`lowest - 1` when even `lowest` fails).

    From `start`, halve until a size passes and double (`grow`) until one fails, then bisect
    the bracket until its width is <= max(1, rel_tol * lower end). With `probes` > 1 each
    round tests up to that many sizes at once (the next halvings, the next growth steps, or
    the bracket cut into probes + 1 parts), so one search keeps that many workers busy in
    fewer rounds; when passing is monotone it finds the same answer. A passing size above a
    failing one is set aside. Every test is a fresh question: a noisy oracle gives an answer
    near its threshold, not a reproducible one. With `fill`, a round that would test fewer
    than `probes` sizes (the halvings reaching `lowest`, the growth reaching `highest`) is
    topped up with sizes spread evenly over the range it leaves open, so that a stack of
    rounds is never one size alone while such sizes remain; with rel_tol = 0 and a monotone
    oracle it finds the same answer, otherwise one inside the same tolerance."""
    if start < lowest:
        raise ValueError(f"start must be >= lowest ({lowest}), got {start}.")
    if grow <= 1:
        raise ValueError(f"grow must be > 1, got {grow}.")
    if probes < 1:
        raise ValueError(f"probes must be >= 1, got {probes}.")

    def halvings(n):  # n, n // 2, ... down to lowest
        sizes = [n]
        while len(sizes) < probes and sizes[-1] > lowest:
            sizes.append(max(lowest, sizes[-1] // 2))
        return tuple(sizes)

    def growth(lo):  # lo * grow, lo * grow^2, ... up to highest
        sizes, n = [], lo
        while len(sizes) < probes and (highest is None or n < highest):
            n = max(n + 1, int(n * grow))
            n = n if highest is None else min(n, highest)
            sizes.append(n)
        return tuple(sizes)

    def cuts(lo, hi):  # the bracket cut into probes + 1 parts
        return tuple(sorted({lo + (hi - lo) * j // (probes + 1) for j in range(1, probes + 1)} - {lo}))

    def topped(tried, lo, hi):  # with fill: tried and sizes spread over (lo, hi), up to probes
        if not fill or len(tried) >= probes or hi is None:
            return tried
        k = probes - len(tried)
        spread = {lo + (hi - lo) * j // (k + 1) for j in range(1, k + 1)} - set(tried) - {lo, hi}
        return tried + tuple(sorted(spread))

    def sizes():
        lo, hi = None, None  # lo passes, hi fails
        n = start
        while lo is None:  # shrink until a size passes
            tried = topped(halvings(n), lowest - 1, n)
            lo, hi = _bracket(tried, (yield tried), lo, hi)
            if lo is None:
                if tried[-1] == lowest:
                    return lowest - 1
                n = max(lowest, tried[-1] // 2)
        while hi is None:  # grow until a size fails
            if highest is not None and lo >= highest:
                return lo
            tried = topped(growth(lo), lo, highest)
            lo, hi = _bracket(tried, (yield tried), lo, hi)
        while hi - lo > max(1, int(rel_tol * lo)):
            tried = cuts(lo, hi)
            lo, hi = _bracket(tried, (yield tried), lo, hi)
        return lo
    return sizes()


def _bracket(tried: tuple[int, ...], passed: tuple[bool, ...], lo: int | None, hi: int | None):
    """The bracket after testing `tried`: hi the smallest size that failed, lo the largest
    that passed below it."""
    failed = [n for n, ok in zip(tried, passed) if not ok] + ([hi] if hi is not None else [])
    hi = min(failed) if failed else None
    below = [n for n, ok in zip(tried, passed) if ok and (hi is None or n < hi)] + ([lo] if lo is not None else [])
    return (max(below) if below else None), hi


def largest_passing(passes: Callable[[int], bool], start: int, **search) -> int:
    """`bisection` (same keywords) answered by calling passes(n) here, one size at a time."""
    sizes = bisection(start, **search)
    try:
        tried = next(sizes)
        while True:
            tried = sizes.send(tuple(passes(n) for n in tried))
    except StopIteration as stop:
        return stop.value


def search(sizes: Generator[tuple[int, ...], tuple[bool, ...], int], cell: Callable[[int], Cell],
           passed: Callable[[dict], bool]) -> Job:
    """A job answering the search `sizes` with cells: size n is tested by the row of cell(n),
    passed(row) says whether it passed; the sizes of a round are asked for together. The
    job's result is the search's answer."""
    try:
        tried = next(sizes)
        while True:
            rows = yield tuple(cell(n) for n in tried)
            tried = sizes.send(tuple(passed(row) for row in rows))
    except StopIteration as stop:
        return stop.value


def stacked_search(sizes: Generator[tuple[int, ...], tuple[bool, ...], int],
                   round_cell: Callable[[tuple[int, ...]], Cell], per_size: int,
                   passed: Callable[[tuple[dict, ...]], bool]) -> Job:
    """`search` with each round's sizes tested by one stack cell: round_cell(tried) is a Cell
    whose parts are `per_size` rows per size, the sizes in the order of `tried` (the seeds of
    a size, say); passed(rows of one size) says whether that size passed."""
    try:
        tried = next(sizes)
        while True:
            rows = yield round_cell(tried)
            tried = sizes.send(tuple(passed(rows[i * per_size:(i + 1) * per_size]) for i in range(len(tried))))
    except StopIteration as stop:
        return stop.value
