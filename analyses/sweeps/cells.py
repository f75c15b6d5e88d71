"""The sweep engine shared by the capacity, trade-off and attention-only analyses.

A sweep is a set of cells. A cell (`Cell(key, fn, args)`) is a pure function of its settings
returning one JSON row: `fn(*args)`, `fn` a module-level function so that a Ray worker can
import it. Jobs ask for cells: a grid point is a job of one cell (`one`), a binary search
(analyses.sweeps.search) asks for one round of probes at a time (one probe, or several with `probes`)
and needs their answers to choose the next. `run_jobs` drives every job at once and submits each
job's next cells as soon as its previous ones have returned, so N searches of P probes keep
N x P workers busy. Finished cells are recorded by this process in
OUT/cells/ (`Cells`: one JSON file per cell, written atomically) and recorded cells are read
back instead of recomputed, so a killed sweep, re-run, resumes. Each job sees its own rows in
its own order: the results depend neither on the executor (analyses.sweeps.executors) nor on the
order in which cells finish."""
from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

from models.checkpoint import write_json
from models.out_folder import TEMPORARY, claim, shown
from models.text import count
from models.training.progress import progress_bar


@dataclass(frozen=True)
class Cell:
    """fn(*args) -> one JSON row; `key` names its file in OUT/cells/. A stack of cells
    computed in one call names their keys in `parts`: fn(*args) then returns {part key: row},
    each part is recorded as its own cell, the stack is read back only when every part is
    recorded, and the job that asked for it receives the parts' rows as a tuple."""

    key: str
    fn: Callable[..., dict]
    args: tuple = ()
    parts: tuple[str, ...] = ()


# A job yields the cell it needs and receives its row, or yields a tuple of cells (computed at
# once) and receives their rows as a tuple; it returns its result.
Job = Generator[Cell | tuple[Cell, ...], dict | tuple[dict, ...], object]


def one(cell: Cell) -> Job:
    """A job of one cell; its result is the cell's row."""
    return (yield cell)


# ------------------------------------------------------------------ recorded cells
SWEEP_FOLDERS = ("cells", "state", "checkpoints", "model")  # a sweep's before settings.json (model: shrink's)


def claim_sweep(out: Path) -> Path:
    """models.out_folder.claim for a sweep's --out: new, empty, or a sweep's record (its
    settings.json, compared by Cells; a user's other files there stay); else refused."""
    def holds(folder: Path) -> None:
        other = sorted(p.name + "/" * p.is_dir() for p in folder.iterdir()
                       if p.name not in SWEEP_FOLDERS and not TEMPORARY.match(p.name))
        if other and not (folder / "settings.json").is_file():
            raise ValueError(f"--out {folder} holds files that are not a sweep's record ({shown(other)}; no "
                             "settings.json), which a sweep does not write over; choose another --out.")
    return claim(Path(out), holds)


class Cells:
    """One JSON file per finished cell in DIR/cells/, written atomically; DIR/settings.json
    holds the settings shared by every cell, and `torch_threads`, the torch threads each cell
    computes with, when it is not 1 (settings.json written before it was a setting lacks it,
    and reads as 1). `earlier`: the same settings as an earlier version of the sweep recorded
    them; such a directory resumes too. `growing`: settings that are lists of the values a
    sweep's cells are keyed by (the trade-off grid's H and m values), which may grow: a
    directory that recorded some of them resumes with more, and settings.json records the
    longer lists once a cell is recorded. A directory holding another sweep (other settings) is
    refused when this is built, before anything is written, naming each setting that differs.
    With `keep_checkpoints`, the cells that train a model keep it as a checkpoint in
    DIR/checkpoints/KEY/ (`checkpoint`); that choice changes no row, so it is not a setting,
    and a cell recorded earlier is not retrained for it. A cell that trains a stack keeps its
    resumable training state in DIR/state/KEY/ (`state`) until the cell is recorded: a sweep
    killed in the middle of a stack goes on from it."""

    def __init__(self, out: Path, settings: dict, torch_threads: int = 1, earlier: tuple[dict, ...] = (),
                 keep_checkpoints: bool = False, growing: tuple[str, ...] = ()):
        self.out, self.dir = claim_sweep(out), Path(out) / "cells"
        self.keep_checkpoints = keep_checkpoints
        threads = {} if torch_threads == 1 else {"torch_threads": torch_threads}
        self.settings = json.loads(json.dumps({**settings, **threads}))
        self.grows = False  # settings.json is rewritten with the grown lists when a cell is recorded
        path = self.out / "settings.json"
        if path.is_file():
            try:
                recorded = json.loads(path.read_text())
            except json.JSONDecodeError:
                recorded = None
            accepted = (self.settings, *json.loads(json.dumps([{**e, **threads} for e in earlier])))
            if recorded not in accepted:
                self.grows = _grown(recorded, accepted, growing)
                if not self.grows:
                    shared = _without(recorded, growing), _without(self.settings, growing)
                    raise ValueError(f"{out} holds a sweep with other settings ({path}{_differing(*shared)}"
                                     "); choose another --out, or delete it to start over.")
        self.computed = 0  # cells recorded (not read back) by this process

    def path(self, key: str) -> Path:
        return self.dir / (_file_name(key) + ".json")

    @staticmethod
    def recorded_sampler(out: Path, *where: str) -> str | None:
        """The training sampler of the sweep recorded in OUT/settings.json (at the keys `where`
        in it): the one it names, else `generator`, which every sweep recorded before the
        counter sampler became the default trained with and does not name; None where OUT
        holds no readable settings. A sweep resumed without --sampler takes it."""
        recorded = Cells.recorded_settings(out)
        for key in where:
            recorded = recorded.get(key) if isinstance(recorded, dict) else None
        return recorded.get("sampler", "generator") if isinstance(recorded, dict) else None

    @staticmethod
    def recorded_settings(out: Path) -> dict | None:
        """OUT/settings.json, or None where OUT holds no readable settings."""
        try:
            recorded = json.loads((Path(out) / "settings.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return recorded if isinstance(recorded, dict) else None

    def checkpoint(self, key: str) -> Path | None:
        """Where the cell `key` keeps its trained model (absolute, so a Ray worker on this
        file system writes it there), or None when checkpoints are not kept."""
        return (self.out / "checkpoints" / _file_name(key)).resolve() if self.keep_checkpoints else None

    def state(self, key: str) -> Path:
        """Where the cell `key` keeps its training state while it trains (absolute, as
        `checkpoint`); deleted once the cell is recorded (`release`)."""
        return (self.out / "state" / _file_name(key)).resolve()

    def release(self, key: str) -> None:
        """Delete the training state of the cell `key` (recorded: it is no longer needed)."""
        shutil.rmtree(self.state(key), ignore_errors=True)

    def recorded(self, key: str) -> dict | None:
        """The recorded row of `key`, or None."""
        path = self.path(key)
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass  # not ours (atomic writes never leave half a file): recompute it
        return None

    def record(self, key: str, row: dict) -> dict:
        """Write `row` as the cell `key`; the row as it reads back (JSON types)."""
        if self.grows or not (self.out / "settings.json").is_file():
            write_json(self.out / "settings.json", self.settings)
            self.grows = False
        write_json(self.path(key), row)
        self.computed += 1
        return json.loads(json.dumps(row))

    def rows(self) -> list[dict]:
        """Every recorded row, in file-name order."""
        return [json.loads(p.read_text()) for p in sorted(self.dir.glob("*.json"))]


def _file_name(key: str) -> str:
    """A cell's key as a file name."""
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", key)


def _without(settings, keys: tuple[str, ...]):
    """`settings` without the top-level `keys` (anything but a dict as it is)."""
    return {k: v for k, v in settings.items() if k not in keys} if isinstance(settings, dict) else settings


def _grown(recorded, accepted: tuple[dict, ...], growing: tuple[str, ...]) -> bool:
    """Whether `recorded` is one of the `accepted` settings but for the `growing` lists, each of
    which the first (today's) settings extend."""
    if not growing or not isinstance(recorded, dict) or _without(recorded, growing) not in [
            _without(a, growing) for a in accepted]:
        return False
    return all(set(map(json.dumps, recorded.get(k, []))) <= set(map(json.dumps, accepted[0].get(k, [])))
               for k in growing)


def _differing(recorded, settings: dict) -> str:
    """'; differing: run.train.steps: recorded 3000, now 50; ...' for each setting that differs
    ('' when none can be named)."""
    changes = setting_changes(recorded, settings) if isinstance(recorded, dict) else []
    return f"; differing: {'; '.join(changes)}" if changes else ""


def setting_changes(recorded: dict, settings: dict) -> list[str]:
    """'NAME: recorded OLD, now NEW' for each setting that differs (nested settings by their
    dotted path, values as JSON)."""
    was, now = _flat(recorded), _flat(settings)
    return [f"{name}: recorded {_shown(was, name)}, now {_shown(now, name)}"
            for name in sorted(was.keys() | now.keys()) if was.get(name, _ABSENT) != now.get(name, _ABSENT)]


_ABSENT = object()  # a setting one side does not record


def _shown(settings: dict, name: str) -> str:
    return json.dumps(settings[name]) if name in settings else "(absent)"


def _flat(settings: dict, prefix: str = "") -> dict:
    """Nested settings as {dotted path: value}."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


# ------------------------------------------------------------------ the engine
def run_jobs(jobs: list[Job], cells: Cells, executor, *, desc: str = "cells", total: int | None = None,
             progress: bool = True, compute: bool = True) -> list:
    """Drive every job until it returns; their results, in the jobs' order. A cell asked for
    is read from `cells` if recorded, else submitted to `executor` (once, however many jobs
    wait on it) and recorded when it returns. `total`: the number of cells, when known.
    compute=False reads recorded cells only: a job that asks for another one is left, and
    its result is None (the tables of a sweep still running, or cut short). Ctrl-C stops it
    with a KeyboardInterrupt that says what is recorded and that the same command resumes."""
    results: list = [None] * len(jobs)
    waiting: dict[str, list[int]] = {}  # key of a submitted cell -> the jobs waiting on it
    asked: dict[int, tuple[Cell | tuple[Cell, ...], dict]] = {}  # job -> its request, the rows in so far
    bar = _Bar(desc, total, executor, progress)

    def advance(i: int, reply) -> None:
        """Send job i its row(s); follow it through recorded cells until it waits on computed
        ones or returns."""
        while True:
            try:
                request = jobs[i].send(reply)
            except StopIteration as stop:
                results[i] = stop.value
                return
            rows = {}
            for cell in _cells(request):
                row = _recorded(cells, cell)
                if row is not None:
                    rows[cell.key] = row
                    bar.done(computed=False, n=len(cell.parts) or 1)
                elif compute:
                    if cell.key not in waiting:
                        executor.submit(cell)
                        waiting[cell.key] = []
                    waiting[cell.key].append(i)
            if len(rows) < len(_cells(request)):
                asked[i] = (request, rows)
                return
            reply = _reply(request, rows)

    try:
        with bar:
            for i in range(len(jobs)):
                advance(i, None)
            bar.show()
            while waiting:
                cell, row = executor.finished()
                row = _record(cells, cell, row)
                bar.done(computed=True, n=len(cell.parts) or 1)
                for i in waiting.pop(cell.key):
                    request, rows = asked[i]
                    rows[cell.key] = row
                    if len(rows) == len(_cells(request)):
                        del asked[i]
                        advance(i, _reply(request, rows))
                bar.show()
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_interrupted(cells)) from None
    return results


def _interrupted(cells) -> str:
    """What a sweep stopped by Ctrl-C leaves: the cells recorded, and how to go on."""
    folder = getattr(cells, "dir", None)
    if folder is None:  # nothing recorded on disk (a plan)
        return "interrupted"
    recorded = len(list(folder.glob("*.json"))) if folder.is_dir() else 0
    return (f"interrupted: {count(recorded, 'cell')} recorded in {folder}/ ({cells.computed} by this run); "
            "rerun the same command to resume from them")


def _recorded(cells: Cells, cell: Cell) -> dict | tuple[dict, ...] | None:
    """The recorded row of `cell`, the rows of a stack's parts (all recorded), or None."""
    if not cell.parts:
        return cells.recorded(cell.key)
    rows = tuple(cells.recorded(key) for key in cell.parts)
    return None if None in rows else rows


def _record(cells: Cells, cell: Cell, row: dict) -> dict | tuple[dict, ...]:
    """Record a computed cell, or each part of a computed stack, then release its training
    state; the row(s) as read back."""
    rows = cells.record(cell.key, row) if not cell.parts else tuple(cells.record(key, row[key]) for key in cell.parts)
    cells.release(cell.key)
    return rows


def _cells(request: Cell | tuple[Cell, ...]) -> tuple[Cell, ...]:
    return request if isinstance(request, tuple) else (request,)


def _reply(request: Cell | tuple[Cell, ...], rows: dict[str, dict]):
    """A job's answer: the row of the cell it asked for, or the rows of its tuple, in order."""
    return tuple(rows[c.key] for c in request) if isinstance(request, tuple) else rows[request.key]


class _Bar:
    """Cells done / running / total, and cells per hour computed by this process."""

    def __init__(self, desc: str, total: int | None, executor, progress: bool):
        self.executor, self.start, self.computed = executor, time.perf_counter(), 0
        shape = "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}" if total else "{n_fmt}"
        self.tqdm = progress_bar(desc=desc, total=total, disable=not progress, dynamic_ncols=True, unit="cell",
                                 bar_format="{desc}: " + shape + " cells done{postfix} [{elapsed}]")

    def done(self, computed: bool, n: int = 1) -> None:
        self.computed += n * computed
        self.tqdm.update(n)

    def show(self) -> None:
        hours = (time.perf_counter() - self.start) / 3600
        rate = f"{self.computed / hours:.0f} cells/h" if self.computed else "? cells/h"
        self.tqdm.set_postfix_str(f"{self.executor.running} running, {rate}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.tqdm.close()
