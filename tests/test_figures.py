"""Analyses write figures to files without touching matplotlib's global state."""
import subprocess
import sys


def test_importing_and_drawing_leave_the_backend_alone(tmp_path):
    """A notebook that imports an analysis and writes its figures still shows its own
    figures inline: the backend it chose is the one it keeps."""
    code = f"""
import matplotlib
matplotlib.use("svg")
import pandas as pd
from analyses.locate_facts import locate  # noqa: F401
from analyses import plots
plots.labels_per_relation(pd.DataFrame({{"relation": [0, 0, 1], "label": ["mlp", "attention", "mlp"]}}),
                          __import__("pathlib").Path({str(tmp_path)!r}) / "labels.png")
print(matplotlib.get_backend())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "svg"
    assert (tmp_path / "labels.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
