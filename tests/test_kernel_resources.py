"""The toolkit's Triton kernels compile for a GPU (an H100, sm_90) on a machine without one,
with no spills and no global atomic adds (bench/kernel_resources.py): what Triton's
interpreter, which runs a kernel's Python, cannot show."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import triton_installed

ROOT = Path(__file__).resolve().parents[1]


def _nvidia_tools() -> bool:
    spec = importlib.util.find_spec("triton")
    return spec is not None and (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists()


@pytest.mark.slow
@pytest.mark.skipif(not triton_installed(), reason="needs Triton (pip install -e .[kernels])")
def test_every_kernel_compiles_for_an_h100_without_spills_global_atomics_or_barriers_in_its_loop():
    """A barrier inside a loop stops every warp of a program once per iteration: the tables'
    kernel that built [prompts, positions, entries] one-hots had 68 in its loop and ran at
    about a fifteenth of the attention's other kernels' rate on an H100. Triton's wheel
    ships its NVIDIA backend's tools: where Triton is installed this test runs."""
    assert _nvidia_tools(), "Triton is installed without its NVIDIA backend's tools (backends/nvidia/bin)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "bench/kernel_resources.py", "--arch", "90"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()[1:]
    assert [line.split("  ")[0] for line in lines] == ["fused forward", "fused backward", "fused tables",
                                                       "counter prompts"]
    for line in lines:
        assert ", 0 B spilled," in line and line.endswith(", 0 global atomic instructions"), line
        assert " with 0 barriers)," in line, line
