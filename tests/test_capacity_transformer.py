"""Transformer capacity (`analyses.capacity transformer`), pruning and the tradeoff CLI."""
import itertools
import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from models.recall.pruning import head_norms, neuron_norms, prune, prune_order
from tests.test_capacity_memory import _cli

ROOT = Path(__file__).resolve().parents[1]


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


# ------------------------------------------------------------------ transformers
def test_bad_shape_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = _cli(["transformer", "--shape", "0.25,1,8", "--d", "8,16", "--out", str(out)], capsys)
    assert code == 2 and err.startswith("error: shape") and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("heads", ["0", "1.5", "-2"])
def test_a_shape_without_a_whole_number_of_heads_is_one_line(heads, tmp_path, capsys):
    """H = 0 once divided by zero (a traceback); H = 1.5 trained one head and recorded 1.5."""
    out = tmp_path / "out"
    code, _, err = _cli(["transformer", "--shape", f"1,1,{heads}", "--d", "8", "--steps", "1", "--out", str(out)],
                        capsys)
    assert code == 2 and err.count("\n") == 1 and "H (heads) must be a whole number >= 1" in err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("heads", ["0", "1.5"])
def test_a_shape_preset_without_a_whole_number_of_heads_is_one_line(heads, tmp_path):
    done = subprocess.run([sys.executable, "-m", "models.train", "--preset", f"shape:1,1,{heads},8", "--steps", "1",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "H (heads) must be a whole number >= 1" in done.stderr and not (tmp_path / "run").exists()


def test_a_size_where_even_the_smallest_search_fails_stores_nothing(tmp_path, capsys):
    """Every size failing once read S* = R* = 1 (one fact), a size never trained."""
    out = tmp_path / "out"
    code, text, _ = _cli(["transformer", "--shape", "1,1,2", "--d", "8", "--steps", "2", "--eval-every", "1",
                          "--eval-size", "64", "--batch-size", "16", "--device", "cpu", "--quiet",
                          "--out", str(out)], capsys)
    assert code == 0 and "nothing stored" in text and "S*=R*=1 " not in text
    table = pd.read_csv(out / "capacity.csv")
    assert table[["S_star", "facts"]].values.tolist() == [[0, 0]]
    assert 1 not in set(pd.read_csv(out / "probes.csv")["S"])  # S = 1 was never trained
    assert json.loads((out / "summary.json").read_text())["fitted_slope"] is None


def test_shape_sizes_round_down_as_the_authors_do():
    from analyses.capacity import TransformerSweep
    from models.recall.config import shape_model

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
def test_shape_search_starts_each_size_from_the_previous_sizes_answer(probes, tmp_path):
    """The authors' warm start: d in increasing order, each search from the last S*; with
    several probes a round asks for that many sizes at once."""
    from analyses.capacity import TransformerSweep, shape_capacity
    from analyses.sweeps.cells import Cells

    capacity = {8: 11, 16: 30, 32: 600}  # S* of a noiseless oracle, the last above max_size
    sweep = TransformerSweep(shapes=((1.0, 1.0, 2.0),), d=(32, 8, 16), max_size=512, probes=probes)
    found, asked, rounds = {}, [], []
    job = shape_capacity((1.0, 1.0, 2.0), sweep, "cpu", found, Cells(tmp_path, sweep.recorded()))
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
    assert "facts per parameter (geometric mean over 64 to 11000 facts): n/a, no size inside the window" in out
    probes = pd.read_csv(tmp_path / "probes.csv")  # the runs column in JSON, as the cells record it
    recorded = sorted(json.dumps(json.loads(c.read_text())["runs"]) for c in (tmp_path / "cells").glob("*.json"))
    assert sorted(json.dumps(json.loads(r)) for r in probes["runs"]) == recorded
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


def test_a_sweep_recorded_without_a_sampler_resumes_with_the_generator(tmp_path, capsys):
    """Sweeps recorded before the counter sampler was the default name no sampler: re-run
    without --sampler, they resume with the generator they trained with; a new sweep records
    the counter sampler."""
    argv = ["transformer", "--shape", "1,1,2,4", "--d", "4", "--answers", "2", "--seq-len", "4", "--lr", "0.03",
            "--steps", "20", "--batch-size", "32", "--eval-every", "10", "--eval-size", "32", "--min-size", "2",
            "--max-size", "2", "--device", "cpu", "--quiet"]
    code, _, _ = _cli([*argv, "--sampler", "generator", "--out", str(tmp_path / "old")], capsys)
    assert code == 0 and "sampler" not in json.loads((tmp_path / "old" / "settings.json").read_text())
    code, out, err = _cli([*argv, "--out", str(tmp_path / "old")], capsys)
    assert (code, err) == (0, "") and "(0 new training runs)" in out
    code, _, _ = _cli([*argv, "--out", str(tmp_path / "new")], capsys)
    assert code == 0 and json.loads((tmp_path / "new" / "settings.json").read_text())["sampler"] == "counter"


def test_a_search_over_seeds_takes_the_largest_size_most_seeds_store():
    """Votes of 3 seeds per size: all store up to 5, one stores 6, two store 9. A tie is not a
    majority; 9, a majority above a size that failed in the same round, is set aside: S* = 5."""
    from analyses.capacity.transformer import stored_by_most
    from analyses.sweeps.cells import Cell
    from analyses.sweeps.search import bisection, stacked_search

    votes = {2: 3, 3: 3, 4: 3, 5: 3, 6: 1, 9: 2}
    assert stored_by_most(({"accuracy": 1.0}, {"accuracy": 0.5})) is False  # a tie
    assert stored_by_most(({"accuracy": 1.0}, {"accuracy": 0.995}, {"accuracy": 0.5})) is True
    job = stacked_search(bisection(4, lowest=2, highest=12, grow=1.5, rel_tol=0.1, probes=2),
                         lambda sizes: Cell("+".join(map(str, sizes)), dict, parts=tuple(map(str, sizes))), 3,
                         stored_by_most)
    asked, request = [], next(job)
    try:
        while True:
            sizes = [int(S) for S in request.key.split("+")]
            asked.append(sizes)
            request = job.send(tuple({"accuracy": float(seed < votes[S])} for S in sizes for seed in range(3)))
    except StopIteration as stop:
        assert stop.value == 5
    assert asked == [[4, 2], [6, 9], [5]]


def test_a_search_over_seeds_records_each_seed_and_resumes(tmp_path, capsys):
    argv = ["transformer", "--shape", "1,1,2,6", "--d", "4,6", "--answers", "2", "--seq-len", "4", "--lr", "0.03",
            "--steps", "60", "--batch-size", "64", "--eval-every", "20", "--eval-size", "64", "--min-size", "2",
            "--max-size", "4", "--seeds", "0,1,2", "--sampler", "counter", "--probes", "2", "--stack", "on",
            "--device", "cpu", "--quiet", "--out", str(tmp_path)]
    code, out, _ = _cli(argv, capsys)
    assert code == 0 and "sizes searched: 2 of 2" in out
    table = pd.read_csv(tmp_path / "capacity.csv")
    probes = pd.read_csv(tmp_path / "probes.csv")
    assert sorted(set(probes["seed"])) == [0, 1, 2] and len(probes) % 3 == 0
    for (d, S), g in probes.groupby(["d", "S"]):  # every probed size has all three seeds' cells
        assert sorted(g["seed"]) == [0, 1, 2], (d, S)
    for row in table.itertuples():  # S* is stored by most seeds, S* + 1 (when probed) by few
        votes = probes[(probes["d"] == row.d)].groupby("S")["accuracy"].apply(lambda a: int((a >= 0.99).sum()))
        assert row.seeds == 3 and row.stored_by == votes.get(row.S_star, 0)
        assert row.S_star < 2 or row.stored_by >= 2
        assert row.S_star + 1 not in votes or votes[row.S_star + 1] <= 1
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["search"] == "majority of seeds" and "seed" not in settings and settings["sampler"] == "counter"
    code, out, _ = _cli(argv, capsys)
    assert code == 0 and "(0 new training runs)" in out
    code, _, err = _cli([*argv, "--seed", "1"], capsys)
    assert code == 2 and err.strip().splitlines() == ["error: --seeds searches the seeds it names; drop --seed."]


def test_the_paper_window_is_the_authors_notebooks():
    """Per shape in increasing d: from the first size above 64 facts up to, not including,
    the first above 11,000; a later dip to 64 or fewer stays in, as in their plot."""
    from analyses.capacity import paper_window

    table = pd.DataFrame({"shape": ["a"] * 6 + ["b"] * 2, "d": [8, 11, 16, 22, 32, 45, 8, 11],
                          "facts": [49, 81, 64, 10000, 12100, 9000, 36, 64]})
    shown = paper_window(table.iloc[::-1])
    assert list(zip(shown["shape"], shown["d"])) == [("a", 11), ("a", 16), ("a", 22)]


# ------------------------------------------------------------------ tradeoff
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
    assert settings["run"]["train"]["sampler"] == "counter" and "parameterisation" in settings["run"]["model"]
    (tmp_path / "cells" / "H2_m32.json").unlink()
    assert main(argv) == 0
    assert "(1 new cell)" in capsys.readouterr().out
    assert (tmp_path / "grid.png").is_file()


def test_a_grid_over_seeds_records_each_seed_and_the_frontiers_spread(tmp_path, capsys):
    from analyses.tradeoff import main
    from analyses.tradeoff.grid import frontier_of

    argv = ["grid", "--heads", "1,2", "--widths", "4,32", "--seeds", "0,1", "--stack", "on", *TINY,
            "--steps", "80", "--eval-every", "40", "--out", str(tmp_path)]  # H = 2 reaches 99% at m = 32
    assert main(argv) == 0
    assert "(8 new cells)" in capsys.readouterr().out
    assert sorted(p.stem for p in (tmp_path / "cells").glob("H*.json")) == sorted(
        f"H{h}_m{m}_seed{s}" for h in (1, 2) for m in (4, 32) for s in (0, 1))
    by_seed, grid = pd.read_csv(tmp_path / "grid_by_seed.csv"), pd.read_csv(tmp_path / "grid.csv")
    assert len(by_seed) == 8 and sorted(set(by_seed["seed"])) == [0, 1] and (grid["seeds"] == 2).all()
    for row in grid.itertuples():  # each cell of grid.csv: its seeds' mean, lowest and highest
        cell = by_seed[(by_seed["heads"] == row.heads) & (by_seed["width"] == row.width)]["best_accuracy"]
        assert row.best_accuracy == pytest.approx(cell.mean())
        assert (row.best_accuracy_min, row.best_accuracy_max) == (cell.min(), cell.max())
    summary = json.loads((tmp_path / "summary.json").read_text())
    for seed in (0, 1):
        expected = {str(h): m for h, m in frontier_of(by_seed[by_seed["seed"] == seed]).items()}
        assert summary["frontier_by_seed"][str(seed)] == expected
    assert any(spread["seeds_reaching"] for spread in summary["frontier_spread"].values())  # a frontier to spread
    for h, spread in summary["frontier_spread"].items():
        reached = sorted(f[h] for f in summary["frontier_by_seed"].values() if f[h] is not None)
        assert spread["seeds_reaching"] == len(reached) and spread["min"] == (reached[0] if reached else None)
    assert "seed" not in json.loads((tmp_path / "settings.json").read_text())["run"]["train"]
    assert main(argv) == 0
    assert "(0 new cells)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--seeds trains every cell with the seeds it names; drop --seed"):
        main([*argv, "--seed", "3"])


@pytest.mark.parametrize("shape", [["--widths", "4"], ["--attn-only"]], ids=["one cell", "attention-only"])
def test_a_one_row_grid_writes_its_tables_and_figure(shape, tmp_path):
    import pandas as pd

    from analyses.tradeoff import main

    assert main(["grid", "--heads", "1,2", *shape, *TINY, "--steps", "10", "--out", str(tmp_path)]) == 0
    grid = pd.read_csv(tmp_path / "grid.csv")
    width = 0 if "--attn-only" in shape else 4  # an attention-only cell has no MLP: m = 0
    assert grid["width"].tolist() == [width, width] and (tmp_path / "grid.png").is_file()
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["heads"] == [1, 2] and settings["widths"] == [width]
    assert not {"n_heads", "d_mlp"} & set(settings["run"]["model"])  # the grid sets them per cell


def test_a_grid_recorded_with_the_presets_heads_and_width_resumes(tmp_path, capsys):
    from analyses.tradeoff import main

    argv = ["grid", "--heads", "2", "--widths", "4", *TINY, "--steps", "10", "--out", str(tmp_path)]
    assert main(argv) == 0
    settings = json.loads((tmp_path / "settings.json").read_text())  # as grids recorded it before
    settings["run"]["model"] = {"d_model": 32, "n_heads": 8, "d_head": 8, "d_mlp": 64,
                                **settings["run"]["model"]}
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    capsys.readouterr()
    assert main(argv) == 0 and "(0 new cells)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, problem", [
    (["grid", "--n-heads", "4"], "--n-heads is not used by `grid`: the grid sets H from --heads"),
    (["grid", "--d-mlp", "4"], "--d-mlp is not used by `grid`"),
    (["grid", "--attn-only", "--widths", "4"], "--widths is not used by `grid`: an attention-only grid has no MLP"),
    (["swap", "--attn-only"], "--attn-only is not used by `swap`"),
    (["shrink", "--ckpt", "x", "--steps", "5"], "--steps is not used by `shrink`: --ckpt fixes the model"),
])
def test_a_flag_the_subcommand_does_not_use_is_refused(argv, problem, tmp_path):
    from analyses.tradeoff import main

    small = ["--heads", "1", *TINY, "--steps", "1"] if argv[0] == "grid" else [*TINY, "--steps", "1"]
    with pytest.raises(ValueError, match=re.escape(problem)):
        main([*argv, *(small if argv[0] != "shrink" else []), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_shrink_bookkeeping(tiny_ckpt, tmp_path):
    import pandas as pd

    from analyses.tradeoff import main

    locating = ["--contexts", "2", "--patch-contexts", "1", "--device", "cpu", "--quiet"]  # --ckpt: the rest is fixed
    ckpt = shutil.copytree(tiny_ckpt, tmp_path / "ckpt", ignore=shutil.ignore_patterns("analysis", "snapshots"))
    out = tmp_path / "out"
    argv = ["shrink", "--ckpt", str(ckpt), "--mlp-steps", "2", *locating, "--out", str(out)]
    assert main(argv) == 0
    facts = pd.read_csv(out / "shrink_facts.csv")
    steps = facts.groupby("component")["removed"].unique().apply(sorted).to_dict()
    assert steps == {"mlp": [0, 32, 64], "heads": [1, 2, 3, 4]}
    assert (facts.groupby(["component", "removed"]).size() == 64).all()  # every fact at every step
    before = facts[facts["removed"] == 0].set_index(["subject", "relation"])["store_before"]
    assert (before == facts[facts["removed"] == 0].set_index(["subject", "relation"])["label"]).all()
    everything = facts[(facts["component"] == "heads") & (facts["removed"] == 4)]
    assert (everything["label"] == "not_stored").mean() > 0.5  # no head left: the facts are gone

    # the checkpoint trained again at the same path: its recorded cells are another model's, never reused
    from models.checkpoint import load_checkpoint, read_weights, write_weights

    section = load_checkpoint(ckpt).section
    weights = read_weights(ckpt / "model.safetensors", section)
    write_weights(ckpt / "model.safetensors", {**weights, "blocks.0.mlp.W_in": -weights["blocks.0.mlp.W_in"]})
    with pytest.raises(ValueError, match=r"holds a sweep with other settings .*ckpt_weights_sha256: recorded"):
        main(argv)
