"""The one-command GPU run (scripts/gpu_run.sh) as a dry run at tiny sizes on the CPU: its
outputs, a kill in the middle of its sweep and the resume from the archive it left; and the
offline set-up (scripts/setup.sh --offline) from a folder of wheels."""
import hashlib
import math
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHON": sys.executable, "GPU_RUN_JOBS": "1", "GPU_RUN_PACK_SECONDS": "1"}
ALLOWED = {"report.txt", "tests_cuda.txt", "bench.txt", "gpu_checks.json", "grid.png", "fig4_left.png",
           "fig4_left.csv", "state.tar.gz"}


def _archive(path: Path) -> dict[str, str]:
    """Every file of a state archive: its name and the sha256 of its bytes ({} while unreadable)."""
    try:
        with tarfile.open(path) as tar:
            return {m.name: hashlib.sha256(tar.extractfile(m).read()).hexdigest() for m in tar if m.isfile()}
    except (OSError, tarfile.TarError, EOFError):
        return {}


PIECES = ["d11", "alpha1", "alpha1_large", "alpha2", "alpha2_large", "2e16_d11"]  # the dry run's, in order


def _cells(files: dict, piece: str = "") -> dict:
    return {name: digest for name, digest in files.items() if name.startswith(f"./fig4_left/{piece}")
            and "/cells/" in name}


def _cut_piece(files: dict) -> str | None:
    """A piece that has recorded a probe but not finished, once the first piece has finished."""
    if "./done/fig4_left_d11" not in files:
        return None
    return next((p for p in PIECES[1:] if _cells(files, _dir(p) + "/") and f"./done/fig4_left_{p}" not in files
                 and f"./done/fig4_left_{PIECES[PIECES.index(p) - 1]}" in files), None)


def _dir(piece: str) -> str:
    return piece.removesuffix("_large")


def test_a_killed_gpu_run_resumes_from_its_archive(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    run = subprocess.Popen(["bash", "scripts/gpu_run.sh", "--dry-run", str(first)], cwd=ROOT, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, files, cut = time.monotonic() + 600, {}, None
    try:  # kill the whole run (as a time limit would) in the middle of a piece after the first
        while time.monotonic() < deadline and run.poll() is None:
            files = _archive(first / "state.tar.gz")
            cut = _cut_piece(files)
            if cut:
                break
            time.sleep(0.3)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert cut, "no piece after the first was cut in the middle"
    killed = _archive(first / "state.tar.gz")  # the last whole archive the killed run left
    assert "./done/grid" in killed and "./done/fig4_left_d11" in killed and f"./done/fig4_left_{cut}" not in killed
    report = (first / "report.txt").read_text()
    started = [report.find(f"fig4_left_{p}:") for p in PIECES[:PIECES.index(cut)]]
    assert -1 not in started and started == sorted(started)  # the largest sizes first
    bench = (first / "bench.txt").read_text()  # the profiler's tables, and each line's utilisation in the report
    assert bench.count("top 10 kernels by self_cpu_time_total") == 3 and "== stack-fused: not profiled on cpu" in bench
    utilisation = [line for line in (first / "report.txt").read_text().splitlines() if "model_flop_utilisation" in line]
    assert [line.split()[1] for line in utilisation] == ["ours", "config-a", "tiny-k64", "stack-vocab"]

    done = subprocess.run(["bash", "scripts/gpu_run.sh", "--dry-run", str(second), str(first / "state.tar.gz")],
                          cwd=ROOT, env={**ENV, "GPU_RUN_SECONDS": "600"}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (second / "report.txt").read_text()
    for step in ("env", "tests", "bench", "grid", "fig4_left_d11"):
        assert f"{step}: done in an earlier call" in report
    assert f"fig4_left_{cut}: exit 0" in report
    resumed = _archive(second / "state.tar.gz")
    assert {name: resumed.get(name) for name in _cells(killed)} == _cells(killed)  # kept, not recomputed
    assert len(_cells(resumed, _dir(cut) + "/")) >= len(_cells(killed, _dir(cut) + "/"))
    assert all(f"./done/fig4_left_{p}" in resumed for p in PIECES)
    order = [report.find(f"fig4_left_{p}:") for p in PIECES]
    assert -1 not in order and order == sorted(order)

    outputs = {p.name for p in second.iterdir()}
    assert outputs <= ALLOWED and {"report.txt", "state.tar.gz", "grid.png", "fig4_left.csv"} <= outputs
    assert all(p.is_file() and p.stat().st_size <= 16 * 2**20 for p in second.iterdir())
    capacity = pd.read_csv(second / "fig4_left.csv")  # every piece's sizes: (1,1,2) at 11, 8; (2,2,2) at 8, 11
    assert sorted(zip(capacity["shape"], capacity["d"])) == [("1,1,2", 8), ("1,1,2", 11), ("2,2,2", 8), ("2,2,2", 11)]
    assert capacity["S_star"].ge(2).all()
    lead = capacity[capacity["piece"] == "d11"]
    assert len(lead) == 1 and (lead["stored_by"] == 2).all()  # stored by both seeds
    assert "passed" in (second / "tests_cuda.txt").read_text()


def _resume_for_figure_4_left(tmp_path: Path, budget: int) -> tuple[float, list[str], dict]:
    """gpu_run --dry-run resumed from an archive whose steps before Figure 4 left are done,
    with GPU_RUN_SECONDS=`budget`, into a fresh OUT: its wall seconds, its report (checked to
    be what its last pack holds) and its archive's files."""
    earlier = tmp_path / "earlier"
    if not earlier.exists():
        (earlier / "done").mkdir(parents=True)
        for step in ("env", "tests", "bench", "grid"):
            (earlier / "done" / step).write_text("exit 0, 1 s\n")
        (earlier / "report.txt").write_text("an earlier call\n")
        with tarfile.open(tmp_path / "state.tar.gz", "w:gz") as tar:
            tar.add(earlier, arcname=".")
    out = tmp_path / f"out{budget}"
    t0 = time.monotonic()
    done = subprocess.run(["bash", "scripts/gpu_run.sh", "--dry-run", str(out), str(tmp_path / "state.tar.gz")],
                          cwd=ROOT, env={**ENV, "GPU_RUN_SECONDS": str(budget)}, capture_output=True, text=True,
                          timeout=300)
    seconds = time.monotonic() - t0
    assert done.returncode == 0, done.stdout + done.stderr
    report = (out / "report.txt").read_text().splitlines()
    assert report[0] == "an earlier call" and report[-1].startswith("gpu_run: ")
    with tarfile.open(out / "state.tar.gz") as tar:  # the last pack holds the whole report
        assert tar.extractfile("./report.txt").read().decode().splitlines() == report
    assert {p.name for p in out.iterdir()} <= ALLOWED
    return seconds, report, _archive(out / "state.tar.gz")


def _pieces_left(report: list[str]) -> int:
    said = [re.fullmatch(r"fig4_left: (\d+) of \d+ pieces left for the next call", line) for line in report]
    return next(int(m[1]) for m in said if m)


def test_a_gpu_run_out_of_time_leaves_the_pieces_and_ends_within_its_budget(tmp_path):
    """Resumed with the steps before Figure 4 left done. With too little time for any piece (a
    piece keeps 10 s after its search, the pack 5 s), no piece starts a process, one line names
    the pieces left, and the report and archive are packed within the budget. With time for
    the first piece (that call's own start-up, measured, plus the 15 s it keeps and 10 s), the
    first starts, the time it takes counts against the rest, which are left for the next call,
    and the call still ends within its budget and a few seconds."""
    budget = 12
    seconds, report, packed = _resume_for_figure_4_left(tmp_path, budget)
    assert seconds < budget + 8, f"{seconds:.0f} s for a budget of {budget} s"
    assert _pieces_left(report) == len(PIECES)
    assert not [line for line in report if line.startswith("fig4_left_")]
    assert not [name for name in packed if name.startswith("./fig4_left")]  # no search, no table

    budget = math.ceil(seconds) + 25  # a call without pieces took `seconds`
    seconds, report, packed = _resume_for_figure_4_left(tmp_path, budget)
    assert seconds < budget + 8, f"{seconds:.0f} s for a budget of {budget} s"
    started = [line.split(":")[0] for line in report if re.match(r"fig4_left_\w+: exit", line)]
    assert started[:1] == ["fig4_left_d11"], report  # the first piece had its time
    assert len(PIECES) - len(started) <= _pieces_left(report) <= len(PIECES) and len(started) < len(PIECES)
    assert [name for name in packed if name.startswith("./fig4_left/d11/")]  # its search's cells are kept


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
    check = subprocess.run([str(repo / ".venv" / "bin" / "python"), "-c",
                            "import torch, offline_probe, models; print(offline_probe.VALUE, models.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert check.stdout.split() == ["7", str(repo / "models" / "__init__.py")]

    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run(["bash", "scripts/setup.sh", "--offline", str(empty)], cwd=repo, env=env,
                             capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"setup --offline: no wheels in {empty} (scripts/wheelhouse.sh DIR makes them)"
