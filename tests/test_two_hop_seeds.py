"""scripts/two_hop_seeds.py: the table of two-hop runs side by side (each run's last evaluation,
its held-out best and step, its seed from the folder's name) and the figure of their held-out
curves; the table of results/depth/two_hop/README.md is what its folders hold."""
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[1]
seeds = runpy.run_path(str(ROOT / "scripts" / "two_hop_seeds.py"), run_name="two_hop_seeds")
RESULTS = ROOT / "results" / "depth" / "two_hop"


def two_hop_folder(folder: Path, held_out: list[float], n_held_out: int = 51, baseline: float = 0.186) -> Path:
    """A folder as analyses.two_hop writes it: training.csv (every 100 steps) and summary.json."""
    folder.mkdir(parents=True)
    steps = [100 * i for i in range(len(held_out))]
    pd.DataFrame({"step": steps, "accuracy": 0.5, "one_hop": [0.25 + 0.125 * i for i in range(len(steps))],
                  "two_hop": 0.75, "held_out": held_out}).to_csv(folder / "training.csv", index=False)
    (folder / "summary.json").write_text(json.dumps({"held_out_compositions": n_held_out, "baselines": {
        "r2_commonest": baseline, "first_hop_skipped": 0.1, "bridge": 0.05}}))
    return folder


def test_each_run_shows_its_last_evaluation_its_earliest_best_and_the_seed_its_name_carries(tmp_path, capsys):
    a = two_hop_folder(tmp_path / "L2", [0.0625, 0.25, 0.5, 0.375])
    b = two_hop_folder(tmp_path / "L2-R8-seed12", [0.125, 0.5, 0.25, 0.5, 0.375], 205, 0.177)
    code, out, err = run_main(seeds["main"], [a, b], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "| run | seed | steps | one-hop facts | trained compositions | held-out, last | held-out, best (step) "
        "| no composing |", "| --- | --- | --- | --- | --- | --- | --- | --- |",
        "| L2 | 0 | 300 | 0.625 | 0.750 | 0.375 | 0.500 (200) | 0.186 |",
        "| L2-R8-seed12 | 12 | 400 | 0.750 | 0.750 | 0.375 | 0.500 (100) | 0.177 |"]


def test_the_figure_has_a_panel_per_number_of_held_out_compositions_with_its_runs(tmp_path, capsys):
    runs = [two_hop_folder(tmp_path / name, held, n) for name, held, n in
            (("L2", [0.1, 0.2], 51), ("L2-seed1", [0.1, 0.3], 51), ("L2-R8", [0.1, 0.4, 0.2], 205))]
    code, _, _ = run_main(seeds["main"], [*runs, "--figure", tmp_path / "curves.png"], capsys)
    assert code == 0 and (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = seeds["figure"]([seeds["run"](folder) for folder in runs], None)
    panels = [[line.get_label() for line in ax.get_lines()] for ax in fig.axes]
    assert panels == [["L2 (seed 0)", "L2-seed1 (seed 1)", "no composing"], ["L2-R8 (seed 0)", "no composing"]]


@pytest.mark.parametrize("files", [[], ["summary.json"], ["training.csv", "summary.json"]])
def test_a_folder_that_is_not_a_two_hop_run_with_held_out_compositions_is_refused(tmp_path, capsys, files):
    folder = two_hop_folder(tmp_path / "run", [0.1, 0.2])
    if files == ["training.csv", "summary.json"]:  # a run trained without held-out compositions
        (folder / "summary.json").write_text(json.dumps({"held_out_compositions": 0, "baselines": {}}))
    else:
        for name in {"training.csv", "summary.json"} - set(files):
            (folder / name).unlink()
    code, out, err = run_main(seeds["main"], [folder, "--figure", tmp_path / "curves.png"], capsys)
    assert (code, out) == (2, "") and re.fullmatch(rf"error: {re.escape(str(folder))}: .*\n", err)
    assert not (tmp_path / "curves.png").exists()


def readme_table() -> list[str]:
    """The table of the README's section "Seeds and longer runs"."""
    text = (RESULTS / "README.md").read_text()
    section = text[text.index("## Seeds and longer runs"):]
    end = section.find("\n## ", 1)  # the next section, if any
    section = section if end < 0 else section[:end]
    return [line for line in section.splitlines() if line.startswith("| ")]


def test_the_readme_table_is_what_the_result_folders_hold(capsys):
    shown = readme_table()
    runs = [line.split(" | ")[0].removeprefix("| ") for line in shown[2:]]
    assert {"L2-R8", "L2-R8-seed1", "L2-R8-seed2", "L2", "L2-seed1", "L2-seed2"} <= set(runs)
    code, out, _ = run_main(seeds["main"], [RESULTS / run for run in runs], capsys)
    assert code == 0 and out.splitlines() == shown


@pytest.mark.slow
def test_the_script_refuses_a_missing_folder_in_one_line_as_a_process(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "two_hop_seeds.py"), str(tmp_path / "none")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("error: ") \
        and len(done.stderr.splitlines()) == 1
