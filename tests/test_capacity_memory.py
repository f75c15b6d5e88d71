"""Associative memories and their capacity sweep (`analyses.capacity memory`), the CLI, the
paper's line and the authors' recipe script."""
import json
import runpy
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from models.recall.memories import (
    MemoryConfig,
    fit,
    memory_data,
    memory_logits,
    one_step_memory,
    recall_accuracy,
)


def _cli(argv, capsys):
    """Run `python -m analyses.capacity ARGV` in-process: (exit code, stdout, stderr)."""
    from analyses.capacity import main
    from models.cli import run_cli

    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(argv))
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def test_memory_sweep_rerun_skips_recorded_probes(tmp_path, capsys):
    argv = ["memory", "--kind", "mlp", "--d", "8", "--m", "2", "--seeds", "0", "--steps", "100",
            "--device", "cpu", "--quiet", "--out", str(tmp_path)]
    assert _cli(argv, capsys)[0] == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["probes_computed"] > 0 and "fitted_slope" in summary
    assert {"capacity.csv", "probes.csv", "capacity_mlp.png"} <= {p.name for p in tmp_path.iterdir()}
    assert _cli(argv, capsys)[0] == 0
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["probes_computed"] == 0 and again["sizes"] == summary["sizes"]
    code, _, err = _cli(argv[:-2] + ["--lr", "0.05", "--out", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and "other settings" in err


def test_memory_seeds_are_a_comma_list_and_recorded_sweeps_resume(tmp_path, capsys):
    """--seeds names the seeds, as in every other sweep (it was once a count): a sweep
    recorded when it was a count (results/capacity/linear, `--seeds 3`) resumes with
    --seeds 0,1,2 and trains nothing; --seeds 1 searches seed 1 alone."""
    recorded = Path(__file__).resolve().parents[1] / "results" / "capacity" / "linear"
    out = tmp_path / "linear"
    shutil.copytree(recorded, out)
    argv = ["memory", "--kind", "linear", "--d", "8,16,32,64", "--seeds", "0,1,2", "--steps", "2000",
            "--device", "cpu", "--quiet", "--out", str(out)]
    assert _cli(argv, capsys)[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["probes_computed"] == 0 and summary["seeds"] == [0, 1, 2]
    assert pd.read_csv(out / "capacity.csv").equals(pd.read_csv(recorded / "capacity.csv"))

    one = tmp_path / "one"
    argv = ["memory", "--kind", "mlp", "--d", "4", "--m", "2", "--seeds", "1", "--steps", "20",
            "--device", "cpu", "--quiet", "--out", str(one)]
    assert _cli(argv, capsys)[0] == 0
    assert {path.name.split("_seed")[1].split("_")[0] for path in (one / "cells").iterdir()} == {"1"}


def test_memory_sweep_sizes_from_m_per_d_with_fixed_outputs(tmp_path, capsys):
    """--m-per-d 1,2 gives widths m = d, 2d; --outputs M fixes the outputs (Figure 6), and the
    report compares N* with the paper's line N = m d / 1.2."""
    argv = ["memory", "--kind", "mlp", "--d", "4", "--m-per-d", "1,2", "--outputs", "4", "--seeds", "0",
            "--steps", "60", "--device", "cpu", "--quiet", "--out", str(tmp_path)]
    code, out, _ = _cli(argv, capsys)
    assert code == 0 and "N = m·d/1.2" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["d"], s["m"]) for s in summary["sizes"]] == [(4, 4), (4, 8)]
    assert summary["authors_line"]["law"] == "N = m·d/1.2" and summary["settings"]["n_outputs"] == 4
    for s in summary["sizes"]:
        assert s["n_line"] == pytest.approx(s["m"] * s["d"] / 1.2)
        assert s["n_star_over_line"] == pytest.approx(s["n_star_mean"] / s["n_line"])
    code, _, err = _cli(argv[:-2] + ["--m", "8", "--out", str(tmp_path / "both")], capsys)
    assert code == 2 and err.count("\n") == 1 and "--m or --m-per-d" in err


def test_authors_line_solves_n_log_n():
    from analyses.capacity import authors_line

    line = authors_line(MemoryConfig(kind="linear", d=64))
    n = line.n_on_line([64.0, 4096.0, 1e6])
    assert n * torch.tensor(n).log().numpy() == pytest.approx([64 / 1.3, 4096 / 1.3, 1e6 / 1.3], rel=1e-9)
    mlp = authors_line(MemoryConfig(kind="mlp", d=8, m=16))  # the authors plot m·d = 0.35·N ln N
    assert mlp.law == "N ln N = m·d/0.35" and mlp.n_on_line([512.0])[0] == pytest.approx(262.6, abs=0.1)
    assert authors_line(MemoryConfig(kind="linear", d=8, m=4)) is None  # the paper draws no line for low rank


def test_memory_report_reads_the_authors_law(tmp_path, capsys):
    """N* exactly on N ln N = d^2 / 1.3: the law's slope is 2 and every ratio 1, while the
    plain slope of log N* against log d stays below 2 (the log factor)."""
    import pandas as pd

    from analyses.capacity import authors_line, memory_report

    cfg = MemoryConfig(kind="linear", d=8)
    ds = [8, 16, 32, 64, 128]
    on_line = authors_line(cfg).n_on_line([d * d for d in ds])
    table = pd.DataFrame([{"kind": "linear", "d": d, "m": None, "seed": s, "n_star": n, "parameters": d * d,
                           "theory": d * d, "n_star_over_theory": n / d / d}
                          for d, n in zip(ds, on_line) for s in (0, 1)])
    summary = memory_report(table, cfg, tmp_path, pd.DataFrame(), {})
    assert summary["authors_line"]["fitted_slope"] == pytest.approx(2.0, abs=1e-9)
    assert [s["n_star_over_line"] for s in summary["sizes"]] == pytest.approx([1.0] * 5)
    assert 1.5 < summary["fitted_slope"] < 1.8
    assert (tmp_path / "capacity_linear.png").stat().st_size > 10_000
    assert "slope of log(N* ln N*) against log d: 2.00" in capsys.readouterr().out


def test_memory_report_of_two_sizes_says_the_slope_is_undetermined(tmp_path, capsys):
    """Two sizes fit a line exactly: no slope is reported as a finding, and a full linear
    memory's rows carry no m."""
    import pandas as pd

    from analyses.capacity import memory_report

    cfg = MemoryConfig(kind="linear", d=8)
    table = pd.DataFrame([{"kind": "linear", "d": d, "m": None, "seed": 0, "n_star": n, "parameters": d * d,
                           "theory": d * d, "n_star_over_theory": n / d / d} for d, n in ((8, 22), (16, 56))])
    summary = memory_report(table, cfg, tmp_path, pd.DataFrame(), {})
    assert summary["fitted_slope"] is None and summary["fit"] == {"undetermined": True, "points": 2, "parameters": 2}
    assert summary["authors_line"]["fitted_slope"] is None
    out = capsys.readouterr().out
    assert "fitted slope of log N* against log d: undetermined (2 points, 2 parameters); theory 2" in out
    assert "against log d: undetermined (2 points, 2 parameters); the law: 2" in out
    assert "m=None" not in out and "  d=8    N*=22.0  N*/d^2=0.344" in out


# ------------------------------------------------------------------ memories
def test_fixed_outputs_and_measurement_interval():
    """n_outputs fixes M (f(i) = floor(i M / N)); accuracy is measured every eval_every steps,
    so a run stops on a measurement step."""
    cfg = MemoryConfig(kind="mlp", d=8, m=16, n_outputs=4, lr=0.1, steps=400)
    E, U, targets = memory_data(20, cfg, [0])
    assert U.shape == (1, 4, 8) and targets.tolist() == [i * 4 // 20 for i in range(20)]
    assert memory_data(3, cfg, [0])[1].shape == (1, 4, 8)
    every_step = fit(cfg, 20, [0])
    sparse = fit(replace(cfg, eval_every=32), 20, [0])
    assert every_step["accuracy"][0] >= 0.99 and sparse["accuracy"][0] >= 0.99
    assert (sparse["steps_run"] - 1) % 32 == 0 and sparse["steps_run"] >= every_step["steps_run"] > 1
    with pytest.raises(ValueError, match="eval_every"):
        replace(cfg, eval_every=0).validate()


def test_one_step_memory_is_the_gradient_and_recalls_everything_when_n_much_below_d2():
    cfg = MemoryConfig(d=64)
    E, U, targets = memory_data(40, cfg, [0])  # N = 40 << d^2 = 4096
    W = torch.zeros(64, 64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(memory_logits({"W": W[None]}, E, U, "linear")[0], targets)
    loss.backward()
    built = one_step_memory(E[0], U[0], targets)
    assert torch.allclose(built, -W.grad, atol=1e-6)
    assert recall_accuracy(built, E[0], U[0], targets) == 1.0
    # far past d^2 the same construction fails: the test can tell the two apart
    E, U, targets = memory_data(2000, MemoryConfig(d=8), [0])
    assert recall_accuracy(one_step_memory(E[0], U[0], targets), E[0], U[0], targets) < 0.5


@pytest.mark.parametrize("kind,m", [("linear", None), ("linear", 4), ("mlp", 8)])
def test_trained_memories_store_few_and_fail_many(kind, m):
    cfg = MemoryConfig(kind=kind, d=8, m=m, steps=300, lr=0.1)
    assert min(fit(cfg, 6, [0, 1])["accuracy"]) >= 0.99
    assert max(fit(cfg, 200, [0, 1])["accuracy"]) < 0.5  # far above d^2 = 64 and m*d


def test_memory_seeds_are_independent_and_reproducible():
    cfg = MemoryConfig(d=8, steps=30, target_accuracy=2.0)
    both = fit(cfg, 30, [0, 1])["accuracy"]
    assert fit(cfg, 30, [1])["accuracy"][0] == pytest.approx(both[1], abs=1e-6)
    assert fit(cfg, 30, [0, 1])["accuracy"] == both



@pytest.mark.slow
def test_authors_recipe_script_finds_and_resumes_the_linear_capacity(tmp_path):
    """The official recipe's check (scripts/): N* at d = 4 lies where the fits say, and a re-run
    reads every probe back instead of fitting again."""
    out = tmp_path / "recipe"
    script = Path(__file__).resolve().parents[1] / "scripts" / "linear_memory_authors_recipe.py"

    def main(args):
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True).returncode

    assert main(["--d", "4", "--seeds", "0", "--out", str(out), "--quiet"]) == 0
    n_star = int(pd.read_csv(out / "capacity.csv")["n_star"].iloc[0])
    probes = pd.read_csv(out / "probes.csv")
    assert (probes.loc[probes["n"] <= n_star, "accuracy"] >= 0.99).any()
    assert (probes.loc[probes["n"] > n_star, "accuracy"] < 0.99).all() and (probes["n"] > n_star).any()
    before = sorted(p.name for p in (out / "cells").iterdir())
    again = runpy.run_path(str(script))["main"]  # the re-run in this process: the first went through the script
    assert again(["--d", "4", "--seeds", "0", "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in (out / "cells").iterdir()) == before
    assert json.loads((out / "summary.json").read_text())["probes_computed"] == 0
