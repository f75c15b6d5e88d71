"""The sweep engine: concurrent searches, order-independent results, the local, worker
processes and Ray executors give the same rows (each cell with the sweep's torch threads), a
killed Ray worker's cell is retried and recorded once, a killed worker process or a cell that
raises stops the sweep at once with the finished cells recorded, a killed driver resumes, bad
executor settings and a resume with other torch threads are refused in one line."""
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.search import bisection, largest_passing, search
from models.text import count
from tests.conftest import as_from_a_terminal

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the engine
def threshold_row(threshold: int, n: int) -> dict:
    return {"threshold": threshold, "n": n, "passes": n <= threshold}


class Shuffled:
    """Holds every submitted cell and finishes them in a random order."""

    def __init__(self, seed: int):
        self.rng, self.pending, self.most = random.Random(seed), [], 0

    @property
    def running(self) -> int:
        return len(self.pending)

    def submit(self, cell):
        self.pending.append(cell)
        self.most = max(self.most, len(self.pending))

    def finished(self):
        cell = self.pending.pop(self.rng.randrange(len(self.pending)))
        return cell, cell.fn(*cell.args)


def _jobs(thresholds):
    searches = [search(bisection(8), lambda n, t=t: Cell(f"t{t}_n{n}", threshold_row, (t, n)), lambda r: r["passes"])
                for t in thresholds]
    return searches + [one(Cell("grid_point", threshold_row, (5, 5)))]


def test_searches_run_concurrently_and_results_do_not_depend_on_finish_order(tmp_path):
    thresholds = [3, 17, 40, 90, 200]
    tables = []
    for seed in range(4):
        executor = Shuffled(seed)
        cells = Cells(tmp_path / str(seed), {"sweep": "thresholds"})
        results = run_jobs(_jobs(thresholds), cells, executor, progress=False)
        assert results == thresholds + [threshold_row(5, 5)]
        assert results[:-1] == [largest_passing(lambda n, t=t: n <= t, 8) for t in thresholds]
        assert executor.most == len(thresholds) + 1  # every search had a probe in flight at once
        tables.append(cells.rows())
    assert all(t == tables[0] for t in tables)


@pytest.mark.parametrize("probes", [2, 3])
def test_a_search_of_several_probes_keeps_that_many_workers_busy_and_finds_the_same_answer(tmp_path, probes):
    thresholds = [3, 17, 40, 90, 200]
    jobs = [search(bisection(8, probes=probes), lambda n, t=t: Cell(f"t{t}_n{n}", threshold_row, (t, n)),
                   lambda r: r["passes"]) for t in thresholds]
    executor = Shuffled(probes)
    cells = Cells(tmp_path, {"sweep": "thresholds"})
    assert run_jobs(jobs, cells, executor, progress=False) == thresholds
    assert executor.most == probes * len(thresholds)  # every search had `probes` cells in flight at once
    resumed = run_jobs([search(bisection(8, probes=probes), lambda n, t=t: Cell(f"t{t}_n{n}", threshold_row, (t, n)),
                               lambda r: r["passes"]) for t in thresholds], cells, Refuses(), progress=False)
    assert resumed == thresholds  # a re-run reads every round back from the recorded cells


class Refuses:
    """An executor that must not be asked for anything."""

    running = 0

    def submit(self, cell):
        raise AssertionError(f"cell {cell.key} submitted")


def test_compute_false_reads_the_recorded_cells_and_leaves_the_rest(tmp_path):
    cells = Cells(tmp_path, {})
    cells.record("a", threshold_row(1, 1))
    jobs = [one(Cell("a", threshold_row, (1, 1))), one(Cell("b", threshold_row, (1, 2))),
            search(bisection(8), lambda n: Cell(f"n{n}", threshold_row, (3, n)), lambda r: r["passes"])]
    assert run_jobs(jobs, cells, Refuses(), progress=False, compute=False) == [threshold_row(1, 1), None, None]
    assert [p.name for p in (tmp_path / "cells").iterdir()] == ["a.json"]


def test_a_cell_two_jobs_ask_for_is_computed_once(tmp_path):
    executor = Shuffled(0)
    cells = Cells(tmp_path, {})
    assert run_jobs([one(Cell("same", threshold_row, (1, 1))) for _ in range(3)], cells, executor,
                    progress=False) == [threshold_row(1, 1)] * 3
    assert executor.most == 1 and cells.computed == 1


def stateful_rows(state: str, keys: tuple[str, ...]) -> dict:
    """A stack cell that leaves a training state in `state` as it computes."""
    Path(state).mkdir(parents=True, exist_ok=True)
    (Path(state) / "step_00000001.json").write_text("{}")
    return {key: threshold_row(1, 1) for key in keys}


def test_a_cell_s_training_state_is_kept_until_the_cell_is_recorded(tmp_path):
    cells = Cells(tmp_path, {})
    state = cells.state("stack")
    assert state == (tmp_path / "state" / "stack").resolve()
    stateful_rows(str(cells.state("left")), ("x",))  # a cell still to compute keeps its state
    run_jobs([one(Cell("stack", stateful_rows, (str(state), ("a", "b")), parts=("a", "b")))], cells, Shuffled(0),
             progress=False)
    assert not state.exists() and cells.state("left").is_dir()
    assert [p.name for p in sorted((tmp_path / "cells").iterdir())] == ["a.json", "b.json"]


# ------------------------------------------------------------------ CLI: bad settings
TINY = ["--n-subjects", "8", "--n-relations", "4", "--answers-per-relation", "4", "--n-noise", "8", "--seq-len", "8",
        "--d-model", "32", "--d-head", "8", "--steps", "150", "--eval-every", "50", "--contexts", "2",
        "--patch-contexts", "1", "--device", "cpu", "--quiet"]
GRID = ["grid", "--heads", "1,2", "--widths", "4,32", *TINY]


def _tradeoff(argv, capsys):
    """`python -m analyses.tradeoff ARGV` in this process: (exit code, stdout, stderr)."""
    from analyses.tradeoff import main
    from models.cli import run_cli

    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(argv))
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


@pytest.mark.parametrize("flags, message", [
    (["--executor", "dask"], "unknown --executor 'dask'"),
    (["--executor", "ray", "--ray-address", "127.0.0.1:1"], "no Ray cluster answers there"),
    (["--executor", "ray", "--gpus-per-cell", "0.25"], "needs CUDA"),
    (["--gpus-per-cell", "0.25"], "--gpus-per-cell needs --executor ray"),
    (["--executor", "processes", "--ray-address", "127.0.0.1:1"], "--ray-address needs --executor ray"),
    (["--jobs", "2"], "--jobs needs --executor processes"),
    (["--executor", "processes", "--jobs", "0"], "--jobs must be an integer >= 1, got 0"),
    (["--torch-threads", "0"], "--torch-threads must be an integer >= 1, got 0"),
])
def test_bad_executor_settings_refused_in_one_line_before_anything_runs(tmp_path, capsys, flags, message):
    if "ray" in flags:
        pytest.importorskip("ray")
    if "needs CUDA" in message and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    code, _, err = _tradeoff([*GRID, *flags, "--out", str(out)], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_an_out_holding_another_sweep_is_refused_in_one_line(tmp_path, capsys):
    Cells(tmp_path, {"analysis": "capacity memory"}).record("probe", {"accuracy": 1.0})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, _, err = _tradeoff([*GRID, "--out", str(tmp_path)], capsys)
    assert code == 2 and "other settings" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_torch_threads_are_recorded_when_not_1_and_a_resume_must_keep_them(tmp_path):
    Cells(tmp_path / "default", {"sweep": "s"}).record("a", {"x": 1})
    assert json.loads((tmp_path / "default" / "settings.json").read_text()) == {"sweep": "s"}  # as before the setting
    Cells(tmp_path / "two", {"sweep": "s"}, torch_threads=2).record("a", {"x": 1})
    assert json.loads((tmp_path / "two" / "settings.json").read_text()) == {"sweep": "s", "torch_threads": 2}
    for out, threads in (("default", 2), ("two", 1)):
        with pytest.raises(ValueError, match="differing: torch_threads"):
            Cells(tmp_path / out, {"sweep": "s"}, torch_threads=threads)


def test_a_resume_with_other_settings_names_each_setting_and_both_values(tmp_path):
    recorded = {"analysis": "grid", "run": {"train": {"steps": 3000, "lr": [0.01]}, "model": {"d_model": 32}}}
    Cells(tmp_path, recorded).record("a", {"x": 1})
    changed = {"analysis": "grid", "run": {"train": {"steps": 50, "lr": [0.01]}, "model": {"d_model": 32, "d_head": 4}}}
    with pytest.raises(ValueError) as refused:
        Cells(tmp_path, changed)
    assert "differing: run.model.d_head: recorded (absent), now 4; run.train.steps: recorded 3000, now 50" in str(
        refused.value)


def test_settings_an_earlier_version_recorded_resume(tmp_path):
    Cells(tmp_path, {"sweep": "s", "n_heads": 8}).record("a", {"x": 1})
    assert Cells(tmp_path, {"sweep": "s"}, earlier=({"sweep": "s", "n_heads": 8},)).recorded("a") == {"x": 1}
    with pytest.raises(ValueError, match="n_heads: recorded 8, now"):
        Cells(tmp_path, {"sweep": "s"}, earlier=({"sweep": "s", "n_heads": 4},))


# ------------------------------------------------------------------ Ray
@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance with 2 CPUs for the module (the executor reuses it)."""
    ray = pytest.importorskip("ray")
    from analyses.sweeps.executors import start_ray

    start_ray(num_cpus=2)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def local_grid_out(tmp_path_factory):
    """The tiny trade-off grid, uninterrupted, in this process: its --out."""
    from analyses.tradeoff import main

    out = tmp_path_factory.mktemp("local")
    assert main([*GRID, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def local_grid(local_grid_out):
    return pd.read_csv(local_grid_out / "grid.csv")


def test_recorded_only_tables_the_cells_so_far(local_grid_out, local_grid, tmp_path, capsys):
    out = tmp_path / "cut_short"
    shutil.copytree(local_grid_out / "cells", out / "cells")
    shutil.copy(local_grid_out / "settings.json", out)
    (out / "cells" / "H2_m32.json").unlink()  # a sweep cut short before its last cell
    code, stdout, stderr = _tradeoff([*GRID, "--recorded-only", "--out", str(out)], capsys)
    assert code == 0, stderr
    expected = local_grid[~((local_grid["heads"] == 2) & (local_grid["width"] == 32))].reset_index(drop=True)
    pd.testing.assert_frame_equal(pd.read_csv(out / "grid.csv"), expected)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cells"] == "3 of 4" and summary["cells_computed"] == 0 and "(0 new cells)" in stdout
    assert (out / "grid.png").is_file() and not (out / "cells" / "H2_m32.json").exists()


def test_a_resume_with_other_torch_threads_is_refused_in_one_line(local_grid_out, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(local_grid_out, out)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.rglob("*"))
    code, _, err = _tradeoff([*GRID, "--torch-threads", "2", "--out", str(out)], capsys)
    assert code == 2 and "differing: torch_threads" in err and err.count("\n") == 1, err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.rglob("*")) == before


def threads_row(i: int) -> dict:
    """A cell that says how many torch threads it computed with, and a sum that threads could round."""
    g = torch.Generator().manual_seed(i)
    a, b = torch.randn(256, 2048, generator=g), torch.randn(2048, 256, generator=g)
    return {"i": i, "threads": torch.get_num_threads(), "sum": float((a @ b).sum())}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["processes", "ray"])
@pytest.mark.parametrize("threads", [None, 2])
def test_each_cell_computes_with_the_sweep_s_torch_threads_on_every_executor(request, tmp_path, kind, threads):
    from analyses.sweeps.executors import ExecutorSettings, open_executor

    if kind == "ray":
        request.getfixturevalue("ray_cluster")
    jobs = {"jobs": 2} if kind == "processes" else {}
    rows = {}
    for name, settings in (("local", {}), (kind, {"executor": kind, **jobs})):
        threading = {} if threads is None else {"torch_threads": threads}
        with open_executor(ExecutorSettings(**settings, **threading)) as executor:
            rows[name] = run_jobs([one(Cell(f"c{i}", threads_row, (i,))) for i in range(4)],
                                  Cells(tmp_path / name, {}), executor, progress=False)
    assert rows["local"] == rows[kind]
    assert {row["threads"] for row in rows["local"]} == {threads or 1}


@pytest.mark.slow
def test_ray_rows_equal_local_rows(ray_cluster, local_grid, tmp_path, capsys):
    code, out, err = _tradeoff([*GRID, "--executor", "ray", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "(4 new cells)" in out
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "grid.csv"), local_grid)


def dies_once(attempts: str, n: int) -> dict:
    """A cell whose first attempt at n = 1 kills its own worker (SIGKILL) mid-cell."""
    log = Path(attempts) / f"n{n}_{os.getpid()}_{time.monotonic_ns()}"
    log.touch()
    if n == 1 and len(list(Path(attempts).glob("n1_*"))) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"n": n, "attempt": len(list(Path(attempts).glob(f"n{n}_*")))}


class CountingCells(Cells):
    def __init__(self, *args):
        super().__init__(*args)
        self.writes = {}

    def record(self, key, row):
        self.writes[key] = self.writes.get(key, 0) + 1
        return super().record(key, row)


@pytest.mark.slow
def test_a_killed_workers_cell_is_retried_and_recorded_once(ray_cluster, tmp_path):
    from analyses.sweeps.executors import RayExecutor

    attempts = tmp_path / "attempts"
    attempts.mkdir()
    cells = CountingCells(tmp_path / "out", {"sweep": "dies once"})
    rows = run_jobs([one(Cell(f"n{n}", dies_once, (str(attempts), n))) for n in range(4)], cells, RayExecutor(),
                    progress=False)
    assert [r["n"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["attempt"] == 2 and len(list(attempts.glob("n1_*"))) == 2  # killed once, run again
    assert cells.writes == {f"n{n}": 1 for n in range(4)} and cells.rows() == rows


@pytest.mark.slow
def test_a_killed_driver_resumes_to_the_uninterrupted_table(ray_cluster, local_grid, tmp_path, capsys):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    driver = subprocess.Popen([sys.executable, "-m", "analyses.tradeoff", *GRID, "--executor", "ray",
                               "--ray-address", ray_cluster, "--out", str(out)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while driver.poll() is None and not list((out / "cells").glob("*.json")):
            time.sleep(0.05)
    finally:
        driver.send_signal(signal.SIGKILL)
        _, err = driver.communicate()
    recorded = len(list((out / "cells").glob("*.json")))
    assert 1 <= recorded < 4, err.decode()  # killed mid-sweep
    code, stdout, stderr = _tradeoff([*GRID, "--executor", "ray", "--out", str(out)], capsys)
    assert code == 0, stderr
    assert f"({count(4 - recorded, 'new cell')})" in stdout
    pd.testing.assert_frame_equal(pd.read_csv(out / "grid.csv"), local_grid)
    assert json.loads((out / "summary.json").read_text())["cells_computed"] == 4 - recorded


# ------------------------------------------------------------------ worker processes
@pytest.mark.slow
def test_worker_process_cells_equal_local_cells(local_grid_out, local_grid, tmp_path, capsys):
    code, out, err = _tradeoff([*GRID, "--executor", "processes", "--jobs", "2", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "(4 new cells)" in out
    assert _cell_files(tmp_path) == _cell_files(local_grid_out)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "grid.csv"), local_grid)


def _cell_files(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in (out / "cells").glob("*.json")}


def fails_or_waits(done: str, n: int) -> dict:
    """Cell 0 returns, cell 1 refuses its input, cell 2 would write `done` after a minute."""
    if n == 1:
        raise ValueError("cell 1: a bad setting\nsecond line")
    if n == 2:
        time.sleep(60)
        Path(done).touch()
    return {"n": n}


def dies(n: int) -> dict:
    """Cell 1 kills its own worker (SIGKILL) mid-cell; the others return."""
    if n == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"n": n}


@pytest.mark.slow
@pytest.mark.parametrize("fn", [fails_or_waits, dies])
def test_a_failing_or_killed_worker_process_stops_the_sweep_with_the_finished_cells_recorded(tmp_path, fn):
    """One worker: cell 0 returns before cell 1 fails (raises, or its worker is killed); the
    sweep stops with one clear line, cell 0 recorded, and the cell still computing (or
    queued) is not waited for: no worker is left."""
    from analyses.sweeps.executors import ExecutorSettings, open_executor

    done = tmp_path / "cell 2 done"
    args = (lambda n: (str(done), n)) if fn is fails_or_waits else (lambda n: (n,))
    cells = Cells(tmp_path / "out", {})
    raised = (ValueError, "cell 1: a bad setting") if fn is fails_or_waits else (RuntimeError, "worker process died")
    with pytest.raises(raised[0], match=raised[1]) as stopped:
        with open_executor(ExecutorSettings(executor="processes", jobs=1)) as executor:
            run_jobs([one(Cell(f"n{n}", fn, args(n))) for n in range(3)], cells, executor, progress=False)
    assert stopped.value.__suppress_context__  # one line: no worker traceback chained on
    assert cells.rows() == [{"n": 0}]
    assert not multiprocessing.active_children() and not done.exists()


def interrupted(n: int) -> dict:
    """A Ctrl-C reaching the worker mid-cell (a terminal sends it to every process of the
    command), then the cell's row."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    return {"n": n}


@pytest.mark.slow
def test_a_ctrl_c_reaches_the_driver_alone_not_its_worker_processes(tmp_path):
    """Workers start with SIGINT blocked: a Ctrl-C does not interrupt their cells (the driver,
    which handles it, stops them), so no worker prints a traceback or leaves its queues'
    semaphores behind."""
    from analyses.sweeps.executors import ExecutorSettings, open_executor

    cells = Cells(tmp_path / "out", {})
    try:
        with open_executor(ExecutorSettings(executor="processes", jobs=2)) as executor:
            rows = run_jobs([one(Cell(f"n{n}", interrupted, (n,))) for n in range(3)], cells, executor,
                            progress=False)
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C interrupted a worker's cell")  # not the test run itself
    assert rows == [{"n": n} for n in range(3)] and not multiprocessing.active_children()


def _group(pgid: int) -> list[str]:
    """The command lines of the live processes of process group `pgid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_of_a_processes_sweep_says_how_to_resume_in_one_line(tmp_path):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) while the workers
    compute: exit 130 and one line saying what is recorded and that the same command resumes;
    no worker traceback, no leaked-semaphore warning, no process left."""
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "analyses.capacity", "memory", "--d", "8,16", "--seeds", "0,1",
                             "--steps", "4000", "--executor", "processes", "--jobs", "2", "--quiet", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT,
                            preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 120
    while sum("spawn_main" in c for c in _group(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # the two workers started (spawned: importing, then computing)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    recorded = len(list((out / "cells").glob("*.json"))) if (out / "cells").is_dir() else 0
    assert err == (f"interrupted: {count(recorded, 'cell')} recorded in {out / 'cells'}/ ({recorded} by this run); "
                   "rerun the same command to resume from them\n")
    deadline = time.monotonic() + 20
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group(proc.pid) == []  # the workers were stopped with it


# ------------------------------------------------------------------ kept checkpoints
@pytest.mark.parametrize("stack", ["off", "on"])
def test_keep_checkpoints_keeps_each_cell_s_model_for_locate_facts(tmp_path, capsys, stack):
    """A two-cell grid with --keep-checkpoints (each cell alone, or the cells as one stack):
    each cell's model is a checkpoint that loads, and locate_facts on it finds the accuracy
    the cell recorded."""
    from analyses import locate_facts
    from models import load

    out = tmp_path / "grid"
    code, stdout, err = _tradeoff(["grid", "--heads", "2", "--widths", "4,32", *TINY, "--stack", stack,
                                   "--keep-checkpoints", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out / "grid.csv").set_index("width")
    for width in (4, 32):
        model, task = load(out / "checkpoints" / f"H2_m{width}", device="cpu")
        assert (model.cfg.n_heads, model.cfg.d_mlp, task.n_subjects) == (2, width, 8)
        config = json.loads((out / "checkpoints" / f"H2_m{width}" / "config.json").read_text())
        assert config["training"]["final_accuracy"] == pytest.approx(table.loc[width, "accuracy"])
    located = tmp_path / "located"
    assert locate_facts.main([str(out / "checkpoints" / "H2_m32"), "--contexts", "2", "--patch-contexts", "1",
                              "--device", "cpu", "--quiet", "--out", str(located)]) == 0
    summary = json.loads((located / "summary.json").read_text())
    assert summary["accuracy"] == pytest.approx(table.loc[32, "located_accuracy"])
