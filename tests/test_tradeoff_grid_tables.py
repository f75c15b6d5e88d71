"""The trade-off grid's tables from rows written by hand: the 99% frontier, the attention
floor, the corners, the mean over seeds and the frontier's spread over seeds, and the text
the CLI prints. (Training the cells: tests/test_grid_stack.py, tests/test_capacity_transformer.py.)"""
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from analyses.tradeoff.grid import Grid, floor_between, frontier_of, grid_tables, grid_text, seed_means, seed_spread
from models.recall.config import ModelConfig, RunConfig

# the smallest m reaching 99% per (H, seed); None: no m does
FRONTIERS = {(1, 0): 8, (1, 1): 16, (1, 2): None, (2, 0): 4, (2, 1): 4, (2, 2): 8}
WIDTHS = (4, 8, 16)


def rows() -> list[dict]:
    """One row per cell and seed, as the grid's cells record them: accuracy 0.995 from the
    seed's frontier on, 0.5 below."""
    out = []
    for (h, s), frontier in FRONTIERS.items():
        for m in WIDTHS:
            best = 0.995 if frontier is not None and m >= frontier else 0.5
            out.append({"heads": h, "width": m, "seed": s, "lr": 0.01, "accuracy": best - 0.1,
                        "best_accuracy": best, "attention_parameters": 100 * h, "mlp_parameters": 10 * m,
                        "share_attention": h / 4, "share_mlp": m / 32, "share_both": 0.0,
                        "share_distributed": 0.0, "share_not_stored": 1 - h / 4 - m / 32})
    return out


GRID = Grid(heads=(1, 2), widths=WIDTHS, seeds=(0, 1, 2))


def test_the_frontier_is_the_smallest_width_reaching_99_percent_and_the_floor_lies_below_it():
    by_seed = pd.DataFrame(rows())
    assert frontier_of(by_seed[by_seed["seed"] == 0]) == {1: 8, 2: 4}
    assert frontier_of(by_seed[by_seed["seed"] == 2]) == {1: None, 2: 8}
    no_best = by_seed[by_seed["seed"] == 0].drop(columns="best_accuracy")  # the final accuracy: never 0.99 here
    assert frontier_of(no_best) == {1: None, 2: None}
    exactly = by_seed[by_seed["seed"] == 0].copy()
    exactly.loc[exactly["width"] == 4, "best_accuracy"] = 0.99
    assert frontier_of(exactly) == {1: 4, 2: 4}  # 0.99 itself reaches 99%
    assert frontier_of(pd.DataFrame({"heads": [1, 1], "width": [4, 8], "best_accuracy": [0.5, 0.99]})) == {1: 8}
    assert floor_between({1: None, 2: None, 4: 8, 8: 4}) == [2, 4]
    assert floor_between({1: 8, 2: 4}) == [None, 1]
    assert floor_between({1: None, 2: None}) == [2, None]
    assert floor_between({1: None, 2: 8, 4: None}) == [1, 2]  # a row above the floor that misses is not the floor


def test_the_mean_over_seeds_keeps_each_cell_s_range_and_seed_count():
    table = seed_means(pd.DataFrame(rows()))
    assert list(zip(table["heads"], table["width"])) == [(h, m) for h in (1, 2) for m in WIDTHS]
    cell = table.set_index(["heads", "width"]).loc[(1, 16)]
    assert cell["best_accuracy"] == pytest.approx((0.995 + 0.995 + 0.5) / 3)
    assert (cell["best_accuracy_min"], cell["best_accuracy_max"], cell["seeds"]) == (0.5, 0.995, 3)
    assert (cell["attention_parameters"], cell["mlp_parameters"]) == (100, 160)
    assert "lr" not in table and "seed" not in table
    backwards = seed_means(pd.DataFrame(rows()[::-1]))  # the cells in the order given, each with its own range
    assert list(zip(backwards["heads"], backwards["width"]))[:2] == [(2, 16), (2, 8)]
    assert backwards.set_index(["heads", "width"]).loc[(1, 16), "best_accuracy_min"] == 0.5


def test_the_frontier_spread_over_seeds_gives_the_smallest_median_and_largest_width():
    spread = seed_spread(pd.DataFrame(rows()))
    assert spread["frontier_by_seed"] == {0: {1: 8, 2: 4}, 1: {1: 16, 2: 4}, 2: {1: None, 2: 8}}
    assert spread["floor_by_seed"] == {0: [None, 1], 1: [None, 1], 2: [1, 2]}
    assert spread["frontier_spread"] == {1: {"seeds_reaching": 2, "min": 8, "median": 12.0, "max": 16},
                                         2: {"seeds_reaching": 3, "min": 4, "median": 4.0, "max": 8}}
    none_reach = seed_spread(pd.DataFrame([r for r in rows() if r["heads"] == 1 and r["seed"] == 2]))
    assert none_reach["frontier_spread"] == {1: {"seeds_reaching": 0, "min": None, "median": None, "max": None}}


def test_grid_tables_over_seeds_summarise_the_mean_grid_and_the_spread(tmp_path):
    result = grid_tables(rows(), GRID, RunConfig(), computed=5)
    summary = result.summary
    assert summary["frontier_min_width_at_99"] == {1: None, 2: 8}  # of the means: H=1 never all seeds
    assert summary["floor_between"] == [1, 2] and summary["frontier_accuracy"] == "best_accuracy"
    assert summary["corners"]["attention_heavy"]["heads"] == 2 and summary["corners"]["attention_heavy"]["width"] == 4
    assert summary["corners"]["mlp_heavy"]["heads"] == 1 and summary["corners"]["mlp_heavy"]["width"] == 16
    assert summary["cells"] == "6 of 6" and summary["cells_computed"] == 5
    assert summary["task"] == repr(RunConfig().task.build())
    assert set(result.tables) == {"grid.csv", "grid_by_seed.csv"} and len(result.tables["grid_by_seed.csv"]) == 18
    assert summary["frontier_spread"][1]["max"] == 16
    lines = grid_text(result, Path("OUT")).splitlines()
    assert lines[-4:] == ["smallest m at 99% per seed (min / median / max over the seeds reaching it):",
                          "  H=1: 8 / 12 / 16, 2 of 3 seeds", "  H=2: 4 / 4 / 8, 3 of 3 seeds",
                          "wrote OUT/ (5 new cells)"]
    lone = grid_text(grid_tables([r for r in rows() if r["heads"] == 1 and r["seed"] == 2],
                                 Grid(heads=(1,), widths=WIDTHS, seeds=(2,)), RunConfig(), 0), Path("OUT"))
    assert "  H=1: no seed reaches 99%" in lone


def test_grid_tables_of_one_seed_have_no_spread_and_name_a_missing_corner():
    one = [r for r in rows() if r["seed"] == 0 and (r["heads"], r["width"]) != (2, 4)]
    for r in one:
        del r["seed"]
    result = grid_tables(one, Grid(heads=(1, 2), widths=WIDTHS), RunConfig(), computed=0)
    assert set(result.tables) == {"grid.csv"} and "frontier_spread" not in result.summary
    assert result.summary["frontier_min_width_at_99"] == {1: 8, 2: 8}
    assert set(result.summary["corners"]) == {"mlp_heavy"} and result.summary["cells"] == "5 of 6"
    text = grid_text(result, Path("OUT"))
    assert "smallest m" not in text and text.splitlines()[0].split() == [
        "heads", "width", "accuracy", "best_accuracy", "share_attention", "share_mlp", "share_both",
        "share_distributed", "share_not_stored"]
    assert text.splitlines()[1].split() == ["1", "4", "0.400", "0.500", "0.250", "0.125", "0.000", "0.000", "0.625"]


def test_an_attention_only_grid_has_one_width_and_its_cells_are_named_by_h_and_m():
    attn = RunConfig(model=ModelConfig(attn_only=True))
    rows_ = [{**r, "width": None} for r in rows() if r["width"] == 4 and r["seed"] == 0]
    for r in rows_:
        del r["seed"]
    result = grid_tables(rows_, Grid(heads=(1, 2), widths=WIDTHS), attn, computed=2)
    assert list(result.tables["grid.csv"]["width"]) == [0, 0] and result.summary["cells"] == "2 of 2"
    assert result.tables["grid.csv"]["width"].dtype.kind == "i"  # m = 0, a whole number
    assert list(Grid(heads=(1, 2), widths=WIDTHS).runs(attn)) == ["H1_m0", "H2_m0"]
    seeded = Grid(heads=(2,), widths=(4, 8), seeds=(0, 3)).runs(RunConfig())
    assert list(seeded) == ["H2_m4_seed0", "H2_m4_seed3", "H2_m8_seed0", "H2_m8_seed3"]
    assert seeded["H2_m8_seed3"].train.seed == (3,) and seeded["H2_m8_seed3"].model.d_mlp == 8
    assert seeded["H2_m8_seed3"].model.n_heads == 2


# ------------------------------------------------------------------ the cells, trained by stand-ins
def fake_training(monkeypatch) -> list:
    """train_and_locate and train_and_locate_stack replaced by stand-ins that record each call
    and return the row of each cell (its H and m, whether it was stacked); the calls."""
    calls = []

    def row(run, stacked):
        return {"heads": run.model.n_heads, "width": run.model.d_mlp, "stacked": stacked}

    def alone(run, locating, checkpoint):
        calls.append(("alone", run.model.n_heads, run.model.d_mlp, checkpoint))
        return row(run, False)

    def stack(runs, keys, locating, checkpoints, state):
        assert state.parts[-2:] == ("state", f"stack_{keys[0]}")  # resumable where the sweep records
        calls.append(("stack", keys, checkpoints))
        return {key: row(run, True) for key, run in zip(keys, runs)}

    monkeypatch.setattr("analyses.tradeoff.grid.train_and_locate", alone)
    monkeypatch.setattr("analyses.tradeoff.grid.train_and_locate_stack", stack)
    return calls


def test_cells_alone_train_many_heads_first_and_come_back_in_the_grid_s_order(monkeypatch, tmp_path, capsys):
    from analyses.locate_facts import LocateSettings
    from analyses.sweeps.cells import Cells
    from analyses.sweeps.executors import ExecutorSettings, open_executor
    from analyses.tradeoff.grid import grid_rows

    calls = fake_training(monkeypatch)
    opened = []

    def executor(settings):  # the executor the cells run on, recorded
        opened.append(settings)
        return open_executor(ExecutorSettings())

    monkeypatch.setattr("analyses.tradeoff.grid.open_executor", executor)
    monkeypatch.setenv("FACTUAL_RECALL_PROGRESS", "1")
    grid = Grid(heads=(1, 4), widths=(2, 8), stack="auto")  # on a CPU: cell by cell
    cells = Cells(tmp_path, {"grid": 1}, keep_checkpoints=True)
    asked = ExecutorSettings(torch_threads=2)  # recorded by the stand-in, never opened
    run = RunConfig(train=replace(RunConfig().train, device="cpu"))
    rows = grid_rows(run, grid, LocateSettings(), cells, asked)
    assert [(r["heads"], r["width"], r["stacked"]) for r in rows] == [(1, 2, False), (1, 8, False), (4, 2, False),
                                                                      (4, 8, False)]
    assert all("seed" not in r for r in rows)  # one seed: no seed column
    assert [c[1:3] for c in calls] == [(4, 2), (4, 8), (1, 2), (1, 8)]
    assert [c[3] for c in calls] == [cells.checkpoint(k) for k in ("H4_m2", "H4_m8", "H1_m2", "H1_m8")]
    bar = capsys.readouterr().err  # shown by default
    assert "trade-off grid: 100%" in bar and "4/4 cells done" in bar
    assert opened == [asked]
    grid_rows(run, grid, LocateSettings(), cells, asked, progress=False, compute=False)
    assert opened[-1] == ExecutorSettings()  # recorded cells only: nothing to run elsewhere
    assert capsys.readouterr().err == ""  # progress=False: no bar


def test_stacked_cells_train_one_stack_per_h_of_the_cells_not_yet_recorded(monkeypatch, tmp_path):
    from analyses.locate_facts import LocateSettings
    from analyses.sweeps.cells import Cells
    from analyses.sweeps.executors import ExecutorSettings
    from analyses.tradeoff.grid import grid_rows

    calls = fake_training(monkeypatch)
    grid = Grid(heads=(1, 4), widths=(2, 8), stack="on", seeds=(5,))
    cells = Cells(tmp_path, {"grid": 1})
    cells.path("H1_m8_seed5").parent.mkdir(parents=True, exist_ok=True)
    cells.path("H1_m8_seed5").write_text('{"heads": 1, "width": 8, "seed": 5, "stacked": "recorded"}')
    rows = grid_rows(RunConfig(), grid, LocateSettings(), cells, ExecutorSettings(), progress=False)
    assert [(r["heads"], r["width"], r["seed"], r["stacked"]) for r in rows] == [
        (1, 2, 5, True), (1, 8, 5, "recorded"), (4, 2, 5, True), (4, 8, 5, True)]  # each row its seed
    assert calls == [("stack", ("H4_m2_seed5", "H4_m8_seed5"), (None, None)), ("stack", ("H1_m2_seed5",), (None,))]
    assert cells.computed == 3
    calls.clear()
    again = grid_rows(RunConfig(), grid, LocateSettings(), Cells(tmp_path, {"grid": 1}), ExecutorSettings(),
                      progress=False)
    assert again == rows and calls == []  # every cell recorded: read back, none trained
    (tmp_path / "cells" / "H4_m8_seed5.json").unlink()
    partial = grid_rows(RunConfig(), grid, LocateSettings(), Cells(tmp_path, {"grid": 1}), ExecutorSettings(),
                        progress=False, compute=False)
    assert [(r["heads"], r["width"]) for r in partial] == [(1, 2), (1, 8), (4, 2)] and calls == []
    three = Grid(heads=(1, 2, 4), widths=(2,), stack="on")
    grid_rows(RunConfig(), three, LocateSettings(), Cells(tmp_path / "three", {"grid": 3}), ExecutorSettings(),
              progress=False)
    assert [c[1] for c in calls] == [("H4_m2",), ("H2_m2",), ("H1_m2",)]  # one stack per H, its own cells


def test_a_grid_s_settings_stack_on_cuda_and_refuse_what_cannot_run(monkeypatch):
    monkeypatch.setattr("analyses.tradeoff.grid.resolve_device", torch.device)  # "cuda" without a GPU here
    cpu = RunConfig(train=replace(RunConfig().train, device="cpu"))
    cuda = RunConfig(train=replace(cpu.train, device="cuda"))
    assert [Grid(stack=s).stacked(cpu) for s in ("auto", "on", "off")] == [False, True, False]
    assert [Grid(stack=s).stacked(cuda) for s in ("auto", "on", "off")] == [True, True, False]
    assert Grid(heads=(1, 2), widths=(4,)).recorded(cpu) == {"heads": [1, 2], "widths": [4]}
    assert Grid(heads=(1,), widths=(4,), stack="on", seeds=(0,)).recorded(cpu) == {
        "heads": [1], "widths": [4], "stacked": True, "seeds": "per cell"}
    assert Grid(widths=(4, 8)).widths_of(RunConfig(model=ModelConfig(attn_only=True))) == (0,)
    models = Grid(heads=(2,), widths=(4, 8)).models(cpu)
    assert list(models) == [(2, 4), (2, 8)] and models[(2, 8)].d_mlp == 8 and models[(2, 8)].n_heads == 2
    with pytest.raises(ValueError, match="^--stack must be auto, on or off, got 'yes'.$"):
        Grid(stack="yes")
    with pytest.raises(ValueError, match="heads"):
        Grid(heads=(0,))
    with pytest.raises(ValueError, match="widths"):
        Grid(widths=(0,))
    with pytest.raises(ValueError):
        Grid(heads=(3,)).models(RunConfig(model=ModelConfig(d_model=16, d_head=None)))


def test_write_grid_writes_the_tables_the_summary_and_the_figure_of_the_frontier(tmp_path, monkeypatch):
    import json

    from analyses.tradeoff.grid import write_grid

    drawn = []
    monkeypatch.setattr("analyses.tradeoff.grid.grid_figure", lambda *args: drawn.append(args))
    result, run = grid_tables(rows(), GRID, RunConfig(), computed=0), RunConfig()
    write_grid(result, run, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.csv", "grid_by_seed.csv", "summary.json"]
    assert json.loads((tmp_path / "summary.json").read_text())["frontier_min_width_at_99"] == {"1": None, "2": 8}
    assert drawn == [(result.tables["grid.csv"], {1: None, 2: 8}, tmp_path / "grid.png", run)]


def test_each_cell_s_run_keeps_the_task_and_the_training_and_an_attention_only_model_its_own():
    attn = RunConfig(model=ModelConfig(attn_only=True, d_mlp=64))
    assert {k: m.d_mlp for k, m in Grid(heads=(2,), widths=(4, 8)).models(attn).items()} == {(2, 0): 64}
    small = RunConfig(task=replace(RunConfig().task, n_subjects=4), train=replace(RunConfig().train, steps=7))
    for grid in (Grid(heads=(2,), widths=(4,)), Grid(heads=(2,), widths=(4,), seeds=(1,))):
        (run,) = grid.runs(small).values()
        assert run.task == small.task and run.train.steps == 7 and run.model.n_heads == 2
