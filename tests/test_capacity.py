"""Binary search, resumable cells, associative memories, pruning bookkeeping, the CLIs."""
import itertools
import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from analyses.executors import LocalExecutor
from analyses.sweep import Cell, Cells, bisection, largest_passing, one, run_jobs
from models.memories import (
    MemoryConfig,
    fit,
    memory_data,
    memory_logits,
    one_step_memory,
    recall_accuracy,
)
from models.pruning import head_norms, neuron_norms, prune, prune_order


# ------------------------------------------------------------------ binary search
@pytest.mark.parametrize("threshold", [1, 2, 7, 100, 1000, 12345])
@pytest.mark.parametrize("start", [1, 5, 64, 5000])
def test_binary_search_finds_monotone_threshold(threshold, start):
    calls = []

    def passes(n):
        calls.append(n)
        return n <= threshold
    assert largest_passing(passes, start) == threshold
    assert len(calls) <= 2 * (abs(threshold.bit_length() - start.bit_length()) + threshold.bit_length()) + 4


@pytest.mark.parametrize("probes", [2, 3, 5])
def test_a_search_of_several_probes_finds_the_same_threshold_in_fewer_rounds(probes):
    for threshold in (1, 2, 7, 30, 100, 1000, 12345):
        for start in (1, 5, 64, 5000):
            rounds = {}
            for p in (1, probes):
                sizes, count = bisection(start, probes=p), 0
                try:
                    tried = next(sizes)
                    while True:
                        assert len(tried) <= p and len(set(tried)) == len(tried)
                        count += 1
                        tried = sizes.send(tuple(n <= threshold for n in tried))
                except StopIteration as stop:
                    assert stop.value == threshold, (threshold, start, p)
                rounds[p] = count
            assert rounds[probes] <= rounds[1]
    assert largest_passing(lambda n: n <= 30, 8, highest=50, probes=probes) == 30
    assert largest_passing(lambda n: False, 8, lowest=2, probes=probes) == 1


@pytest.mark.parametrize("threshold, asked", [(21, [8, 12, 18, 27, 22, 20]), (5, [8, 4, 6, 5])])
def test_one_probe_per_round_keeps_the_sizes_recorded_sweeps_asked_for(threshold, asked):
    """Figure 4 left's search (from 8, x1.5, to 10%): a resumed sweep must ask for the same sizes."""
    sizes, seen = bisection(8, lowest=2, highest=512, grow=1.5, rel_tol=0.1), []
    with pytest.raises(StopIteration):
        tried = next(sizes)
        while True:
            seen.extend(tried)
            tried = sizes.send(tuple(n <= threshold for n in tried))
    assert seen == asked


def test_binary_search_when_nothing_passes_and_with_a_ceiling():
    assert largest_passing(lambda n: False, 8, lowest=2) == 1
    assert largest_passing(lambda n: True, 8, highest=50) == 50
    assert largest_passing(lambda n: n <= 30, 8, highest=50) == 30


def test_binary_search_relative_tolerance_stops_early():
    calls = []

    def passes(n):
        calls.append(n)
        return n <= 1000
    exact_calls = []
    largest_passing(lambda n: exact_calls.append(n) or n <= 1000, 10)
    found = largest_passing(passes, 10, rel_tol=0.1)
    assert 1000 / 1.1 <= found <= 1000
    assert len(calls) < len(exact_calls)


def test_binary_search_noisy_oracle_lands_near_threshold():
    """P(pass) falls smoothly from 1 to 0 around the threshold: answers stay within a few widths."""
    threshold, width, errors = 500, 10, []
    for seed in range(60):
        rng = random.Random(seed)

        def passes(n, rng=rng):
            return rng.random() < 1 / (1 + pow(2.718281828, (n - threshold) / width))
        errors.append(largest_passing(passes, 20) - threshold)
    assert sum(abs(e) <= 6 * width for e in errors) >= 55
    assert abs(sum(errors) / len(errors)) <= 2 * width


def test_binary_search_refuses_bad_arguments():
    with pytest.raises(ValueError):
        largest_passing(lambda n: True, 0)
    with pytest.raises(ValueError):
        largest_passing(lambda n: True, 4, grow=1.0)
    with pytest.raises(ValueError):
        largest_passing(lambda n: True, 4, probes=0)


# ------------------------------------------------------------------ resumable cells
def test_cells_skip_what_is_recorded(tmp_path):
    computed = []

    def square(n):
        computed.append(n)
        return {"n": n, "square": n * n}

    def sweep(cells):
        return run_jobs([one(Cell(f"n{n}", square, (n,))) for n in range(5)], cells, LocalExecutor(), progress=False)
    first = sweep(Cells(tmp_path, {"a": 1}))
    assert computed == list(range(5)) and first[2] == {"n": 2, "square": 4}
    (tmp_path / "cells" / "n3.json").unlink()  # as if killed before cell 3 was written
    again = Cells(tmp_path, {"a": 1})
    assert sweep(again) == first
    assert computed == list(range(5)) + [3] and again.computed == 1
    assert [r["n"] for r in again.rows()] == list(range(5))


def test_cells_refuse_another_sweeps_directory(tmp_path):
    Cells(tmp_path, {"steps": 20})  # nothing recorded yet: the directory is not claimed
    Cells(tmp_path, {"steps": 10}).record("a", {"x": 1})
    with pytest.raises(ValueError, match="other settings"):
        Cells(tmp_path, {"steps": 20})


def _cli(argv, capsys):
    """Run `python -m analyses.capacity ARGV` in-process: (exit code, stdout, stderr)."""
    from analyses.capacity import main
    from models.cli import run_cli

    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(argv))
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def test_memory_sweep_rerun_skips_recorded_probes(tmp_path, capsys):
    argv = ["memory", "--kind", "mlp", "--d", "8", "--m", "2", "--seeds", "1", "--steps", "100",
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


def test_memory_sweep_sizes_from_m_per_d_with_fixed_outputs(tmp_path, capsys):
    """--m-per-d 1,2 gives widths m = d, 2d; --outputs M fixes the outputs (Figure 6), and the
    report compares N* with the paper's line N = m d / 1.2."""
    argv = ["memory", "--kind", "mlp", "--d", "4", "--m-per-d", "1,2", "--outputs", "4", "--seeds", "1",
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


# ------------------------------------------------------------------ pruning
def _weights():
    g = torch.Generator().manual_seed(0)
    d, H, dh, m = 8, 3, 4, 6
    w = {"blocks.0.attn.W_V": torch.randn(H, d, dh, generator=g),
         "blocks.0.attn.W_O": torch.randn(H, dh, d, generator=g),
         "blocks.0.attn.b_V": torch.zeros(H, dh), "blocks.0.mlp.W_in": torch.randn(d, m, generator=g),
         "blocks.0.mlp.b_in": torch.zeros(m), "blocks.0.mlp.W_out": torch.randn(m, d, generator=g)}
    w["blocks.0.mlp.W_in"][:, 4] *= 0.01  # neuron 4 is the weakest
    w["blocks.0.attn.W_O"][2] *= 0.01  # head 2 is the weakest
    return w


def test_pruning_removes_the_smallest_units_and_leaves_the_original_alone():
    w = _weights()
    original = {k: v.clone() for k, v in w.items()}
    neurons, heads = prune_order(neuron_norms(w)), prune_order(head_norms(w))
    assert neurons[0] == 4 and heads[0] == 2 and sorted(neurons) == list(range(6)) and sorted(heads) == [0, 1, 2]
    norms = neuron_norms(w)
    assert all(norms[a] <= norms[b] for a, b in itertools.pairwise(neurons))
    pruned = prune(w, neurons=neurons[:2], heads=heads[:1])
    assert all(torch.equal(w[k], original[k]) for k in w)
    dead_n = (pruned["blocks.0.mlp.W_in"].abs().sum(0) == 0) & (pruned["blocks.0.mlp.W_out"].abs().sum(1) == 0)
    assert dead_n.nonzero().flatten().tolist() == sorted(neurons[:2])
    dead_h = (pruned["blocks.0.attn.W_O"].flatten(1).abs().sum(1) == 0)
    assert dead_h.nonzero().flatten().tolist() == [2]
    assert torch.equal(pruned["blocks.0.attn.W_V"][:2], w["blocks.0.attn.W_V"][:2])


def test_pruned_bridge_writes_nothing_from_removed_units(tiny_result):
    from models.bridge import build_bridge

    w = tiny_result.weights
    m = w["blocks.0.mlp.W_in"].shape[1]
    all_gone = build_bridge(tiny_result.section,
                            prune(w, neurons=range(m), heads=range(w["blocks.0.attn.W_V"].shape[0])))
    tokens = tiny_result.task.eval_set(16).tokens
    _, cache = all_gone.run_with_cache(tokens)
    assert cache["blocks.0.hook_mlp_out"].abs().max() == 0
    assert cache["blocks.0.attn.hook_z"].abs().max() == 0


def test_pruning_steps_cover_zero_to_all():
    from analyses.tradeoff import pruning_steps

    assert pruning_steps(8, 4) == [0, 2, 4, 6, 8]
    assert pruning_steps(3, 8) == [0, 1, 2, 3]


def test_bad_shape_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = _cli(["transformer", "--shape", "0.25,1,8", "--d", "8,16", "--out", str(out)], capsys)
    assert code == 2 and err.startswith("error: shape") and err.count("\n") == 1
    assert not out.exists()


def test_shape_sizes_round_down_as_the_authors_do():
    from analyses.capacity import TransformerSweep
    from models.config import shape_model

    assert shape_model(1, 1, 8, 11) == replace(shape_model(1, 1, 8, 8), d_model=11, d_head=1, d_mlp=11)
    assert (shape_model(0.25, 4, 8, 45).d_head, shape_model(0.5, 0.5, 8, 22).d_mlp) == (1, 11)
    with pytest.raises(ValueError, match="d_head=0"):
        shape_model(0.25, 4, 8, 22)
    sweep = TransformerSweep(shapes=((0.25, 4.0, 8.0), (1.0, 1.0, 8.0)), d=(32, 8, 16, 22))
    assert sweep.sizes((0.25, 4.0, 8.0)) == [32] and sweep.sizes((1.0, 1.0, 8.0)) == [8, 16, 22, 32]
    assert sweep.sizes((1.0, 1.0, 8.0, 16.0)) == [8, 16]  # a shape searched only up to its largest d
    with pytest.raises(ValueError, match="below every --d"):
        TransformerSweep(shapes=((1.0, 1.0, 8.0, 4.0),), d=(8, 16))


@pytest.mark.parametrize("probes", [1, 3])
def test_shape_search_starts_each_size_from_the_previous_sizes_answer(probes):
    """The authors' warm start: d in increasing order, each search from the last S*; with
    several probes a round asks for that many sizes at once."""
    from analyses.capacity import TransformerSweep, shape_capacity

    capacity = {8: 11, 16: 30, 32: 600}  # S* of a noiseless oracle, the last above max_size
    sweep = TransformerSweep(shapes=((1.0, 1.0, 2.0),), d=(32, 8, 16), max_size=512, probes=probes)
    found, asked, rounds = {}, [], []
    job = shape_capacity((1.0, 1.0, 2.0), sweep, "cpu", found)
    try:
        request = next(job)
        while True:
            rounds.append(len(request))
            sizes = [cell.args[1:3] for cell in request]  # (d, S)
            asked.extend(sizes)
            request = job.send(tuple({"accuracy": 1.0 if S <= capacity[d] else 0.5} for d, S in sizes))
    except StopIteration as stop:
        assert stop.value is found
    firsts = [next(S for d_, S in asked if d_ == d) for d in (8, 16, 32)]
    assert firsts[0] == 8 and firsts[1] == found[8] and firsts[2] == found[16]
    assert 10 <= found[8] <= 11 and 27 <= found[16] <= 30 and found[32] == 512
    assert max(S for _, S in asked) == 512 and len(asked) == len(set(asked))
    assert max(rounds) == probes


def test_transformer_sweep_writes_tables_and_reads_them_back_when_cut_short(tmp_path, capsys):
    argv = ["transformer", "--shape", "1,1,2,6", "--d", "4,6,8", "--answers", "2", "--seq-len", "4", "--lr", "0.03",
            "--steps", "60", "--batch-size", "64", "--eval-every", "20", "--eval-size", "64", "--min-size", "2",
            "--max-size", "4", "--device", "cpu", "--quiet", "--out", str(tmp_path)]
    code, out, _ = _cli(argv, capsys)
    assert code == 0 and "sizes searched: 2 of 2" in out
    table = pd.read_csv(tmp_path / "capacity.csv")
    assert list(table["d"]) == [4, 6] and table["S_star"].between(1, 4).all()
    assert (table["parameters"] == [4 * 2 * 2 * 4 + 2 * 4 * 4, 4 * 2 * 3 * 6 + 2 * 6 * 6]).all()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["paper_line"]["facts_per_parameter"] == 0.15 and summary["sizes"]["skipped"] == []
    assert len(pd.read_csv(tmp_path / "probes.csv")) == len(list((tmp_path / "cells").glob("*.json")))
    assert json.loads((tmp_path / "settings.json").read_text())["model"] == {"parameterisation": "authors",
                                                                            "embedding": "gaussian"}
    for cell in (tmp_path / "cells").glob("*.json"):  # each learning rate's best accuracy and its curve
        row = json.loads(cell.read_text())
        (run,) = row["runs"]
        assert run["curve"]["step"][0] == 0 and run["curve"]["step"][-1] == row["steps_run"]
        assert run["best_accuracy"] == pytest.approx(max(run["curve"]["accuracy"]), abs=1e-5)
        assert row["best_accuracy"] >= row["accuracy"] - 1e-9
        assert (row["best_accuracy"] >= 0.99) == (row["accuracy"] >= 0.99)
    for cell in (tmp_path / "cells").glob("shape1,1,2_d6_S*.json"):
        cell.unlink()
    code, out, _ = _cli([*argv, "--recorded-only"], capsys)
    assert code == 0 and "sizes searched: 1 of 2" in out and "(0 new training runs)" in out
    assert list(pd.read_csv(tmp_path / "capacity.csv")["d"]) == [4]


def test_the_paper_window_is_the_authors_notebooks():
    """Per shape in increasing d: from the first size above 64 facts up to, not including,
    the first above 11,000; a later dip to 64 or fewer stays in, as in their plot."""
    from analyses.capacity import paper_window

    table = pd.DataFrame({"shape": ["a"] * 6 + ["b"] * 2, "d": [8, 11, 16, 22, 32, 45, 8, 11],
                          "facts": [49, 81, 64, 10000, 12100, 9000, 36, 64]})
    shown = paper_window(table.iloc[::-1])
    assert list(zip(shown["shape"], shown["d"])) == [("a", 11), ("a", 16), ("a", 22)]


TINY = ["--n-subjects", "8", "--n-relations", "4", "--answers-per-relation", "4", "--n-noise", "8", "--seq-len", "8",
        "--d-model", "32", "--d-head", "8", "--steps", "150", "--eval-every", "50", "--contexts", "2",
        "--patch-contexts", "1", "--device", "cpu", "--quiet"]


def test_tradeoff_grid_records_shares_and_resumes(tmp_path, capsys):
    from analyses.tradeoff import main

    argv = ["grid", "--heads", "2", "--widths", "4,32", *TINY, "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "(2 new cells)" in capsys.readouterr().out
    import pandas as pd

    grid = pd.read_csv(tmp_path / "grid.csv")
    counts = 32 * grid[[f"share_{k}" for k in ("attention", "mlp", "both", "distributed", "not_stored")]]
    assert len(grid) == 2 and ((counts - counts.round()).abs() < 1e-9).all().all()  # shares of the 32 facts
    # a fact answered in under half its contexts is not stored, so the unknown facts bound the accuracy
    assert (grid["share_not_stored"] <= 2 * (1 - grid["located_accuracy"]) + 1e-9).all()
    assert (grid["share_not_stored"] >= 1 - 2 * grid["located_accuracy"] - 1e-9).all()
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert "sampler" not in settings["run"]["train"] and "parameterisation" in settings["run"]["model"]
    (tmp_path / "cells" / "H2_m32.json").unlink()
    assert main(argv) == 0
    assert "(1 new cells)" in capsys.readouterr().out
    assert (tmp_path / "grid.png").is_file()


def test_shrink_bookkeeping(tiny_ckpt, tmp_path):
    import pandas as pd

    from analyses.tradeoff import main

    assert main(["shrink", "--ckpt", str(tiny_ckpt), "--mlp-steps", "2", *TINY, "--out", str(tmp_path)]) == 0
    facts = pd.read_csv(tmp_path / "shrink_facts.csv")
    steps = facts.groupby("component")["removed"].unique().apply(sorted).to_dict()
    assert steps == {"mlp": [0, 32, 64], "heads": [1, 2, 3, 4]}
    assert (facts.groupby(["component", "removed"]).size() == 64).all()  # every fact at every step
    before = facts[facts["removed"] == 0].set_index(["subject", "relation"])["store_before"]
    assert (before == facts[facts["removed"] == 0].set_index(["subject", "relation"])["label"]).all()
    everything = facts[(facts["component"] == "heads") & (facts["removed"] == 4)]
    assert (everything["label"] == "not_stored").mean() > 0.5  # no head left: the facts are gone


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
    assert main(["--d", "4", "--seeds", "0", "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in (out / "cells").iterdir()) == before
    assert json.loads((out / "summary.json").read_text())["probes_computed"] == 0
