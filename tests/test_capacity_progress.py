"""`python -m analyses.capacity plan --done`: the GPU's science finished in the committed results
(Figure 4 left at the full protocol, its pieces; Figure 4 right's grid) and the next gpu_run
call, in model-steps and minutes at the measured rates; and the protocol's pieces."""
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analyses.capacity.plan import default_oracle, plan
from analyses.capacity.progress import GRID_CELLS, _Own, progress
from analyses.capacity.protocol import IMPORTED, fits, pieces, protocol_folder
from analyses.sweeps.gpu_records import BENCH_LINES, CODE, code_hash, record
from models.recall.config import shape_model
from tests.test_capacity_memory import _cli

ROOT = Path(__file__).resolve().parents[1]
RATES = {"capacity-d128": {"model_steps_per_second": 6000},
         "stack-169": {"steps_per_second": {"vocab": 40.0, "fused": 10.0}, "models": 169, "device": "a test GPU"}}


def piece(name):
    return {p.name: p for p in pieces()}[name]


def piece_sweep(piece, results):
    """The piece's TransformerSweep, its flags read by the CLI (as `plan --done` reads them)."""
    from analyses.capacity.cli import _transformer_sweep, parser

    return _transformer_sweep(parser().parse_args(piece.argv(results, "cpu")))


@pytest.fixture
def results(tmp_path) -> Path:
    """A results folder with the measured rates, the imported d = 128 search and nothing done."""
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "measured.json").write_text(json.dumps(RATES))
    shutil.copytree(protocol_folder(ROOT / "results") / f"{IMPORTED}h100_d128",
                    protocol_folder(tmp_path) / f"{IMPORTED}h100_d128")
    return tmp_path


def test_plan_done_counts_the_recorded_probes_and_says_what_the_next_call_does(results, capsys):
    lead = piece("d90")
    sweep = piece_sweep(lead, results)
    folder = protocol_folder(results) / lead.folder
    probes, _ = plan(sweep, _Own(()))
    first = probes.iloc[:5]  # the first round's sizes, one seed each: recorded as a GPU would
    (folder / "cells").mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(sweep.recorded()))
    for r in first.itertuples():
        (folder / "cells" / f"shape{r.shape}_d{r.d}_S{r.S}_seed{int(r.seed)}.json").write_text(
            json.dumps({"accuracy": 1.0, "steps_run": 1000}))
    grid = results / "tradeoff" / "paper_grid_gpu" / "cells"
    grid.mkdir(parents=True)
    for i in range(2):
        (grid / f"H32_m{i}_seed0.json").write_text(json.dumps({"steps_run": 512}))
    record(results / "gpu" / "passed.json", "tests", {"code": code_hash(CODE["tests"])})

    done = {p.name: p for p in progress(results, lambda piece: piece_sweep(piece, results))}
    assert (done["grid"].done, done["grid"].probes, done["grid"].model_steps_left) == (2, GRID_CELLS,
                                                                                      (GRID_CELLS - 2) * 512)
    assert done["grid"].rate == 40.0 * 169  # the stack line's faster core
    d90 = done["d90"]
    assert (d90.done, d90.model_steps_done, d90.finished) == (5, 5 * 1000 * 3, False)  # three learning rates
    assert d90.model_steps_left > 0 and d90.minutes_left == pytest.approx(d90.model_steps_left / 6000 / 60)
    assert "a GPU record: (1,1,8) d=128" in done["d128"].note and not done["d90"].note
    parts = [p for p in done.values() if p.name.startswith("alpha4")]  # a row's parts share its sizes once
    large = piece_sweep(piece("alpha4_large"), results)
    oracle = _Own(default_oracle(large).folders + (protocol_folder(results) / f"{IMPORTED}h100_d128",))
    assert sum(p.probes for p in parts) == len(plan(large, oracle)[0])

    (results / "gpu" / "done").mkdir()
    (results / "gpu" / "done" / "fig4_left_d90").write_text("finished\n")
    code, out, _ = _cli(["plan", "--done", "--results", str(results)], capsys)
    assert code == 0
    assert re.search(r"^  d90 +5 of \d+ +15,000 +0 +finished$", out, re.M)
    assert re.search(r"^  grid +2 of 507 ", out, re.M)
    assert "1 of 20 pieces finished" in out and "a test GPU" in out
    assert "tests subset" in out  # the tests passed in full at this code
    assert f"bench lines whose code changed: {', '.join(BENCH_LINES)}" in out
    # less than 240 s for the science: the pieces first (d90 is finished), the grid waits for a longer call
    assert re.search(r"science: ~189 s\n +d181: all of it \(~\d+ s of ~189 s left\)\n +d128: cut, to go on in the "
                     r"next call \(~\d+ s of ~\d+ s left\)\n$", out)


def test_plan_done_without_measured_rates_says_so_in_one_line(tmp_path, capsys):
    code, _, err = _cli(["plan", "--done", "--results", str(tmp_path)], capsys)
    assert code == 2 and err.strip() == (f"error: {tmp_path}/gpu/measured.json: no measured rates (capacity-d128 "
                                         "and stack-169) to project the minutes from.")


def test_every_piece_s_shapes_have_a_size_among_its_d():
    """A shape with no model at any of a piece's sizes would stop the piece's search at once
    (alpha = 0.25 has none below d = 32): the protocol leaves it out; `fits` is shape_model's rule."""
    for shape in ("0.25,4,8", "0.5,0.25,8", "4,4,8", "1,1,8,64"):
        for d in (8, 11, 16, 22, 32, 45, 64, 90, 128, 181):
            try:
                model = shape_model(*map(float, shape.split(",")[:3]), d)
                fitting = d <= float(shape.split(",")[3]) if shape.count(",") == 3 else True
            except ValueError:
                model, fitting = None, False
            assert fits(shape, d) == (model is not None and fitting), (shape, d)
    for q in pieces():
        d = [int(x) for x in q.flags[q.flags.index("--d") + 1].split(",")]
        assert all(any(fits(s, size) for size in d) for s in q.shapes), q.name
    assert "alpha0.25" not in [q.name for q in pieces()] and "alpha0.25_mid" in [q.name for q in pieces()]
    assert [q.name for q in pieces()][:3] == ["d90", "d181", "d128"]  # the imported size last


def test_the_progress_knows_the_bench_lines_and_the_grid_gpu_run_runs():
    script = (ROOT / "scripts" / "gpu_run.sh").read_text()
    assert f"bench_lines=({' '.join(BENCH_LINES)})" in script
    heads, widths, seeds = re.search(r"grid=\(--heads ([\d,]+) --widths ([\d,]+) --seeds ([\d,]+)", script).groups()
    assert len(heads.split(",")) * len(widths.split(",")) * len(seeds.split(",")) == GRID_CELLS


def test_the_combined_table_takes_an_imported_size_only_where_no_piece_searched_it(results):
    from analyses.capacity.protocol import write_combined

    folder = protocol_folder(results)
    (folder / "d90").mkdir()
    (folder / "d90" / "capacity.csv").write_text('shape,d,S_star,facts,parameters,facts_per_parameter\n'
                                                 '"1,1,8",90,60,3600,48600,0.074\n')
    table = write_combined(results)
    assert sorted(zip(table["piece"], table["d"])) == [("d90", 90), (f"{IMPORTED}h100_d128", 128)]
    assert (folder / "fig4_left.csv").is_file() and (folder / "fig4_left.png").is_file()
    (folder / "d128").mkdir()
    (folder / "d128" / "capacity.csv").write_text('shape,d,S_star,facts,parameters,facts_per_parameter\n'
                                                  '"1,1,8",128,77,5929,98304,0.060\n')
    assert sorted(zip(write_combined(results)["piece"], write_combined(results)["S_star"])) == [("d128", 77),
                                                                                                ("d90", 60)]


def test_a_piece_s_tables_with_combine_also_write_every_piece_s_sizes(results, capsys):
    """scripts/gpu_run.sh's one process a piece: the piece's tables (--recorded-only), then with
    --combine RESULTS the combined table and figure of every piece so far."""
    folder = protocol_folder(results)
    (folder / "d181").mkdir(parents=True)
    (folder / "d181" / "capacity.csv").write_text('shape,d,S_star,facts,parameters,facts_per_parameter\n'
                                                  '"1,1,8",181,90,8100,196542,0.041\n')
    code, out, _ = _cli([*piece("d90").argv(results, "cpu"), "--recorded-only", "--quiet"], capsys)
    assert code == 0 and "(0 new training runs)" in out and not (folder / "fig4_left.csv").exists()
    code, out, _ = _cli([*piece("d128").argv(results, "cpu"), "--recorded-only", "--quiet", "--combine", str(results)],
                        capsys)
    assert code == 0 and "(0 new training runs)" in out and (folder / "fig4_left.png").is_file()
    table = pd.read_csv(folder / "fig4_left.csv")
    assert sorted(zip(table["piece"], table["d"])) == [("d181", 181), (f"{IMPORTED}h100_d128", 128)]
