"""Binary search and resumable cells: the machinery of the capacity sweeps."""
import random

import pytest

from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import LocalExecutor
from analyses.sweeps.search import bisection, largest_passing


# ------------------------------------------------------------------ binary search
@pytest.mark.parametrize("threshold", [1, 2, 7, 100, 1000, 12345])
@pytest.mark.parametrize("start", [1, 5, 64, 5000])
def test_binary_search_finds_monotone_threshold(threshold, start):
    calls = []

    def passes(n):
        calls.append(n)
        return n <= threshold
    assert largest_passing(passes, start) == threshold
    assert len(calls) <= 2 * (abs(threshold.bit_length() - start.bit_length()) + threshold.bit_length()) + 4


@pytest.mark.parametrize("probes", [2, 3, 5])
def test_a_search_of_several_probes_finds_the_same_threshold_in_fewer_rounds(probes):
    for threshold in (1, 2, 7, 30, 100, 1000, 12345):
        for start in (1, 5, 64, 5000):
            rounds = {}
            for p in (1, probes):
                sizes, count = bisection(start, probes=p), 0
                try:
                    tried = next(sizes)
                    while True:
                        assert len(tried) <= p and len(set(tried)) == len(tried)
                        count += 1
                        tried = sizes.send(tuple(n <= threshold for n in tried))
                except StopIteration as stop:
                    assert stop.value == threshold, (threshold, start, p)
                rounds[p] = count
            assert rounds[probes] <= rounds[1]
    assert largest_passing(lambda n: n <= 30, 8, highest=50, probes=probes) == 30
    assert largest_passing(lambda n: False, 8, lowest=2, probes=probes) == 1


@pytest.mark.parametrize("threshold, asked", [(21, [8, 12, 18, 27, 22, 20]), (5, [8, 4, 6, 5])])
def test_one_probe_per_round_keeps_the_sizes_recorded_sweeps_asked_for(threshold, asked):
    """Figure 4 left's search (from 8, x1.5, to 10%): a resumed sweep must ask for the same sizes."""
    sizes, seen = bisection(8, lowest=2, highest=512, grow=1.5, rel_tol=0.1), []
    with pytest.raises(StopIteration):
        tried = next(sizes)
        while True:
            seen.extend(tried)
            tried = sizes.send(tuple(n <= threshold for n in tried))
    assert seen == asked


def test_binary_search_when_nothing_passes_and_with_a_ceiling():
    assert largest_passing(lambda n: False, 8, lowest=2) == 1
    assert largest_passing(lambda n: True, 8, highest=50) == 50
    assert largest_passing(lambda n: n <= 30, 8, highest=50) == 30


def test_binary_search_relative_tolerance_stops_early():
    calls = []

    def passes(n):
        calls.append(n)
        return n <= 1000
    exact_calls = []
    largest_passing(lambda n: exact_calls.append(n) or n <= 1000, 10)
    found = largest_passing(passes, 10, rel_tol=0.1)
    assert 1000 / 1.1 <= found <= 1000
    assert len(calls) < len(exact_calls)


def test_binary_search_noisy_oracle_lands_near_threshold():
    """P(pass) falls smoothly from 1 to 0 around the threshold: answers stay within a few widths."""
    threshold, width, errors = 500, 10, []
    for seed in range(60):
        rng = random.Random(seed)

        def passes(n, rng=rng):
            return rng.random() < 1 / (1 + pow(2.718281828, (n - threshold) / width))
        errors.append(largest_passing(passes, 20) - threshold)
    assert sum(abs(e) <= 6 * width for e in errors) >= 55
    assert abs(sum(errors) / len(errors)) <= 2 * width


def test_binary_search_refuses_bad_arguments():
    with pytest.raises(ValueError):
        largest_passing(lambda n: True, 0)
    with pytest.raises(ValueError):
        largest_passing(lambda n: True, 4, grow=1.0)
    with pytest.raises(ValueError):
        largest_passing(lambda n: True, 4, probes=0)


# ------------------------------------------------------------------ resumable cells
def test_cells_skip_what_is_recorded(tmp_path):
    computed = []

    def square(n):
        computed.append(n)
        return {"n": n, "square": n * n}

    def sweep(cells):
        return run_jobs([one(Cell(f"n{n}", square, (n,))) for n in range(5)], cells, LocalExecutor(), progress=False)
    first = sweep(Cells(tmp_path, {"a": 1}))
    assert computed == list(range(5)) and first[2] == {"n": 2, "square": 4}
    (tmp_path / "cells" / "n3.json").unlink()  # as if killed before cell 3 was written
    again = Cells(tmp_path, {"a": 1})
    assert sweep(again) == first
    assert computed == list(range(5)) + [3] and again.computed == 1
    assert [r["n"] for r in again.rows()] == list(range(5))


def test_cells_refuse_another_sweeps_directory(tmp_path):
    Cells(tmp_path, {"steps": 20})  # nothing recorded yet: the directory is not claimed
    Cells(tmp_path, {"steps": 10}).record("a", {"x": 1})
    with pytest.raises(ValueError, match="other settings"):
        Cells(tmp_path, {"steps": 20})
