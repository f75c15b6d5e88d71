"""Analyses write figures to files without touching matplotlib's global state."""
import subprocess
import sys

import pandas as pd
import pytest


@pytest.mark.slow
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


def test_the_grid_figure_counts_parameters_as_grid_csv_and_draws_the_authors_line_in_them():
    """Axes labelled with the paper's counts (attention 4 H d_h d, MLP 2 m d) as in grid.csv;
    the authors' frontier d m = 2300 - d d_h H / 2 in those counts: 2 m d = 4600 - 4 H d_h d / 4."""
    from analyses.sweeps.output import subplots
    from analyses.tradeoff.figures import heat_map, paper_lines

    d, d_h = 32, 8
    table = pd.DataFrame([{"heads": h, "width": m, "accuracy": 1.0, "attention_parameters": 4 * h * d_h * d,
                           "mlp_parameters": 2 * m * d} for h in (4, 8) for m in (32, 64)])
    _, ax = subplots()
    heat_map(ax, table, "accuracy", "viridis", (0, 1))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["4 (4096)", "8 (8192)"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["32 (2048)", "64 (4096)"]
    paper_lines(ax, table)
    floor, frontier = ax.lines[0], ax.lines[1]
    assert floor.get_ydata()[0] == 0.25  # 1280 d d_h H, i.e. H = 5: a quarter of the way from row H = 4 to 8
    # at H = 4 the authors' MLP count d m = 2300 - 512 = 1788, m = 55.9: between the columns 32 and 64
    x, y = frontier.get_xdata(), frontier.get_ydata()
    assert x[0] == pytest.approx((1788 / d - 32) / 32) and y[0] == 0


def test_facts_figure_draws_every_line_its_legend_names_over_a_single_model_size(tmp_path, monkeypatch):
    """One --d and one shape: a single point; the paper's line and the information bound
    still span an interval of parameters, so each legend entry is drawn."""
    import numpy as np

    from analyses.capacity import figures
    from analyses.capacity.transformer import TransformerSweep

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.append(fig))
    table = pd.DataFrame([{"shape": "1, 1, 2", "parameters": 1200, "facts": 64}])
    figures.facts_figure(table, float("nan"), TransformerSweep(d=(8,)), tmp_path / "f.png")
    ax = drawn[0].axes[0]
    named = {line.get_label(): line for line in ax.get_lines()}
    for label, line in named.items():
        if label.startswith(("paper", "information bound")):
            x = np.asarray(line.get_xdata())
            assert x.min() < 1200 < x.max(), label
    assert any(k.startswith("paper") for k in named) and any(k.startswith("information bound") for k in named)


def test_plot_helpers_return_their_figure_and_write_it_only_when_given_a_path(tmp_path):
    """A notebook shows what a helper returns; the PNG is written only where a path is given."""
    from matplotlib.figure import Figure

    from analyses import plots

    facts = pd.DataFrame({"relation": [0, 0, 1], "label": ["mlp", "attention", "mlp"],
                          "attention_margin": [0.5, 2.0, -1.0], "mlp_margin": [3.0, 0.1, 2.5]})
    heads = pd.DataFrame([[0.9, 0.1], [0.2, 0.7]], columns=["S0", "R0"], index=pd.Index([0, 1], name="head"))
    drawn = {"labels": plots.labels_per_relation(facts), "margins": plots.margin_scatter(facts),
             "heads": plots.head_token_heatmap(heads)}
    assert all(isinstance(fig, Figure) for fig in drawn.values())
    assert list(tmp_path.iterdir()) == []
    bars = drawn["labels"].axes[0].patches
    assert sorted(bar.get_height() for bar in bars if bar.get_height() > 0) == [1, 1, 1]
    points = drawn["margins"].axes[0].collections
    assert sorted(len(p.get_offsets()) for p in points) == [1, 2]  # attention: 1 fact, mlp: 2
    assert drawn["heads"].axes[0].images[0].get_array().tolist() == [[0.9, 0.1], [0.2, 0.7]]
    saved = plots.margin_scatter(facts, tmp_path / "margins.png")
    assert isinstance(saved, Figure) and (tmp_path / "margins.png").read_bytes()[:4] == b"\x89PNG"


def test_the_hallucination_figures_show_the_step_0_snapshot_on_their_log_axis():
    """Snapshots start at step 0, which a log axis cannot place: the step axis is symmetric-log
    (linear from 0 to 1) and every curve starts at step 0."""
    from analyses import plots

    steps = [0, 1, 2, 4, 8, 16]
    metrics = pd.DataFrame({"step": steps, "loss": [3.0, 2.5, 2.1, 2.0, 1.0, 0.1],
                            "relation_only_loss": [3.0, 2.0, 0.1, 0.05, 0.05, 0.05],
                            "subject_only_loss": [3.0, 2.9, 2.5, 2.2, 1.0, 0.2],
                            "accuracy": [0.0, 0.1, 0.1, 0.2, 0.6, 1.0],
                            "hallucination_rate": [0.0, 0.5, 0.9, 0.9, 0.4, 0.0],
                            "attention_recall_share": [0.0, None, None, 0.5, None, 0.9]})
    summary = {"log_D": 2.0, "conditional_entropy": 2.0,
               "phase": {"start_step": 0, "end_step": 4}}
    for figure in (plots.hallucination_curves(metrics, summary), plots.storage_over_time(metrics, summary)):
        ax = figure.axes[0]
        assert ax.get_xscale() == "symlog" and "step-0 snapshot shows" in ax.get_xlabel() and ax.get_xlim()[0] == 0
        curves = [line for line in ax.lines if len(line.get_xdata()) > 2]
        assert curves and all(list(line.get_xdata())[0] == 0 for line in curves)
