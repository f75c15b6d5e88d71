"""The one-command GPU run (scripts/gpu_run.sh) as a dry run at tiny sizes on the CPU: its
outputs, a kill in the middle of its sweep and the resume from the archive it left; and the
offline set-up (scripts/setup.sh --offline) from a folder of wheels."""
import hashlib
import os
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


def _cells(files: dict) -> dict:
    return {name: digest for name, digest in files.items() if name.startswith("./fig4_left/cells/")}


def test_a_killed_gpu_run_resumes_from_its_archive(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    run = subprocess.Popen(["bash", "scripts/gpu_run.sh", "--dry-run", str(first)], cwd=ROOT, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, files = time.monotonic() + 400, {}
    try:  # kill the whole run (as a time limit would) once the sweep has recorded a probe
        while time.monotonic() < deadline and run.poll() is None:
            files = _archive(first / "state.tar.gz")
            if _cells(files) and "./done/fig4_left" not in files:
                break
            time.sleep(0.3)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert _cells(files), "the sweep recorded no probe before the run ended"
    killed = _archive(first / "state.tar.gz")  # the last whole archive the killed run left
    assert "./done/grid" in killed and "./done/fig4_left" not in killed
    bench = (first / "bench.txt").read_text()  # the profiler's tables, and each line's utilisation in the report
    assert bench.count("top 10 kernels by self_cpu_time_total") == 3 and "== stack-fused: not profiled on cpu" in bench
    utilisation = [line for line in (first / "report.txt").read_text().splitlines() if "model_flop_utilisation" in line]
    assert [line.split()[1] for line in utilisation] == ["ours", "config-a", "tiny-k64", "stack-vocab"]

    done = subprocess.run(["bash", "scripts/gpu_run.sh", "--dry-run", str(second), str(first / "state.tar.gz")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (second / "report.txt").read_text()
    for step in ("env", "tests", "bench", "grid"):
        assert f"{step}: done in an earlier call" in report
    assert "fig4_left: exit 0" in report
    resumed = _archive(second / "state.tar.gz")
    assert {name: resumed.get(name) for name in _cells(killed)} == _cells(killed)  # kept, not recomputed
    assert len(_cells(resumed)) > len(_cells(killed)) and "./done/fig4_left" in resumed

    outputs = {p.name for p in second.iterdir()}
    assert outputs <= ALLOWED and {"report.txt", "state.tar.gz", "grid.png", "fig4_left.csv"} <= outputs
    assert all(p.is_file() and p.stat().st_size <= 16 * 2**20 for p in second.iterdir())
    capacity = pd.read_csv(second / "fig4_left.csv")
    assert len(capacity) == 4 and capacity["S_star"].ge(2).all()  # 2 shapes x 2 sizes, each storing facts
    assert (capacity["stored_by"] == 2).all()  # by both seeds
    assert "passed" in (second / "tests_cuda.txt").read_text()


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
