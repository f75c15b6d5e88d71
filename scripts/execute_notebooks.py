"""Execute the notebooks top to bottom, as they are (small by default), and save them with
their outputs, so their figures and attention views show when the repository is browsed.

    .venv/bin/python scripts/execute_notebooks.py                 # every notebook in notebooks/
    .venv/bin/python scripts/execute_notebooks.py notebooks/04_attention_patterns.ipynb

The kernel runs in a temporary directory and imports this checkout's code; a failing cell
stops the script and saves nothing for that notebook.
"""
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def execute(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as cwd:
        NotebookClient(notebook, timeout=900, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": cwd}}).execute()
    nbformat.write(notebook, path)
    print(f"{path}: {path.stat().st_size / 1000:.0f} kB")


if __name__ == "__main__":
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONWARNINGS"] = "ignore:IProgress not found"  # tqdm's, without ipywidgets: not the notebooks'
    for name in sys.argv[1:] or sorted((ROOT / "notebooks").glob("*.ipynb")):
        execute(Path(name))
