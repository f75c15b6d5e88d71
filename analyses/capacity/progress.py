"""`python -m analyses.capacity plan --done`: how much of the GPU's science the committed
results have finished (Figure 4 left at the full protocol, analyses/capacity/protocol.py, and
Figure 4 right's grid, results/tradeoff/paper_grid_gpu/), and what the next call of
scripts/gpu_run.sh will do, in model-steps and projected minutes at the rates a GPU measured
(results/gpu/measured.json).

A piece is planned as `plan` plans a sweep: its searches answered by its own recorded cells
(done), else by the stand-in oracle (left: the recorded S*, an imported one among them, or the
fitted line). A piece is finished when gpu_run recorded it so (results/gpu/done/) or every
probe it plans is recorded."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analyses.capacity.plan import Oracle, default_oracle, plan
from analyses.capacity.protocol import IMPORTED, Piece, fits, pieces, protocol_folder
from analyses.sweeps import gpu_records
from analyses.sweeps.cells import Cells

GRID = "tradeoff/paper_grid_gpu"  # under the results folder
GRID_CELLS = 13 * 13 * 3  # the grid scripts/gpu_run.sh runs: 13 H x 13 m x seeds 0, 1, 2
GRID_STEPS = 16384  # each cell's step budget (paper-tradeoff)
# a call's steps before the science, in seconds (the H100's second run: results/gpu/2026-11-26-h100-b/report.txt)
CALL_SECONDS, SETUP, TESTS_FULL, TESTS_SUBSET, BENCH_LINE, CHECKS, PACK = 540, 10, 125, 60, 50, 61, 20
GRID_LEAST = 240  # gpu_run.sh starts the grid with at least this many seconds left, else the pieces first


class _Own(Oracle):
    """The stand-in oracle, answering first from the recorded cells of the piece whose folder
    is `own` (those are `done`)."""

    own: Path | None = None
    imported: frozenset = frozenset()  # (shape, d) whose S* a GPU record gives (protocol.IMPORTED folders)

    def own_row(self, sweep, key: str) -> dict | None:
        cells = self.own_cells(sweep)
        return None if cells is None else cells.recorded(key)

    def own_cells(self, sweep) -> Cells | None:
        """The piece's recorded cells (None where it has none), read once a piece and sweep."""
        if getattr(self, "_own", None) is None or self._own[:2] != (self.own, sweep):
            try:
                cells = Cells(self.own, sweep.recorded()) \
                    if self.own is not None and (self.own / "cells").is_dir() else None
            except ValueError:  # the folder holds another sweep: nothing of this piece is recorded
                cells = None
            self._own = (self.own, sweep, cells)
        return self._own[2]

    def recorded(self, sweep, key: str) -> dict | None:
        row = self.own_row(sweep, key)
        return row if row is not None else super().recorded(sweep, key)


@dataclass
class Progress:
    """A piece's (or the grid's) probes planned and recorded, and its model-steps done and left."""

    name: str
    finished: bool
    probes: int
    done: int
    model_steps_done: int
    model_steps_left: int
    rate: float  # model-steps per second it is projected at
    note: str = ""

    @property
    def minutes_left(self) -> float:
        return 0.0 if self.finished else self.model_steps_left / self.rate / 60


def piece_progress(piece: Piece, sweep, results: Path, rate: float, oracle: _Own,
                   earlier: tuple[int, ...] = ()) -> Progress:
    """The plan of a piece, whose TransformerSweep is `sweep`, its recorded probes counted as
    done; the sizes `earlier` are an earlier piece's (the parts of a row share its folder,
    each going on from the last)."""
    oracle.own = protocol_folder(results) / piece.folder
    probes, _ = plan(sweep, oracle)
    probes = probes[~probes["d"].isin(earlier)]
    keys = [f"shape{r.shape}_d{r.d}_S{r.S}" + ("" if pd.isna(r.seed) else f"_seed{int(r.seed)}")
            for r in probes.itertuples()]  # analyses.capacity.transformer.probe_key
    done = pd.Series([oracle.own_row(sweep, key) is not None for key in keys], index=probes.index, dtype=bool)
    finished = (results / "gpu" / "done" / f"fig4_left_{piece.name}").is_file() or bool(len(probes) and done.all())
    imported = {(s, d) for s, d in oracle.imported for x in piece.shapes
                if s == ",".join(x.split(",")[:3]) and d in sweep.d and d not in earlier and fits(x, d)}
    note = "" if finished or not imported else \
        "its S* stands in from a GPU record: " + ", ".join(f"({s}) d={d}" for s, d in sorted(imported))
    return Progress(piece.name, finished, len(probes), int(done.sum()), int(probes.loc[done, "model_steps"].sum()),
                    0 if finished else int(probes.loc[~done, "model_steps"].sum()), rate, note)


def grid_progress(results: Path, rate: float) -> Progress:
    """Figure 4 right's grid: cells recorded of GRID_CELLS; a cell left is projected at the mean
    steps the recorded ones ran (GRID_STEPS where none is recorded)."""
    import json

    cells = [json.loads(p.read_text()) for p in sorted((results / GRID / "cells").glob("*.json"))]
    steps = [c.get("steps_run", GRID_STEPS) for c in cells]
    mean = sum(steps) / len(steps) if steps else GRID_STEPS
    finished = (results / "gpu" / "done" / "grid").is_file() or len(cells) >= GRID_CELLS
    return Progress("grid", finished, GRID_CELLS, len(cells), sum(steps),
                    0 if finished else round((GRID_CELLS - len(cells)) * mean), rate)


def rates(results: Path) -> tuple[float, float, str]:
    """Model-steps per second of a capacity probe and of a grid stack on the GPU that measured
    them (measured.json: `capacity-d128`, and `stack-169`'s faster core times its models)."""
    measured = gpu_records.read(results / "gpu" / "measured.json")
    capacity = measured.get("capacity-d128", {}).get("model_steps_per_second")
    stack = measured.get("stack-169", {})
    grid = max(stack.get("steps_per_second", {}).values(), default=0) * stack.get("models", 0)
    if not capacity or not grid:
        raise ValueError(f"{results / 'gpu' / 'measured.json'}: no measured rates (capacity-d128 and stack-169) "
                         "to project the minutes from.")
    device = stack.get("device", "a GPU")
    return float(capacity), float(grid), f"{device}: {capacity:,.0f} model-steps/s a capacity round, " \
                                         f"{grid:,.0f} a grid stack"


def progress(results: Path, sweep_of: Callable) -> list[Progress]:
    """The grid's, then every Figure 4 left piece's progress, in the order a GPU runs them;
    `sweep_of(piece)` is the piece's TransformerSweep (its flags as the CLI reads them)."""
    capacity, grid, _ = rates(results)
    imported = tuple(sorted(protocol_folder(results).glob(IMPORTED + "*")))
    oracle = _Own(default_oracle(sweep_of(pieces()[0])).folders + imported)
    oracle.imported = {(str(r["shape"]), int(r["d"])) for f in imported if (f / "capacity.csv").is_file()
                       for _, r in pd.read_csv(f / "capacity.csv").iterrows()}
    done, sizes = [grid_progress(results, grid)], {}
    for p in pieces():
        sweep = sweep_of(p)
        done.append(piece_progress(p, sweep, results, capacity, oracle, sizes.get(p.folder, ())))
        sizes[p.folder] = tuple(sweep.d)
    return done


def next_call(results: Path, done: list[Progress]) -> list[str]:
    """What the next gpu_run call of CALL_SECONDS does, step by step, with projected seconds."""
    passed, measured = (gpu_records.read(results / "gpu" / f"{n}.json") for n in ("passed", "measured"))
    tests_code, bench_code = (gpu_records.code_hash(gpu_records.CODE[n]) for n in ("tests", "bench"))
    full = passed.get("tests", {}).get("code") != tests_code
    lines = [f"tests {'in full (the code a GPU runs changed since their last full pass)' if full else 'subset'}: "
             f"~{TESTS_FULL if full else TESTS_SUBSET} s"]
    changed = [n for n in gpu_records.BENCH_LINES if measured.get(n, {}).get("code") != bench_code]
    lines.append(f"bench lines whose code changed: {', '.join(changed) or 'none'}: ~{BENCH_LINE * len(changed)} s")
    checks = passed.get("checks", {}).get("code") != tests_code
    lines.append(f"checks: {f'~{CHECKS} s (the code changed)' if checks else 'skipped (passed at this code)'}")
    left = CALL_SECONDS - SETUP - PACK - (TESTS_FULL if full else TESTS_SUBSET) - BENCH_LINE * len(changed) \
        - CHECKS * checks
    lines.append(f"science: ~{max(0, left)} s")
    grid, pieces_left = done[0], done[1:]
    order = [grid, *pieces_left] if left >= GRID_LEAST else [*pieces_left, grid]
    for p in order:
        if p.finished or left <= 0 or (p is grid and left < GRID_LEAST):
            continue
        seconds = 60 * p.minutes_left
        lines.append(f"  {p.name}: {'all of it' if seconds <= left else 'cut, to go on in the next call'} "
                     f"(~{seconds:.0f} s of ~{max(0, left):.0f} s left)")
        left -= seconds
    return lines


def progress_text(results: Path, sweep_of: Callable) -> str:
    """The report of `plan --done` (`sweep_of`: as for progress)."""
    done = progress(results, sweep_of)
    _, _, source = rates(results)
    width = max(len(p.name) for p in done)
    lines = [f"GPU science from the committed results in {results}/ (rates measured on {source}):",
             f"  {'step':<{width}}  {'probes':>13}  {'model-steps done':>16}  {'left':>13}  {'minutes left':>12}"]
    for p in done:
        state = "finished" if p.finished else f"{p.minutes_left:.1f}"
        lines.append(f"  {p.name:<{width}}  {f'{p.done} of {p.probes}':>13}  {p.model_steps_done:>16,}  "
                     f"{p.model_steps_left:>13,}  {state:>12}" + (f"  ({p.note})" if p.note else ""))
    fig4 = [p for p in done if p.name != "grid"]
    total = sum(p.model_steps_done + p.model_steps_left for p in fig4)
    share = sum(p.model_steps_done for p in fig4) / total if total else 1.0
    lines.append(f"Figure 4 left: {sum(p.finished for p in fig4)} of {len(fig4)} pieces finished, {share:.0%} of its "
                 f"planned model-steps done, ~{sum(p.minutes_left for p in fig4):.0f} GPU minutes left; the grid: "
                 f"{done[0].done} of {done[0].probes} cells, ~{done[0].minutes_left:.0f} minutes left")
    calls = math.ceil(sum(p.minutes_left for p in done) * 60 / max(1, CALL_SECONDS - SETUP - PACK - TESTS_SUBSET))
    lines.append(f"the next call of scripts/gpu_run.sh ({CALL_SECONDS} s; about {calls} such calls finish it all):")
    return "\n".join(lines + [f"  {line}" for line in next_call(results, done)])
