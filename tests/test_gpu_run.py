"""The one-command GPU run (scripts/gpu_run.sh) as a dry run at tiny sizes on the CPU, on
fresh copies of the tree (as a lent GPU machine gets it): its results land in the results
folders, a call killed in the middle of a piece leaves them whole, and the next call, on
another copy holding those results and no archive, runs the tests' subset, skips the bench
lines and the sweep pieces already recorded and goes on from the cut piece's cells; a call out
of time ends within its budget; and the offline set-up (scripts/setup.sh --offline) from a
folder of wheels."""
import contextlib
import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch

from analyses.sweeps.gpu_records import CODE, code_hash, record

ROOT = Path(__file__).resolve().parents[1]
ENV = {**{k: v for k, v in os.environ.items() if k != "FACTUAL_RECALL_TEST_TIMES"},  # the run's own tests: not logged
       "PYTHON": sys.executable, "GPU_RUN_JOBS": "1", "GPU_RUN_PACK_SECONDS": "1",
       "OMP_NUM_THREADS": "1"}
ALLOWED = {"report.txt", "tests_cuda.txt", "bench.txt", "gpu_checks.json", "results.tar.gz", "state.tar.gz"}
DRY = "results/dry_run"
FIG4 = f"{DRY}/capacity/paper_fig4_left_full"
PIECES = ["d11", "alpha1", "alpha1_large", "alpha2", "alpha2_large", "2e16_d11"]  # the dry run's, in order


def _tree(path: Path) -> Path:
    """A fresh copy of the checkout's code, without git and without results."""
    for name in ("analyses", "bench", "models", "probe", "scripts", "tasks", "tests"):
        shutil.copytree(ROOT / name, path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", path)
    (path / "results").mkdir()
    return path


def _archive(path: Path) -> dict[str, str]:
    """Every file of an archive: its name (no leading ./) and the sha256 of its bytes ({} while unreadable)."""
    try:
        with tarfile.open(path) as tar:
            return {m.name.removeprefix("./"): hashlib.sha256(tar.extractfile(m).read()).hexdigest()
                    for m in tar if m.isfile()}
    except (OSError, tarfile.TarError, EOFError):
        return {}


def _cells(files: dict, folder: str = "") -> dict:
    return {name: digest for name, digest in files.items() if name.startswith(f"{FIG4}/{folder}") and "/cells/" in name}


def _done(files: dict, piece: str) -> bool:
    return f"{DRY}/gpu/done/fig4_left_{piece}" in files


def _folder(piece: str) -> str:
    return piece.removesuffix("_large")


def _cut_piece(files: dict) -> str | None:
    """A piece that has recorded a probe but not finished, once the first piece has finished."""
    if not _done(files, PIECES[0]):
        return None
    return next((p for p in PIECES[1:] if _cells(files, _folder(p) + "/") and not _done(files, p)
                 and _done(files, PIECES[PIECES.index(p) - 1])), None)


def _run_until(tree: Path, out: Path, until, seconds: int = 600) -> dict:
    """A dry run in `tree`, killed (its whole process group, as a time limit would) once its
    results.tar.gz satisfies `until`; the results it brought back."""
    run = subprocess.Popen(["bash", "scripts/gpu_run.sh", "--dry-run", str(out)], cwd=tree,
                           env={**ENV, "PYTHONPATH": str(tree)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    deadline, seen, files = time.monotonic() + seconds, None, {}
    try:
        while time.monotonic() < deadline and run.poll() is None and not until(files):
            time.sleep(0.3)
            try:  # read again only a new archive (each pack is a new file, renamed into place)
                stat = (out / "results.tar.gz").stat()
                now = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            except OSError:
                now = None
            if now != seen or not files:
                seen, files = now, _archive(out / "results.tar.gz")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a run that ended by itself has no group left
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    return _archive(out / "results.tar.gz")


@pytest.mark.slow
def test_a_gpu_run_lands_its_results_in_the_repository_and_the_next_call_goes_on_from_them(tmp_path):
    first, out = _tree(tmp_path / "first"), tmp_path / "out"
    results = _run_until(first, out, _cut_piece)
    cut = _cut_piece(results)
    assert cut, "no piece after the first was cut in the middle"
    assert f"{DRY}/tradeoff/paper_grid_gpu/grid.csv" in results and f"{FIG4}/d11/capacity.csv" in results
    assert not [n for n in results if "/state/" in n or n.endswith(".tmp")]  # in-flight states: the archive's
    report = (out / "report.txt").read_text()
    assert "tests: in full" in report and "bench_stack-169: exit 0" in report  # a fresh tree: nothing recorded
    assert "bench_tiny-k1: exit 0" in report  # a line the profiler does not read
    assert "== stack-vocab" in (out / "bench.txt").read_text()  # the profiler's table
    assert re.search(r"test_graphed\.py::\S+ PASSED", (out / "tests_cuda.txt").read_text())  # each test by name
    assert report.index("tests: exit") < report.index("induction: exit 0") < report.index("bench_stack-169:") \
        < report.index("grid: exit")
    induction = f"{DRY}/induction/paper_gpu/"  # the in-context studies, their weights without snapshots or pages
    assert {induction + f for f in ("summary.json", "probes.csv", "layers.csv", "location.csv",
                                    "model/model.safetensors")} <= set(results)
    assert f"{DRY}/gpu/done/induction" in results
    assert not [n for n in results if n.startswith(induction) and ("snapshots" in n or n.endswith(".html")
                                                                    or "train_state" in n)]
    started = [report.find(f"fig4_left_{p}:") for p in PIECES[:PIECES.index(cut)]]
    assert -1 not in started and started == sorted(started)  # the largest sizes first

    second, again = _tree(tmp_path / "second"), tmp_path / "again"  # another machine, the results committed
    with tarfile.open(out / "results.tar.gz") as tar:
        tar.extractall(second, filter="data")
    assert code_hash(CODE["bench"], second) == code_hash(CODE["bench"], first)
    resumed = _run_until(second, again, lambda files: _done(files, cut), seconds=300)
    report = (again / "report.txt").read_text()
    assert _done(resumed, cut), report
    assert "tests: the subset" in report and "bench_stack-169: measured at this code" in report
    for step in ("grid", "induction", "fig4_left_d11"):
        assert f"{step}: done in an earlier call" in report
    assert f"fig4_left_{cut}: exit 0" in report
    assert {n: resumed.get(n) for n in _cells(results)} == _cells(results)  # kept, not recomputed
    assert len(_cells(resumed, _folder(cut) + "/")) >= len(_cells(results, _folder(cut) + "/"))
    capacity = pd.read_csv(second / FIG4 / "fig4_left.csv")  # every piece's sizes so far, one table
    assert set(capacity["piece"]) >= {"d11", _folder(cut)} and capacity["S_star"].ge(2).all()
    # a pack or a copy (put: .NAME.PID.tmp) the test's SIGKILL cut short
    cut_packs = re.compile(r"(results|state)\.tar\.gz\.\d+\.tmp|\.(report|tests_cuda|bench)\.txt\.\d+\.tmp")
    assert {p.name for p in again.iterdir() if not cut_packs.fullmatch(p.name)} <= ALLOWED


@pytest.mark.slow
def test_a_gpu_run_out_of_time_leaves_the_pieces_and_ends_within_its_budget(tmp_path):
    """Resumed with its tests and bench recorded at this code and too little time for any piece
    (a piece keeps 10 s after its search, the pack 5 s): no piece starts a process, one line names
    the pieces left, and the report and both archives are packed within the budget. Then with
    time for the first piece (that call's own wall time, measured, plus the 15 s a piece keeps
    and 10 s): it starts, the time it takes counts against the rest, which are left for the next
    call, and the call still ends within its budget and a few seconds."""
    tree = _tree(tmp_path / "tree")
    for name, entry, code in (("passed", "tests", "tests"), ("measured", "stack-169", "bench"),
                              ("measured", "tiny-k1", "bench")):
        record(tree / DRY / "gpu" / f"{name}.json", entry, {"code": code_hash(CODE[code], tree)})
    (tree / DRY / "gpu" / "done").mkdir()
    for step in ("grid", "induction"):
        (tree / DRY / "gpu" / "done" / step).write_text("finished earlier\n")
    earlier = tmp_path / "earlier"
    for key, size in (("small", 1000), ("large", 200_000)):  # two stacks' states in flight
        (earlier / "inflight" / "sweep" / key).mkdir(parents=True)
        (earlier / "inflight" / "sweep" / key / "step_00000001.safetensors").write_bytes(os.urandom(size))
    (earlier / "report.txt").write_text("an earlier call\n")
    with tarfile.open(tmp_path / "state.tar.gz", "w:gz") as tar:
        tar.add(earlier, arcname=".")

    def call(out: Path, budget: int) -> tuple[float, list[str]]:
        t0 = time.monotonic()
        done = subprocess.run(["bash", "scripts/gpu_run.sh", "--dry-run", str(out), str(tmp_path / "state.tar.gz")],
                              cwd=tree, env={**ENV, "GPU_RUN_SECONDS": str(budget), "PYTHONPATH": str(tree),
                                             "GPU_RUN_ARCHIVE_BYTES": "100000"},
                              capture_output=True, text=True, timeout=300)
        seconds = time.monotonic() - t0
        assert done.returncode == 0, done.stdout + done.stderr
        assert seconds < budget + 8, f"{seconds:.0f} s for a budget of {budget} s"
        return seconds, (out / "report.txt").read_text().splitlines()
    out = tmp_path / "out"
    seconds, report = call(out, 12)
    assert report[0] == "an earlier call" and report[-1].startswith("gpu_run: ")
    assert [line for line in report if line.startswith("bench_stack-169: measured at this code (")]
    assert f"fig4_left: {len(PIECES)} of {len(PIECES)} pieces left for the next call" in report
    assert not [line for line in report if line.startswith("fig4_left_")]
    assert not [name for name in _archive(out / "results.tar.gz") if name.startswith(FIG4)]  # no search, no table
    with tarfile.open(out / "state.tar.gz") as tar:  # the last pack holds the whole report
        assert tar.extractfile("./report.txt").read().decode().splitlines() == report
    kept = _archive(out / "state.tar.gz")  # the in-flight states that fit the archive's limit, smallest first
    assert "inflight/sweep/small/step_00000001.safetensors" in kept and not [n for n in kept if "large" in n]
    assert "state.tar.gz: 1 in-flight stacks' states left out, 1 kept (the archive's limit: 100000 bytes)" in report
    assert {p.name for p in out.iterdir()} <= ALLOWED

    _, report = call(tmp_path / "out2", math.ceil(seconds) + 25)  # time for the first piece, not for all
    started = [line.split(":")[0] for line in report if re.match(r"fig4_left_\w+: exit", line)]
    assert started[:1] == ["fig4_left_d11"] and len(started) < len(PIECES), report
    left = [int(m[1]) for line in report if (m := re.fullmatch(r"fig4_left: (\d+) of \d+ pieces left for the next call",
                                                                line))]
    assert left and len(PIECES) - len(started) <= left[0] <= len(PIECES), report  # what did not start is left


def test_gpu_run_refuses_a_missing_archive_in_one_line(tmp_path):
    done = subprocess.run(["bash", "scripts/gpu_run.sh", "--dry-run", str(tmp_path / "out"), str(tmp_path / "no.tgz")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"gpu_run: {tmp_path / 'no.tgz'}: no such archive"]


def _wheel(folder: Path, name: str) -> Path:
    """A minimal pure-Python wheel of a module `name` whose VALUE is 7."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{name}/__init__.py", "VALUE = 7\n")
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.slow
def test_offline_setup_builds_a_venv_from_wheels_and_a_python_with_torch(tmp_path):
    """No network: the venv sees the given Python's torch (itself a virtual environment here),
    the wheels' packages and the checkout."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "setup.sh").write_text((ROOT / "scripts" / "setup.sh").read_text())
    for package in ("models", "probe", "analyses", "tasks"):
        (repo / package).symlink_to(ROOT / package)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "offline_probe")
    env = {**ENV, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": ""}
    done = subprocess.run(["bash", "scripts/setup.sh", "--offline", str(wheels)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"setup --offline: .venv ready (torch {torch.__version__})"
    check = subprocess.run([str(repo / ".venv" / "bin" / "python"), "-c",
                            "import torch, offline_probe, models; print(offline_probe.VALUE, models.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True,
                           env={k: v for k, v in env.items() if k != "PYTHONPATH"})  # the venv's own checkout
    assert check.returncode == 0, check.stderr
    assert check.stdout.split() == ["7", str(repo / "models" / "__init__.py")]

    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run(["bash", "scripts/setup.sh", "--offline", str(empty)], cwd=repo, env=env,
                             capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"setup --offline: no wheels in {empty} (scripts/wheelhouse.sh DIR makes them)"


def test_code_is_named_by_its_files_without_git(tmp_path):
    """A copied tree names its code as the checkout does; a changed file changes the name."""
    tree = _tree(tmp_path / "tree")
    assert code_hash(CODE["tests"], tree) == code_hash(CODE["tests"], ROOT)
    before = code_hash(CODE["bench"], tree)
    path = tree / "models" / "training" / "optimizer.py"
    path.write_text(path.read_text() + "\n# changed\n")
    assert code_hash(CODE["bench"], tree) != before and code_hash(CODE["tests"], tree) != code_hash(CODE["tests"], ROOT)
