"""`python -m analyses.capacity zipf | oscillation | overoptimisation`: bad input refused in
one line, the sweep written, resumed and grown, its plan, its tables against the talk's laws."""
import json

import pandas as pd
import pytest

from analyses.capacity.zipf.laws import ZipfSweep, cell_cost, zipf_row
from analyses.capacity.zipf.report import ZipfResult, fit_table, zipf_tables, zipf_text
from tests.test_capacity_memory import _cli  # `python -m analyses.capacity ARGV` in this process

SMALL = ["--alpha", "0.8,2", "--tokens", "40", "--samples", "10,100,1000", "--d", "16,32,64",
         "--seeds", "0,1,2", "--device", "cpu", "--quiet"]


@pytest.mark.parametrize("flags, message", [
    (["--tokens", "0"], "--tokens must be >= 1, got 0."),
    (["--d", "16,0"], "--d must be >= 1, got 16,0."),
    (["--threshold", "0"], "--threshold must be >= 1, got 0."),
    (["--outputs", "1"], "--outputs must be >= 2, got 1."),
    (["--samples", "0,10"], "--samples must be >= 1, got 0,10."),
    (["--alpha", "-1"], "--alpha must be >= 0, got -1.0."),
    (["--schemes", "counts,often"], "--schemes must be among counts, seen, threshold, gd, sgd, adam"),
    (["--stored-per-d", "0"], "--stored-per-d must be > 0, got 0.0."),
    (["--adam-betas", "0.9"], "--adam-betas must be two values in [0, 1), got 0.9."),
    (["--population", "--schemes", "sgd"], "--population builds memories from p"),
    (["--population", "--threshold", "2"], "--population builds memories from p"),
])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(flags, message, tmp_path, capsys):
    code, out, err = _cli(["zipf", "--out", str(tmp_path / "out"), *flags], capsys)
    assert code == 2 and err.startswith("error: " + message) and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["oscillation", "--correlations", "1"], "--correlations must be in (-1, 1), got 1.0."),
    (["oscillation", "--first-frequency", "1"], "--first-frequency must be in (0, 1), got 1.0."),
    (["oscillation", "--step-sizes", "0"], "--step-sizes must be > 0, got 0.0."),
    (["overoptimisation", "--tokens", "1"], "--tokens must be >= 2, got 1."),
    (["overoptimisation", "--steps", "0"], "--steps must be >= 1, got 0."),
])
def test_the_step_studies_refuse_bad_input_in_one_line(argv, message, tmp_path, capsys):
    code, _, err = _cli([*argv, "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and err == f"error: {message}\n" and not (tmp_path / "out").exists()


def test_the_sweep_writes_its_tables_resumes_and_grows(tmp_path, capsys):
    out = tmp_path / "zipf"
    code, text, _ = _cli(["zipf", *SMALL, "--out", str(out)], capsys)
    assert code == 0 and "(18 new cells)" in text and "α=2 counts" in text
    for name in ("errors.csv", "fits.csv", "profiles.csv", "summary.json", "error_vs_n.png", "error_vs_d.png",
                 "q_profiles.png"):
        assert (out / name).is_file(), name
    errors = pd.read_csv(out / "errors.csv")
    assert len(errors) == 2 * 3 * 3 * 3 * 3  # α, scheme, d, seed, n
    assert errors["error"].between(0, 1 + 1e-12).all()
    first = (out / "cells" / "alpha2_counts_d16.json").read_text()
    code, text, _ = _cli(["zipf", *SMALL, "--out", str(out)], capsys)
    assert code == 0 and "(0 new cells)" in text  # resumed: nothing recomputed
    grown = [("16,32,64,128" if v == "16,32,64" else v) for v in SMALL]
    code, text, _ = _cli(["zipf", *grown, "--out", str(out)], capsys)
    assert code == 0 and "(6 new cells)" in text  # a new d: its cells only
    assert (out / "cells" / "alpha2_counts_d16.json").read_text() == first
    code, _, err = _cli(["zipf", *SMALL, "--outputs", "3", "--out", str(out)], capsys)
    assert code == 2 and "holds a sweep with other settings" in err and "outputs: recorded 5, now 3" in err


def test_the_plan_prints_the_cost_and_writes_nothing(tmp_path, capsys):
    code, text, _ = _cli(["zipf", *SMALL, "--schemes", "counts,sgd", "--plan", "--out", str(tmp_path / "p")], capsys)
    assert code == 0 and "plan: 12 cells (0 recorded)" in text and "sgd       6 cells" in text
    assert "G multiply-adds, about" in text and not (tmp_path / "p").exists()
    sweep = ZipfSweep(alpha=(2.0,), tokens=40, samples=(10, 100), d=(16, 64), schemes=("counts", "sgd"), seeds=(0, 1))
    assert cell_cost(sweep, "sgd", 16) > cell_cost(sweep, "counts", 16)
    assert cell_cost(sweep, "counts", 64) > cell_cost(sweep, "counts", 16) + 40 ** 3  # the read-back where d >= N


def test_a_row_holds_every_seed_and_size_and_the_threshold_s_it_chose():
    sweep = ZipfSweep(alpha=(2.0,), tokens=30, samples=(50, 500), d=(16,), schemes=("threshold",), seeds=(0, 1))
    row = zipf_row(sweep, 2.0, "threshold", 16, "cpu")
    assert row["n"] == [50, 500] and len(row["errors"]) == 2 and len(row["errors"][0]) == 2
    assert all(stored <= sweep.budget(16) for seed in row["stored"] for stored in seed)  # d/8 = 2 tokens at most
    assert all(s >= 1 for seed in row["s"] for s in seed) and row["s"][0][1] > row["s"][0][0]  # s grows with n
    assert row["q_profile"] is None  # d < N: q is not identifiable
    fixed = zipf_row(ZipfSweep(**{**sweep.__dict__, "threshold": 3}), 2.0, "threshold", 16, "cpu")
    assert fixed["s"] == [[3, 3], [3, 3]]


def test_the_population_memories_and_their_d_laws(tmp_path):
    """Against d at n = ∞: the threshold scheme's exponent is near -(α-1) and counts' near
    -(α-1)/(2α), each inside a loose band around the talk's law."""
    sweep = ZipfSweep(alpha=(2.0,), tokens=400, population=True, d=(16, 32, 64, 128, 256), seeds=(0, 1, 2, 3),
                      schemes=("counts", "threshold"))
    rows = [zipf_row(sweep, 2.0, scheme, d, "cpu") for scheme in sweep.schemes for d in sweep.d]
    assert all(r["n"] == [None] for r in rows)
    result = zipf_tables(rows, sweep, {})
    fits = result.fits.set_index("scheme")
    assert fits.loc["threshold", "theory"] == -1.0 and abs(fits.loc["threshold", "exponent"] + 1.0) < 0.25
    assert fits.loc["threshold", "top_tokens"] == pytest.approx(fits.loc["threshold", "exponent"], abs=0.15)
    assert pd.isna(fits.loc["counts", "top_tokens"])
    assert fits.loc["counts", "theory"] == -0.25 and abs(fits.loc["counts", "exponent"] + 0.25) < 0.15
    assert (result.errors["n"] == float("inf")).all() and set(fits["axis"]) == {"d"}


def test_fits_beside_the_talk_s_laws_and_none_drawn_for_alpha_at_most_one():
    errors = pd.DataFrame([{"alpha": a, "scheme": s, "d": d, "seed": k, "n": n, "error": (n ** -0.5) * (1 + k / 10)}
                           for a in (0.8, 2.0) for s in ("seen", "counts") for d in (64,) for k in range(3)
                           for n in (10, 100, 1000)])
    fits = fit_table(errors, ZipfSweep()).set_index(["alpha", "scheme"])
    assert fits.loc[(2.0, "seen"), "exponent"] == pytest.approx(-0.5) and fits.loc[(2.0, "seen"), "theory"] == -0.5
    assert fits.loc[(2.0, "seen"), "infinite_memory"] < 0
    assert fits.loc[(0.8, "seen"), "theory"] is None or pd.isna(fits.loc[(0.8, "seen"), "theory"])
    assert fits.loc[(0.8, "seen"), "law"] == "none drawn: the laws need α > 1"
    two = errors[errors["n"] < 1000]  # two points: undetermined, no number
    fits = fit_table(two, ZipfSweep())
    text = zipf_text(ZipfResult(two, fits, pd.DataFrame(), {"q_exponents": []}))
    assert "α=2 seen      undetermined: no seed has 3 points with an error > 0 [-0.50]" in text
    assert fits["exponent"].isna().all()
    assert (fits["text"] == "undetermined: no seed has 3 points with an error > 0").all()


def test_the_step_studies_write_their_curves(tmp_path, capsys):
    out = tmp_path / "osc"
    code, text, _ = _cli(["oscillation", "--correlations", "0,0.95", "--step-sizes", "1,10", "--steps", "80",
                          "--device", "cpu", "--quiet", "--out", str(out)], capsys)
    assert code == 0 and "c=0.95  η=10    first perfect at step 2, perfect from 15" in text
    table = pd.read_csv(out / "oscillation.csv")
    assert table.set_index(["correlation", "step_size"]).loc[(0.95, 1.0), "perfect_from"] == 52
    assert (out / "oscillation.png").is_file() and len(pd.read_csv(out / "curves.csv")) == 2 * 2 * 60
    out = tmp_path / "over"
    code, text, _ = _cli(["overoptimisation", "--tokens", "10", "--seeds", "0,1,2,3", "--steps", "100",
                          "--device", "cpu", "--quiet", "--out", str(out)], capsys)
    assert code == 0 and "N=10" in text
    table = pd.read_csv(out / "overoptimisation.csv")
    assert (table["best_possible"] <= table["best_over_training"] + 1e-12).all()
    assert (table["best_over_training"] <= table["final_error"] + 1e-12).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["analysis"] == "capacity overoptimisation" and (out / "overoptimisation.png").is_file()


def test_at_large_d_seen_once_recalls_every_token_seen_and_counts_does_not():
    """At d >> N the seen-once memory recalls every token the sample holds, and its error is
    the probability of the others it guesses wrong (right about 1 time in M); the counts
    memory, asked for where seen-once was, loses rare seen tokens under the frequent ones."""
    from analyses.capacity.zipf import memory as mem
    from analyses.capacity.zipf.laws import build_memory

    sweep = ZipfSweep(alpha=(1.5,), tokens=20, samples=(5, 40), d=(1024,), seeds=(0, 1), schemes=("seen", "counts"))
    data = mem.draw(1.5, 20, 5, 40, 1024, [0, 1])
    counts = mem.prefix_counts(data.samples, [5, 40], 20)
    wrong = {s: mem.recall_wrong(build_memory(sweep, s, data, counts, 1024).scores(data.E, data.U), data.answers)
             for s in ("seen", "counts")}
    assert not wrong["seen"][counts > 0].any() and wrong["counts"][counts > 0].any()
    row = zipf_row(sweep, 1.5, "seen", 1024, "cpu")
    assert row["errors"] == (wrong["seen"].double() * data.p).sum(-1).tolist()
    assert row["errors"][0][0] < float(((counts == 0).double() * data.p).sum(-1)[0, 0])  # some unseen guessed right
