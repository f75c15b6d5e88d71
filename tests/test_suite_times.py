"""FACTUAL_RECALL_TEST_TIMES records what each test cost, and scripts/test_times.py sums it."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_phase_of_each_test_is_recorded_and_summed(tmp_path):
    """A test that spends CPU in a subprocess: its three phases are lines of the file, the
    child's CPU counted in its call; the Triton marks' hook of the conftest still runs."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_spend.py").write_text(textwrap.dedent("""
        import subprocess, sys

        import pytest, torch

        def test_spends_in_a_child():
            spend = "import time\\nwhile time.process_time() < 0.4: pass"  # 0.4 s of CPU on any machine
            subprocess.run([sys.executable, "-c", spend], check=True)

        def test_spends_nothing():
            pass

        @pytest.mark.triton(device=torch.device("cuda"))  # no GPU here: the conftest's hook skips it
        def test_on_a_gpu():
            raise AssertionError("ran without a GPU")
    """))
    times = tmp_path / "times.tsv"
    env = {**os.environ, "FACTUAL_RECALL_TEST_TIMES": str(times), "PYTHONPATH": str(ROOT)}
    plugins = ("cacheprovider", "xdist", "hypothesispytest", "anyio", "jaxtyping", "typeguard")  # pyproject.toml's
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", *(f for p in plugins for f in ("-p", f"no:{p}")),
                          str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "2 passed, 1 skipped" in run.stdout, run.stdout + run.stderr
    rows = [line.split("\t") for line in times.read_text().splitlines() if "on_a_gpu" not in line]
    assert [(r[0].split("::")[1], r[1]) for r in rows] == [
        (name, phase) for name in ("test_spends_in_a_child", "test_spends_nothing")
        for phase in ("setup", "call", "teardown")]
    child = {r[1]: float(r[4]) for r in rows if r[0].endswith("in_a_child")}
    assert child["call"] > 0.3 and child["setup"] < 0.05
    summed = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_times.py"), str(times), "--top", "1"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert summed[0].startswith("3 tests: ") and summed[1].endswith("test_spend.py::test_spends_in_a_child")
