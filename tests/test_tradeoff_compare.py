"""`analyses.tradeoff compare`: two recorded grids side by side."""
import json

import pandas as pd
import pytest

from analyses.tradeoff.compare import floor_between

SHARES = ("attention", "mlp", "both", "distributed", "not_stored")


def write_grid(path, accuracy: dict, parameterisation: str, mlp_share: float, analysis: str = "tradeoff grid"):
    """A grid's record as the sweep writes it: grid.csv (cells (H, m) -> best accuracy, the
    facts not stored the rest, the stored ones split attention / MLP) and settings.json."""
    rows = [{"heads": h, "width": m, "accuracy": a, "best_accuracy": a, "steps_run": 100 if a >= 0.99 else 1000,
             "attention_parameters": 4 * 32 * 8 * h, "mlp_parameters": 2 * 32 * m,
             "share_attention": a * (1 - mlp_share), "share_mlp": a * mlp_share, "share_both": 0.0,
             "share_distributed": 0.0, "share_not_stored": 1 - a} for (h, m), a in accuracy.items()]
    path.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path / "grid.csv", index=False)
    model = {"d_model": 32, "d_head": 8}  # the standard parameterisation left out, as ModelConfig.recorded does
    model.update({} if parameterisation == "standard" else {"parameterisation": parameterisation})
    (path / "settings.json").write_text(json.dumps({"analysis": analysis, "run": {"model": model}}))


# H = 1 never reaches 99%; A reaches it from H = 2 at m = 8, B only from H = 4
A = {(1, 1): 0.2, (1, 8): 0.5, (2, 1): 0.9, (2, 8): 0.995, (4, 1): 0.999, (4, 8): 1.0}
B = {(1, 1): 0.1, (1, 8): 0.4, (2, 1): 0.8, (2, 8): 0.95, (4, 1): 0.97, (4, 8): 0.995}


def _cli(argv, capsys):
    from analyses.tradeoff import main
    from models.cli import run_cli

    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(["compare", *argv]))
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def test_each_grids_frontier_floor_and_shares_side_by_side(tmp_path, capsys):
    write_grid(tmp_path / "standard", A, "standard", mlp_share=0.25)
    write_grid(tmp_path / "authors", {k: v for k, v in B.items() if k != (1, 1)}, "authors", mlp_share=0.75)
    code, out, _ = _cli([str(tmp_path / "standard"), str(tmp_path / "authors"), "--out", str(tmp_path / "cmp")],
                        capsys)
    assert code == 0 and "5 cells in both grids" in out
    assert "settings that differ: run.model.parameterisation (standard / authors)" in out and "None" not in out
    frontier = pd.read_csv(tmp_path / "cmp" / "frontier.csv")
    assert frontier["heads"].tolist() == [1, 2, 4]
    assert frontier["standard"].fillna(0).tolist() == [0, 8, 1] and frontier["authors"].fillna(0).tolist() == [0, 0, 8]
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert summary["grids"] == ["standard", "authors"] and summary["cells_compared"] == 5
    assert summary["setting_differences"] == {"run.model.parameterisation": ["standard", "authors"]}
    standard, authors = summary["per_grid"]["standard"], summary["per_grid"]["authors"]
    assert standard["floor_between"] == [1, 2] and authors["floor_between"] == [2, 4]
    assert standard["cells_at_99"] == 3 and authors["cells_at_99"] == 1
    common = [k for k in A if k != (1, 1)]  # the cell only one grid records is left out of every mean
    assert standard["mean_shares"]["share_mlp"] == pytest.approx(sum(0.25 * A[k] for k in common) / 5)
    assert authors["mean_shares_at_99"]["share_mlp"] == pytest.approx(0.75 * 0.995)
    cells = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert sorted(cells["grid"].unique()) == ["authors", "standard"] and len(cells) == 10
    assert (tmp_path / "cmp" / "compare.png").is_file()


def test_the_floor_is_read_from_the_frontier():
    assert floor_between({1: None, 2: None, 4: 64, 8: 8}) == [2, 4]
    assert floor_between({1: 8, 2: 8}) == [None, 1]  # no floor within the grid
    assert floor_between({1: None, 2: None}) == [2, None]  # no H reaches 99%
    assert floor_between({1: None, 2: 8, 4: None, 8: 1}) == [1, 2]  # a failing row above the floor is not it


@pytest.mark.parametrize("make, problem", [
    (lambda p: None, "holds no recorded grid: grid.csv is missing"),
    (lambda p: write_grid(p, A, "standard", 0.5, analysis="tradeoff swap"), "is not a trade-off grid"),
    (lambda p: write_grid(p, {(8, 8): 1.0}, "standard", 0.5), "have no cell (H, m) in common"),
])
def test_bad_grids_are_refused_in_one_line(tmp_path, capsys, make, problem):
    write_grid(tmp_path / "a", A, "standard", 0.5)
    make(tmp_path / "b")
    code, _, err = _cli([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")], capsys)
    assert code == 2 and problem in err and err.count("\n") == 1
    assert not (tmp_path / "cmp").exists()


def test_two_grids_of_one_name_are_told_apart_by_their_paths(tmp_path, capsys):
    write_grid(tmp_path / "x" / "grid", A, "standard", 0.5)
    write_grid(tmp_path / "y" / "grid", B, "authors", 0.5)
    code, out, _ = _cli([str(tmp_path / "x" / "grid"), str(tmp_path / "y" / "grid"), "--out", str(tmp_path / "c")],
                        capsys)
    assert code == 0
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["grids"] == [
        str(tmp_path / "x" / "grid"), str(tmp_path / "y" / "grid")]
    code, _, err = _cli([str(tmp_path / "x" / "grid"), str(tmp_path / "y" / "grid"), "--labels", "a,a",
                         "--out", str(tmp_path / "d")], capsys)
    assert code == 2 and "argument --labels: a given twice in 'a,a'" in err  # the rule of every list flag


def _drawn(monkeypatch, module):
    """The figures `module` saves, kept instead of written: a list filled as they are drawn."""
    figures = []
    monkeypatch.setattr(module, "save_figure", lambda fig, path: figures.append(fig))
    return figures


def test_compare_figure_writes_only_the_frontier_cells_on_a_scale_fitted_to_the_differences(tmp_path, monkeypatch):
    import analyses.tradeoff.compare as compare

    write_grid(tmp_path / "standard", A, "standard", mlp_share=0.25)
    write_grid(tmp_path / "authors", {k: v for k, v in B.items() if k != (1, 1)}, "authors", mlp_share=0.75)
    a, b = compare.read_grid(tmp_path / "standard", "standard"), compare.read_grid(tmp_path / "authors", "authors")
    figures = _drawn(monkeypatch, compare)
    compare.compare_figure(compare.compare_grids(a, b), a, tmp_path / "compare.png")
    panels = [ax for ax in figures[0].axes if ax.images]
    assert len(panels) == 4
    # the frontiers: standard (2, 8), (4, 1); authors (4, 8); of the 5 cells in both, these 3 are written
    accuracy = [float(t.get_text()) for t in panels[0].texts]
    assert sorted(accuracy) == pytest.approx(sorted([B[2, 8] - A[2, 8], B[4, 1] - A[4, 1], B[4, 8] - A[4, 8]]),
                                             abs=0.005)
    assert all(len(ax.texts) == 3 for ax in panels)
    # the largest difference: the share in attention at (4, 8), 0.25 x 0.995 - 0.75 x 1.0 = -0.50
    assert all(ax.images[0].get_clim() == pytest.approx((-0.55, 0.55)) for ax in panels)


def test_grid_figure_writes_only_the_frontier_cells(tmp_path, monkeypatch):
    import analyses.tradeoff.figures as figures_module

    write_grid(tmp_path / "g", A, "standard", mlp_share=0.25)
    table = pd.read_csv(tmp_path / "g" / "grid.csv")
    figures = _drawn(monkeypatch, figures_module)
    figures_module.grid_figure(table, {1: None, 2: 8, 4: 1}, tmp_path / "grid.png")
    panels = [ax for ax in figures[0].axes if ax.images]
    # the frontier cells (2, 8) and (4, 1): accuracy 0.995 and 0.999, shares in attention 0.75 of them
    written = [sorted(float(t.get_text()) for t in ax.texts) for ax in panels[:2]]
    assert written == [pytest.approx([0.995, 0.999], abs=0.006), pytest.approx([0.746, 0.749], abs=0.006)]
    assert all(len(ax.texts) == 2 for ax in panels)
