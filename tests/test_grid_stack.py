"""Stacked cells: the engine records a stack's parts as cells of their own, and the trade-off
grid with --stack on trains each H's cells as one padded stack with the rows, files and
resumes of the grid run cell by cell."""
import json
import shutil

import pandas as pd
import pytest

from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import LocalExecutor
from tests.test_sweep import GRID, _tradeoff


# ------------------------------------------------------------------ the engine
def squares(ns: tuple[int, ...], keys: tuple[str, ...]) -> dict:
    return {key: {"n": n, "square": n * n} for key, n in zip(keys, ns)}


def test_a_stack_s_parts_are_recorded_as_cells_and_read_back_as_its_rows(tmp_path):
    keys = ("n2", "n3", "n5")
    stack = Cell("stack", squares, ((2, 3, 5), keys), parts=keys)
    jobs = [one(stack), one(Cell("n7", squares, ((7,), ("n7",)), parts=("n7",)))]
    cells = Cells(tmp_path, {"sweep": "squares"})
    first = run_jobs(jobs, cells, LocalExecutor(), progress=False)
    assert first[0] == ({"n": 2, "square": 4}, {"n": 3, "square": 9}, {"n": 5, "square": 25})
    assert cells.computed == 4 and not cells.path("stack").exists()
    assert json.loads(cells.path("n3").read_text()) == {"n": 3, "square": 9}
    again = Cells(tmp_path, {"sweep": "squares"})
    assert run_jobs([one(stack)], again, LocalExecutor(), progress=False) == [first[0]]
    assert again.computed == 0  # every part recorded: nothing recomputed
    cells.path("n5").unlink()
    assert run_jobs([one(stack)], again, LocalExecutor(), progress=False, compute=False) == [None]


# ------------------------------------------------------------------ the grid
@pytest.fixture(scope="module")
def grids(tmp_path_factory):
    """The tiny grid cell by cell (--stack auto on a CPU) and stacked: their --out."""
    from analyses.tradeoff import main

    outs = {}
    for stack in ("auto", "on"):
        outs[stack] = tmp_path_factory.mktemp(stack)
        with pytest.MonkeyPatch.context() as patch:
            if stack == "on":  # no cell of a stacked grid trains alone
                patch.setattr("analyses.tradeoff.grid.train_and_locate", None)
            assert main([*GRID, "--stack", stack, "--out", str(outs[stack])]) == 0
    return outs


def test_a_stacked_grid_has_the_rows_of_the_grid_run_cell_by_cell(grids):
    alone, stacked = (pd.read_csv(grids[s] / "grid.csv") for s in ("auto", "on"))
    exact = ["heads", "width", "lr", "steps_run", "attention_parameters", "mlp_parameters"]
    pd.testing.assert_frame_equal(stacked[exact], alone[exact])
    for column in ("accuracy", "best_accuracy", "located_accuracy"):  # equal up to float rounding
        assert (stacked[column] - alone[column]).abs().max() <= 0.02, column
    assert sorted(p.name for p in (grids["on"] / "cells").iterdir()) == [
        "H1_m32.json", "H1_m4.json", "H2_m32.json", "H2_m4.json"]
    settings = {s: json.loads((grids[s] / "settings.json").read_text()) for s in grids}
    assert settings["on"] == {**settings["auto"], "stacked": True}  # cell by cell: as before stacks existed


def test_a_stacked_grid_resumes_its_missing_cells_and_refuses_another_stack_setting(grids, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(grids["on"], out)
    (out / "cells" / "H2_m32.json").unlink()
    kept = {p.name: p.read_bytes() for p in (out / "cells").iterdir()}
    code, stdout, err = _tradeoff([*GRID, "--stack", "off", "--out", str(out)], capsys)
    assert code == 2 and "differing: stacked" in err and err.count("\n") == 1, err
    code, stdout, err = _tradeoff([*GRID, "--stack", "on", "--out", str(out)], capsys)
    assert code == 0 and "(1 new cell)" in stdout, err
    assert all((out / "cells" / name).read_bytes() == data for name, data in kept.items())
    assert len(pd.read_csv(out / "grid.csv")) == 4


def test_a_finished_grid_grows_by_an_h_or_a_width_and_refuses_other_settings(grids, tmp_path, capsys):
    """A grid recorded with H in 1,2 and m in 4,32: `--heads 3` trains only the new row (H = 3
    at every recorded m), then `--widths 8` the new column; the tables cover every cell, the
    recorded cells stay as they were, and a grid of other training settings is still refused."""
    out = tmp_path / "out"
    shutil.copytree(grids["auto"], out)
    kept = {p.name: p.read_bytes() for p in (out / "cells").iterdir()}
    small = [w for w in GRID if w not in ("--heads", "1,2", "--widths", "4,32")]
    code, stdout, err = _tradeoff([*small, "--heads", "3", "--out", str(out)], capsys)
    assert code == 0 and "(2 new cells)" in stdout, err
    code, stdout, err = _tradeoff([*small, "--widths", "8", "--out", str(out)], capsys)
    assert code == 0 and "(3 new cells)" in stdout, err
    grid = pd.read_csv(out / "grid.csv")
    assert sorted(zip(grid["heads"], grid["width"])) == [(h, m) for h in (1, 2, 3) for m in (4, 8, 32)]
    assert all((out / "cells" / name).read_bytes() == data for name, data in kept.items())
    settings = json.loads((out / "settings.json").read_text())
    assert (settings["heads"], settings["widths"]) == ([1, 2, 3], [4, 8, 32])
    code, stdout, err = _tradeoff([*small, "--out", str(out)], capsys)  # as recorded: resumes, trains nothing
    assert code == 0 and "(0 new cells)" in stdout and len(pd.read_csv(out / "grid.csv")) == 9, err
    code, _, err = _tradeoff([*small, "--heads", "4", "--lr", "0.5", "--out", str(out)], capsys)
    assert code == 2 and "differing: run.train.lr" in err and "heads" not in err and err.count("\n") == 1, err
    assert json.loads((out / "settings.json").read_text()) == settings and not (out / "cells" / "H4_m4.json").exists()


def test_a_bad_stack_value_is_refused_in_one_line(tmp_path, capsys):
    code, _, err = _tradeoff([*GRID, "--stack", "sometimes", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "--stack must be auto, on or off" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
