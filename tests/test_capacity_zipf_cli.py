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
    (["--tokens", "0"], "--tokens must be >= 2, got 0."),
    (["--tokens", "1"], "--tokens must be >= 2, got 1."),  # one token: no law, its figure had no curve
    (["--alpha", "inf"], "--alpha must be finite and >= 0, got inf."),
    (["--samples", "1000,10"], "--samples 10,1000: the exponent against n needs 3 values or more"),
    (["--d", "64,16"], "--d 16,64: the exponent against d needs 3 values or more"),
    (["--d", "16,0"], "--d must be >= 1, got 16,0."),
    (["--threshold", "0"], "--threshold must be >= 1, got 0."),
    (["--outputs", "1"], "--outputs must be >= 2, got 1."),
    (["--samples", "0,10"], "--samples must be >= 1, got 0,10."),
    (["--alpha", "-1"], "--alpha must be finite and >= 0, got -1.0."),
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
    (["oscillation", "--step-sizes", "0"], "--step-sizes must be finite and > 0, got 0.0."),
    (["oscillation", "--step-sizes", "1,inf"], "--step-sizes must be finite and > 0, got 1.0,inf."),
    (["overoptimisation", "--alpha", "inf"], "--alpha must be finite and >= 0, got inf."),
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


def test_sizes_that_cannot_fit_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """The largest cell's estimated memory against what the machine has: refused in one line,
    `--plan` too, before a byte is drawn or written (here 1 MiB available, the cell ~100 MiB)."""
    import models.training.memory

    monkeypatch.setattr(models.training.memory, "available_bytes", lambda device: 2 ** 20)
    for plan in ([], ["--plan"]):
        code, _, err = _cli(["zipf", "--alpha", "2", "--tokens", "4000", "--samples", "10,100,1000", "--d", "512",
                             "--seeds", "0", "--schemes", "counts", "--device", "cpu", "--quiet", *plan,
                             "--out", str(tmp_path / "out")], capsys)
        assert code == 2 and err.startswith("error: the cell alpha2_counts_d512 needs an estimated ")
        assert "(embeddings " in err and "more than the 0.0 GiB available" in err and len(err.splitlines()) == 1
        assert not (tmp_path / "out").exists()


def test_the_memory_estimate_holds_what_a_cell_allocates():
    """The estimate is at least the tensors a chunk of seeds holds at once: E [K, N, d] drawn
    seed by seed and stacked, Adam's S snapshots of W [K, d, d] and their stack, and where d >= N
    only the read-back's (E E^T)^+ [K, N, N]; on a GPU the draw is on the host."""
    import torch

    from analyses.capacity.zipf.laws import cell_bytes, check_fits

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    sweep = ZipfSweep(tokens=1000, samples=(10, 100, 1000), seeds=(0, 1), schemes=("counts", "adam"))
    K, N, S, d = 2, 1000, 3, 512
    assert sum(cell_bytes(sweep, "counts", d, cpu)[cpu].values()) >= 2 * 4 * K * N * d
    assert cell_bytes(sweep, "adam", d, cpu)[cpu]["adam"] >= 2 * 4 * K * S * d * d
    assert "read-back" not in cell_bytes(sweep, "counts", d, cpu)[cpu]
    assert cell_bytes(sweep, "counts", 1024, cpu)[cpu]["read-back"] >= 8 * K * N * N
    gpu = cell_bytes(sweep, "counts", d, cuda)
    assert set(gpu) == {cpu, cuda} and gpu[cpu]["embeddings"] >= 2 * 4 * K * N * d
    one = ZipfSweep(alpha=(2.0,), tokens=N, samples=(10, 100, 1000), d=(d,), seeds=(0, 1), schemes=("counts",))
    device_part = sum(cell_bytes(one, "counts", d, cuda)[cuda].values())  # above the host's here
    check_fits(one, cuda, available=device_part)  # no GPU is asked: `available` stands for each place
    with pytest.raises(ValueError, match=r"^the cell alpha2_counts_d512 needs an estimated .* on cuda \(embeddings"):
        check_fits(one, cuda, available=device_part - 1)


PEAK = """import sys, threading, torch
from analyses.capacity.zipf.laws import ZipfSweep, cell_bytes, zipf_row

def anonymous():  # resident anonymous memory (bytes): the libraries' pages, which the kernel may drop, left out
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("RssAnon"))

sweep = ZipfSweep(alpha=(2.0,), tokens=int(sys.argv[1]), samples=(10, 100, 1000), seeds=(0, 1, 2),
                  schemes=(sys.argv[2],))
d, done = int(sys.argv[3]), threading.Event()
torch.zeros(1)
before = peak = anonymous()
def watch():
    global peak
    while not done.wait(0.001):
        peak = max(peak, anonymous())
watcher = threading.Thread(target=watch)
watcher.start()
zipf_row(sweep, 2.0, sys.argv[2], d, "cpu")
done.set()
watcher.join()
print(peak - before, sum(cell_bytes(sweep, sys.argv[2], d, torch.device("cpu"))[torch.device("cpu")].values()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("tokens, scheme, d", [(20000, "counts", 1024), (1000, "counts", 2048), (100, "adam", 1024)])
def test_the_memory_estimate_against_the_peak_a_cell_reaches(tokens, scheme, d):
    """The peak resident memory a cell adds (a fresh process) is at most the estimate, and the
    estimate at most 2.5 times it: measured 1.0-1.6 times across embeddings, read-back, Adam."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PEAK, str(tokens), scheme, str(d)], capture_output=True, text=True,
                          check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    grown, estimate = map(int, done.stdout.split())
    assert grown <= estimate <= 2.5 * grown


def test_the_plan_never_computes_a_cell_it_estimates_too_large(tmp_path, capsys, monkeypatch):
    from analyses.capacity.zipf import cli as zipf_cli

    timed = []
    monkeypatch.setattr(zipf_cli, "PROBE_BYTES", 2 ** 22)  # 4 MiB: one seed at d = 512 (~20 MiB) too large
    monkeypatch.setattr(zipf_cli, "zipf_row", lambda sweep, alpha, scheme, d, device: timed.append(d))
    code, text, _ = _cli(["zipf", "--alpha", "2", "--tokens", "2000", "--samples", "10,100,1000", "--d", "16,64,512",
                          "--schemes", "counts", "--seeds", "0,1", "--device", "cpu", "--plan",
                          "--out", str(tmp_path / "p")], capsys)
    assert code == 0 and timed and max(timed) < 512 and "one seed of alpha2_counts_d64" in text
    assert "memory: at most an estimated " in text and not (tmp_path / "p").exists()


def test_one_size_per_axis_is_no_fit_yet_writes_its_tables(tmp_path, capsys):
    """The population at one d: no exponent to fit (said), the tables and summary written."""
    out = tmp_path / "pop"
    code, text, _ = _cli(["zipf", "--alpha", "2", "--tokens", "40", "--population", "--d", "16", "--seeds", "0,1",
                          "--device", "cpu", "--quiet", "--out", str(out)], capsys)
    assert code == 0 and text.startswith("no exponent: each needs 3 sizes or more along its axis")
    assert pd.read_csv(out / "errors.csv")["n"].eq(float("inf")).all() and len(pd.read_csv(out / "errors.csv")) == 6
    assert json.loads((out / "summary.json").read_text())["fits"] == []


def test_a_law_with_no_error_left_draws_no_line_and_samples_are_recorded_increasing(tmp_path, capsys):
    """At α = 2000 p(z) underflows beyond the first token: every error and the infinite-memory
    curve are 0, the figure is drawn without a law line; --samples given out of order are
    recorded increasing, so the same sizes in order resume the sweep."""
    out = tmp_path / "steep"
    argv = ["zipf", "--alpha", "2000", "--tokens", "40", "--d", "16", "--seeds", "0,1", "--schemes", "seen",
            "--device", "cpu", "--quiet", "--out", str(out)]
    code, text, _ = _cli([*argv, "--samples", "100,10,1000"], capsys)
    assert code == 0 and (out / "error_vs_n.png").is_file() and "α=2000 seen" in text
    assert (pd.read_csv(out / "errors.csv")["error"] == 0).all()
    assert json.loads((out / "settings.json").read_text())["samples"] == [10, 100, 1000]
    code, text, _ = _cli([*argv, "--samples", "10,100,1000"], capsys)
    assert code == 0 and "(0 new cells)" in text


@pytest.mark.parametrize("command, words", [("zipf", "Hutter's n^-(α-1)/α"), ("oscillation", "oscillates"),
                                            ("overoptimisation", "under-parameterised")])
def test_each_study_describes_what_it_measures(command, words, capsys):
    code, text, _ = _cli([command, "--help"], capsys)
    description = " ".join(text.split("options:")[0].split("\n\n", 1)[1].split())
    assert code == 0 and words in description and len(description.split()) > 30


def test_counts_and_exponents_are_written_for_people():
    """'loss rose 1 time', never '1 times'; γ of a flat q is '0.00', never '-0.00'."""
    from analyses.capacity.zipf.fits import Exponent
    from analyses.capacity.zipf.steps import steps_text

    table = pd.DataFrame([{"correlation": 0.75, "step_size": s, "first_perfect": 2, "perfect_from": 2,
                           "loss_rises": rises, "final_loss": 0.1} for s, rises in ((10.0, 1), (1.0, 0))])
    assert steps_text("oscillation", table).splitlines() == [
        "  c=0.75  η=10    first perfect at step 2, perfect from 2, loss rose 1 time",
        "  c=0.75  η=1     first perfect at step 2, perfect from 2, loss rose 0 times"]
    flat = {"alpha": 2.0, "scheme": "seen", "d": 64, "exponent": -1e-17, "note": ""}
    text = zipf_text(ZipfResult(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), {"q_exponents": [flat]}))
    assert text == "  q(z) ∝ z^γ held by seen (α=2, d=64): γ = 0.00"
    assert Exponent(-0.001, 0.02, 3).text() == "0.00 ± 0.02"


def test_the_recorded_overoptimisation_table_has_every_row_it_printed():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "results" / "capacity" / "zipf"
    readme = (root / "README.md").read_text()
    for r in pd.read_csv(root / "overoptimisation" / "overoptimisation.csv").itertuples():
        assert f"| {r.tokens} | {r.step_size:g} | {r.final_error:.3f} | {r.best_over_training:.3f} |" in readme
