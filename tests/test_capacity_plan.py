"""The milestone rule (a run that cannot reach 99% gives up early), its validation on the
recorded curves, rounds that fill their stack, and `analyses.capacity plan`."""
import json
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyses.capacity.stopping import MILESTONES_MAX_D, stop_step, validate
from analyses.sweeps.search import bisection
from models.recall.config import MILESTONES, RunConfig, TaskConfig, TrainConfig
from tests.test_capacity_memory import _cli

RESULTS = Path(__file__).resolve().parents[1] / "results" / "capacity"
TINY = ["--shape", "1,1,2", "--d", "8,11", "--answers", "2", "--seq-len", "4", "--lr", "0.03", "--steps", "64",
        "--eval-every", "4", "--eval-size", "64", "--batch-size", "64", "--min-size", "2", "--max-size", "24"]


def _curve_row(accuracies: list[float], steps: list[int]) -> dict:
    return {"d": 8, "S": 9, "accuracy": accuracies[-1], "steps_run": steps[-1],
            "runs": [{"lr": 0.01, "best_accuracy": max(accuracies), "curve": {"step": steps, "accuracy": accuracies}}]}


def test_the_rule_never_stops_a_recorded_run_that_reached_99_percent():
    """Every recorded Figure 4 left curve (all sweeps, both models, every seed) replayed: no
    probe that reached 99% is stopped, and the failing ones save model-steps."""
    checked = validate()
    assert checked.wrong == 0 and checked.passing > 100 and checked.probes > 200
    assert checked.saved > 0.15 * checked.model_steps
    assert max(checked.d) == MILESTONES_MAX_D and set(checked.models) == {"authors", "standard"}
    assert set(checked.seeds) == {0, 1, 2}
    assert "0 of the" in checked.text() and "off above d = 64" in checked.text()


def test_the_validation_counts_a_run_stopped_before_it_reached_99_percent(tmp_path):
    steps = list(range(0, 16385, 1024))
    late = _curve_row([0.5] * 8 + [0.995], steps[:9])  # flat at 0.5 past a quarter, then 99.5%
    flat = _curve_row([0.5] * len(steps), steps)
    assert stop_step(late, 16384) == 4096 and stop_step(flat, 16384) == 4096
    assert stop_step(_curve_row([0.85, 0.95, 0.96, 0.99], [0, 4096, 8192, 12288]), 16384) is None
    sweep = tmp_path / "sweep"
    (sweep / "cells").mkdir(parents=True)
    (sweep / "settings.json").write_text(json.dumps({"analysis": "capacity transformer", "steps": 16384, "seed": 0}))
    for name, row in (("late", late), ("flat", flat)):
        (sweep / "cells" / f"{name}.json").write_text(json.dumps(row))
    checked = validate(tmp_path)
    assert (checked.wrong, checked.passing, checked.saved) == (1, 1, 16384 - 4096)


def test_a_run_gives_up_at_the_first_milestone_it_misses_alone_and_stacked():
    from models.recall.shape_trainer import train_stacks
    from models.recall.trainer import train

    def run(give_up, S):
        return RunConfig(task=TaskConfig(n_subjects=S, n_relations=S, answers_per_relation=2, n_noise=2 * S,
                                         seq_len=4),
                         train=TrainConfig(lr=(0.03,), steps=64, eval_every=4, eval_size=64, batch_size=32,
                                           snapshots_per_octave=0, device="cpu", give_up=give_up, sampler="counter"))
    runs = [run("milestones", 24), run("milestones", 20), run("never", 24)]
    alone = [train(r, progress=False).training["steps_run"] for r in runs]
    assert alone[0] == 16 and alone[2] == 64  # below 80% at a quarter of the steps: it gives up there
    assert [r.training["steps_run"] for r in train_stacks(runs, progress=False)] == alone
    assert MILESTONES[0] == (0.25, 0.80)


def _spent(out: Path) -> int:
    lrs = len(json.loads((out / "settings.json").read_text())["lr"])
    return sum(json.loads(p.read_text())["steps_run"] * lrs for p in (out / "cells").glob("*.json"))


def test_the_plan_spends_what_the_sweep_then_spends(tmp_path, capsys):
    """A tiny sweep recorded under today's rules stands in for the training: the plan's
    model-steps, today's and with the milestone rule, are what each sweep then spends (two
    learning rates: a probe trains one model per rate)."""
    sizes = [*TINY[:TINY.index("--lr")], "--lr", "0.03,0.01", *TINY[TINY.index("--lr") + 2:]]
    oracle = tmp_path / "oracle"
    assert _cli(["transformer", *sizes, "--device", "cpu", "--quiet", "--out", str(oracle)], capsys)[0] == 0
    code, text, _ = _cli(["plan", *sizes, "--oracle", str(oracle), "--out", str(tmp_path / "plan")], capsys)
    assert code == 0 and "stopped wrongly" in text and "model-steps today" in text
    assert "plan of 1 shape x d = 8,11, 2 learning rates, 1 seed, 64 steps;" in text  # counts in words
    planned = pd.read_csv(tmp_path / "plan" / "plan.csv")
    assert planned["recorded"].all()
    assert (planned["model_steps"] == 2 * planned["steps_run"]).all()
    for rules, flags in (("today", []), ("new", ["--give-up", "milestones", "--fill-rounds"])):
        out = tmp_path / rules
        code, _, err = _cli(["transformer", *sizes, *flags, "--device", "cpu", "--quiet", "--out", str(out)], capsys)
        warned = "warning: --give-up milestones was validated on runs of 16,384 steps" in err  # 64 steps here
        assert code == 0 and warned == bool(flags)
        assert planned.loc[planned["rules"] == rules, "model_steps"].sum() == _spent(out)
    assert _spent(tmp_path / "new") < _spent(tmp_path / "today")  # the rule stopped failing probes early
    settings = json.loads((tmp_path / "new" / "settings.json").read_text())
    assert settings["give_up"] == {"rule": "milestones", "milestones": [list(m) for m in MILESTONES],
                                   "up_to_d": MILESTONES_MAX_D}
    assert "give_up" not in json.loads((tmp_path / "today" / "settings.json").read_text())


def test_a_recorded_sweep_resumes_with_todays_rules_and_refuses_the_new_ones(tmp_path, capsys):
    recorded = RESULTS / "paper_fig4_left_authors_seed1"
    out = tmp_path / "sweep"
    shutil.copytree(recorded, out)
    summary = json.loads((recorded / "summary.json").read_text())
    flags = [f for s in summary["sizes"]["shapes"] for f in ("--shape", ",".join(f"{v:g}" for v in s))]
    flags += ["--d", ",".join(map(str, summary["sizes"]["d"])), "--min-size", str(summary["search"]["min_size"]),
              "--answers", "8", "--seq-len", "32",
              "--eval-size", "1024", "--seed", "1", "--device", "cpu", "--quiet", "--out", str(out)]
    code, text, _ = _cli(["transformer", *flags, "--recorded-only"], capsys)
    assert code == 0 and "(0 new training runs)" in text
    assert pd.read_csv(out / "capacity.csv").equals(pd.read_csv(recorded / "capacity.csv"))
    code, _, err = _cli(["transformer", *flags, "--give-up", "milestones"], capsys)
    assert code == 2 and err.count("\n") == 1 and "give_up.rule: recorded (absent), now \"milestones\"" in err


def _rounds(threshold: int, **search) -> tuple[int, list[tuple[int, ...]]]:
    sizes, rounds = bisection(**search), []
    try:
        tried = next(sizes)
        while True:
            rounds.append(tried)
            tried = sizes.send(tuple(n <= threshold for n in tried))
    except StopIteration as stop:
        return stop.value, rounds


@pytest.mark.parametrize("threshold", [1, 3, 40, 74, 90, 103, 104])
def test_filled_rounds_are_never_one_size_alone_and_find_the_same_answer(threshold):
    search = {"start": 56, "lowest": 2, "highest": 104, "grow": 1.5, "probes": 5}
    exact, _ = _rounds(threshold, **search)
    found, rounds = _rounds(threshold, **search, fill=True)
    assert found == exact == min(max(threshold, 1), 104)
    for rel_tol in (0.0, 0.1):
        _, rounds = _rounds(threshold, **search, rel_tol=rel_tol, fill=True)
        lo, hi = 1, 105  # every size in between is open
        for tried in rounds:  # each round as full as the sizes still open allow
            assert len(tried) == len(set(tried)) == min(5, hi - lo - 1), (rounds, tried)
            lo = max([lo] + [n for n in tried if n <= threshold])
            hi = min([hi] + [n for n in tried if n > threshold])
    _, unfilled = _rounds(74, **search, rel_tol=0.1)
    assert min(len(r) for r in unfilled) == 2  # unfilled, the growth reaching --max-size: two sizes of five


def test_the_plan_of_the_full_protocol_is_a_fraction_of_todays(capsys):
    """Recorded sweeps stand in for the sizes they trained, the fitted line elsewhere."""
    shapes = [f for a in (1, 0.25) for f in ("--shape", f"{a:g},1,8")]
    code, text, _ = _cli(["plan", *shapes, "--d", "8,16,128", "--answers", "8", "--seq-len", "32",
                          "--eval-size", "1024"], capsys)
    assert code == 0
    today, new = (int(x.replace(",", "")) for x in re.search(r"total: ([\d,]+) model-steps today, ([\d,]+) with",
                                                               text).groups())
    assert 0 < new < today
    assert "projected on one H100" in text


def test_the_new_rules_replayed_on_the_recorded_sweeps_keep_every_s_star():
    """Each recorded Figure 4 left sweep with curves as its own oracle: under the milestone
    rule every probe it asks for is recorded, and every S* is the recorded one."""
    from analyses.capacity import TransformerSweep
    from analyses.capacity.plan import Oracle, new_rules, plan

    for name in ("paper_fig4_left_authors", "paper_fig4_left_authors_seed1"):
        folder = RESULTS / name
        summary = json.loads((folder / "summary.json").read_text())
        settings = summary["settings"]
        sweep = TransformerSweep(shapes=tuple(tuple(s) for s in summary["sizes"]["shapes"]),
                                 d=tuple(summary["sizes"]["d"]), answers=8, seq_len=32, eval_size=1024,
                                 seed=settings["seed"], min_size=summary["search"]["min_size"])
        probes, found = plan(new_rules(sweep), Oracle((folder,)))
        assert probes["recorded"].all()
        recorded = pd.read_csv(folder / "capacity.csv")
        assert found == {(r.shape, r.d): r.S_star for r in recorded.itertuples()}
        assert probes["model_steps"].sum() < sum(json.loads(p.read_text())["steps_run"] * 3
                                                 for p in (folder / "cells").glob("*.json"))


def test_a_missing_oracle_is_one_line(tmp_path, capsys):
    code, _, err = _cli(["plan", *TINY, "--oracle", str(tmp_path / "none")], capsys)
    assert code == 2 and err.count("\n") == 1 and "no recorded sweep there" in err


def test_the_plan_applies_the_rule_where_the_sweep_applies_it():
    """A probe no recorded sweep answers, failing, at the rule's largest d and one above: the
    plan stops it early exactly where the sweep's own run gives up early."""
    from analyses.capacity import TransformerSweep
    from analyses.capacity.plan import Oracle

    sweep, shape, S = TransformerSweep(give_up="milestones"), (1, 1, 2), 10 ** 6  # far above S*
    oracle = Oracle(())
    assert oracle.give_up_share < 1  # the recorded failing probes stopped early on average
    for d in (MILESTONES_MAX_D, MILESTONES_MAX_D + 1):
        stops = sweep.run(shape, d, 8, "cpu").train.give_up == "milestones"
        row = oracle.probe(sweep, shape, d, S, None)
        assert row["accuracy"] == 0.0 and not row["recorded"]
        assert row["steps_run"] == round((oracle.give_up_share if stops else 1.0) * sweep.steps), d


def test_the_rule_is_off_above_the_validated_sizes():
    from analyses.capacity import TransformerSweep

    sweep = TransformerSweep(give_up="milestones")
    assert sweep.run((1, 1, 2), MILESTONES_MAX_D, 8, "cpu").train.give_up == "milestones"
    assert sweep.run((1, 1, 2), MILESTONES_MAX_D + 1, 8, "cpu").train.give_up == "never"
    assert replace(sweep, give_up="never").run((1, 1, 2), 8, 8, "cpu").train.give_up == "never"


@pytest.mark.parametrize("folder, kind", [("tradeoff/grid", "tradeoff grid"), ("capacity/mlp", "capacity memory"),
                                          ("capacity/departures", "capacity departures")])
def test_an_oracle_of_another_kind_of_sweep_is_refused_in_one_line(folder, kind, capsys):
    oracle = RESULTS.parent / folder
    code, _, err = _cli(["plan", "--shape", "1,1,2", "--d", "8", "--oracle", str(oracle)], capsys)
    assert code == 2 and err == (f"error: --oracle {oracle}: holds a '{kind}' sweep (its settings.json), not a "
                                 "transformer capacity sweep; --oracle takes the --out of `python -m analyses.capacity "
                                 "transformer`.\n")
def test_the_stand_in_is_the_recorded_s_star_else_the_fitted_line_with_the_shape_s_offset():
    """S* where a sweep recorded it; elsewhere sqrt of the facts the line fitted to recorded
    facts against parameters gives (log facts = intercept + the shape's offset + slope log
    parameters), never below the search's lowest size."""
    from analyses.capacity import TransformerSweep
    from analyses.capacity.plan import Oracle, parameters
    from analyses.capacity.transformer import LOWEST
    from models.recall.weights import parameter_count

    sweep, shape = TransformerSweep(), (1, 1, 2)
    run = sweep.run(shape, 16, LOWEST, "cpu")
    P = parameter_count(run.model.checkpoint_section(run.task.build()))["total"]
    assert parameters(sweep, shape, 16) == P
    oracle = Oracle(())
    oracle.s_star, oracle.slope, oracle.intercept = {("1,1,2", 8): 17}, 0.8, math.log(0.3)
    oracle.offset = {"1,1,2": 0.5, "1,1,4": -3.0}
    assert oracle.stand_in(sweep, shape, 8) == oracle.stand_in(sweep, (1, 1, 2, 64), 8) == 17  # a row's largest d aside
    assert oracle.probe(sweep, (1, 1, 2, 64), 8, 3, None)["shape"] == "1,1,2"
    assert oracle.stand_in(sweep, shape, 16) == int(math.sqrt(math.exp(math.log(0.3) + 0.5 + 0.8 * math.log(P))))
    assert oracle.stand_in(sweep, shape, 16) > LOWEST + 1
    run = sweep.run((2, 2, 2), 16, LOWEST, "cpu")  # no offset of its own
    P = parameter_count(run.model.checkpoint_section(run.task.build()))["total"]
    assert oracle.stand_in(sweep, (2, 2, 2), 16) == int(math.sqrt(math.exp(math.log(0.3) + 0.8 * math.log(P))))
    oracle.intercept = -50.0
    assert oracle.stand_in(sweep, shape, 16) == LOWEST - 1  # the line gives no fact: every probe fails


def test_the_default_oracle_is_the_recorded_figure_4_left_sweep_of_the_sweep_s_model():
    from analyses.capacity import TransformerSweep
    from analyses.capacity.plan import default_oracle

    assert [f.name for f in default_oracle(TransformerSweep(parameterisation="standard")).folders] == [
        "paper_fig4_left"]
    assert [f.name for f in default_oracle(TransformerSweep()).folders] == [  # the authors' model, the default
        "paper_fig4_left_authors", "paper_fig4_left_authors_seed1"]


def test_the_plan_s_text_says_what_its_probes_spend(monkeypatch):
    """plan_text's lines from the two plans it is given: per shape and d the model-steps and
    probes today -> new, the totals and their ratio, the S* that moved, the time on an H100
    and at a given rate."""
    import analyses.capacity.plan as plan_module
    from analyses.capacity import TransformerSweep

    def probes(rows):
        return pd.DataFrame(rows, columns=["shape", "d", "S", "seed", "accuracy", "steps_run", "model_steps",
                                           "recorded"])
    today_rows = [("1,1,2", 8, 4, None, 1.0, 500, 10 ** 6, True),
                  ("1,1,2", 8, 6, None, 0.0, 12000, 24 * 10 ** 6, False),
                  ("1,1,2", 11, 6, None, 1.0, 5000, 10000, False)]
    new_rows = [("1,1,2", 8, 4, None, 1.0, 500, 10 ** 6, True), ("1,1,2", 8, 6, None, 0.0, 3000, 6 * 10 ** 6, False)]
    planned = {"never": (probes(today_rows), {("1,1,2", 8): 4, ("1,1,2", 11): 6}),
               "milestones": (probes(new_rows), {("1,1,2", 8): 5, ("1,1,2", 11): 7})}
    monkeypatch.setattr(plan_module, "plan", lambda sweep, oracle: planned[sweep.give_up])
    sweep = TransformerSweep(shapes=((1, 1, 2),), d=(8, 11), lr=(0.01, 0.03), steps=16384)
    text, table = plan_module.plan_text(sweep, None, 200.0)
    today, new = 25010000, 7000000
    assert text.splitlines() == [
        "plan of 1 shape x d = 8,11, 2 learning rates, 1 seed, 16384 steps; model-steps today -> new rules "
        "(probes in brackets):",
        "  1,1,2       d=8: 25000k -> 7000k (2 -> 2); d=11: 10k -> 0 (1 -> 0)",
        f"total: 25,010,000 model-steps today, 7,000,000 with the new rules ({new / today:.2f}x); recorded probes "
        "stand in for 2 of 5",
        "S* with the new rules: the same as today's at 0 of 2 sizes (moved: 1,1,2 d=8: 4 -> 5; 1,1,2 d=11: 6 -> 7)",
        f"projected on one H100 at 6,827 model-steps/s (its record: 15 models x 16,384 steps in 23-36 s at d = 128): "
        f"{today / plan_module.H100_RATE / 60:.1f} min today, {new / plan_module.H100_RATE / 60:.1f} min with the "
        "new rules",
        f"projected at the recorded probes' rate (200 model-steps/s): {today / 200 / 60:.1f} min today, "
        f"{new / 200 / 60:.1f} min new"]
    assert f"{new / plan_module.H100_RATE / 60:.1f}" != f"{new / plan_module.H100_RATE / 61:.1f}"  # minutes, not 61
    assert list(table["rules"]) == ["today"] * 3 + ["new"] * 2
    one = (probes([("1,1,2", 8, 4, None, 1.0, 1, 1, False)]), {("1,1,2", 8): 4})
    planned.update(never=one, milestones=one)
    lines = plan_module.plan_text(sweep, None, None)[0].splitlines()
    assert lines[2:4] == [
        "total: 1 model-steps today, 1 with the new rules (1.00x); recorded probes stand in for 0 of 2",
        "S* with the new rules: the same as today's at 1 of 1 sizes"] and len(lines) == 5


def test_the_plan_searches_rounds_of_sizes_and_seeds_as_the_sweep_does(monkeypatch):
    """Two seeds, three sizes a round: each round is every size with every seed; today's
    rounds are the search's own and the new rules fill them, whatever the sweep asked, so the
    sizes planned at each d are the bisection's with and without filling, and both find the
    oracle's S*."""
    import analyses.capacity.plan as plan_module
    from analyses.capacity import TransformerSweep
    from analyses.capacity.plan import Oracle, new_rules, plan, today
    from analyses.capacity.transformer import LOWEST

    oracle = Oracle(())
    oracle.s_star = {("1,1,2", 8): 13, ("1,1,2", 11): 20}
    bars, run_jobs = [], plan_module.run_jobs
    monkeypatch.setattr(plan_module, "run_jobs", lambda *a, **kw: bars.append(kw.get("progress", True)) or
                        run_jobs(*a, **kw))
    for own in (False, True):  # the sweep's own --fill-rounds: the rules set it
        sweep = TransformerSweep(shapes=((1, 1, 2),), d=(8, 11), seeds=(0, 1), probes=3, min_size=4, max_size=24,
                                 steps=100, lr=(0.01, 0.03), fill_rounds=own)
        tried = {}
        for name, rules, fill in (("today", today, False), ("new", new_rules, True)):
            probes, found = plan(rules(sweep), oracle)
            assert found == {("1,1,2", 8): 13, ("1,1,2", 11): 20}
            start, tried[name] = 4, []
            for d, s_star in ((8, 13), (11, 20)):
                _, rounds = _rounds(s_star, start=start, lowest=LOWEST, highest=24, grow=1.5, rel_tol=0.1, probes=3,
                                    fill=fill)
                at_d = probes[probes["d"] == d]
                planned = sorted((S, seed) for r in rounds for S in r for seed in (0, 1))
                assert sorted(zip(at_d["S"], at_d["seed"])) == planned
                assert (at_d["accuracy"] == (at_d["S"] <= s_star).astype(float)).all()
                failing = oracle.give_up_share if name == "new" else 1.0  # the rule is on at these d
                share = at_d["accuracy"].map({1.0: oracle.pass_share, 0.0: failing})
                assert (at_d["steps_run"] == (share * sweep.steps).round()).all()
                tried[name].append(rounds)
                start = s_star
            assert (probes["model_steps"] == 2 * probes["steps_run"]).all() and (probes["shape"] == "1,1,2").all()
        assert tried["today"] != tried["new"]  # filling changed a round here
    assert bars == [False] * 4  # a plan takes no time: no progress bar


def test_the_oracle_reads_its_sweeps_tables_and_the_recorded_rate(tmp_path):
    """S* by shape and d (the median over the sweeps), the line of log facts on log parameters
    over the sizes that stored a fact and each shape's offset from it; the model-steps per
    second its cells record."""
    from analyses.capacity.plan import Oracle, recorded_rate

    rows = [("1,1,2", 8, 3, 9, 100), ("1,1,2", 11, 4, 16, 150), ("1,1,4", 8, 5, 25, 300), ("1,1,4", 11, 0, 0, 400)]
    folders = []
    for n, part in enumerate((rows[:2], rows[2:])):
        folder = tmp_path / f"sweep{n}"
        (folder / "cells").mkdir(parents=True)
        pd.DataFrame(part, columns=["shape", "d", "S_star", "facts", "parameters"]).to_csv(folder / "capacity.csv",
                                                                                          index=False)
        (folder / "settings.json").write_text(json.dumps({"lr": [0.01, 0.03, 0.1][:n + 2]}))
        for i, (steps, seconds) in enumerate(((100, 2.0), (300, 4.0))[:n + 1]):
            (folder / "cells" / f"c{i}.json").write_text(json.dumps({"steps_run": steps, "seconds": seconds}))
        folders.append(folder)
    oracle = Oracle(tuple(folders))
    assert oracle.s_star == {("1,1,2", 8): 3, ("1,1,2", 11): 4, ("1,1,4", 8): 5}  # facts 0: no S* to stand in
    stored = pd.DataFrame(rows[:3], columns=["shape", "d", "S_star", "facts", "parameters"])
    slope, intercept = np.polyfit(np.log(stored["parameters"]), np.log(stored["facts"]), 1)
    assert (oracle.slope, oracle.intercept) == pytest.approx((slope, intercept))
    residual = np.log(stored["facts"]) - (intercept + slope * np.log(stored["parameters"]))
    assert oracle.offset == pytest.approx({"1,1,2": residual[:2].mean(), "1,1,4": residual[2]})
    assert set(oracle.settings) == set(folders)
    assert recorded_rate(oracle) == pytest.approx((100 * 2 + 100 * 3 + 300 * 3) / (2.0 + 2.0 + 4.0))
    one, two = Oracle((folders[1],)), Oracle((folders[0],))  # one size that stored facts, then two
    assert (one.slope, one.intercept) == (1.0, math.log(0.1))
    assert (two.slope, two.intercept) == pytest.approx(tuple(np.polyfit(np.log([100, 150]), np.log([9, 16]), 1)))
    empty = Oracle((tmp_path / "none",))
    assert (empty.slope, empty.intercept, empty.s_star) == (1.0, math.log(0.1), {}) and recorded_rate(empty) is None


def test_a_sweep_over_seeds_recorded_with_other_torch_threads_answers_every_probe(tmp_path):
    """A recorded sweep over seeds answers each (size, seed) probe from its own cell, whatever
    torch threads it computed with."""
    from analyses.capacity import TransformerSweep
    from analyses.capacity.plan import Oracle, new_rules, plan, today
    from analyses.capacity.transformer import probe_key
    from analyses.sweeps.cells import Cells

    sweep = TransformerSweep(shapes=((1, 1, 2),), d=(8,), seeds=(0, 1), min_size=4, max_size=24, steps=100)
    cells = Cells(tmp_path, today(sweep).recorded(), torch_threads=2)
    curve = {"step": [0, 25, 50, 75, 100], "accuracy": [0.5] * 5}
    flat = {"accuracy": 0.5, "steps_run": 100, "runs": [{"lr": 0.01, "best_accuracy": 0.5, "curve": curve}]}
    for S in range(2, 25):
        for seed in (0, 1):  # seed 1 stores one size more: the majority (both) decides
            row = {"accuracy": 1.0, "steps_run": 40 + S} if S <= 7 + seed else flat
            cells.record(probe_key((1, 1, 2), 8, S, seed), row)
    oracle = Oracle((tmp_path,))
    probes, found = plan(today(sweep), oracle)
    stored = probes["S"] <= 7 + probes["seed"]
    assert found == {("1,1,2", 8): 7} and probes["recorded"].all()
    assert (probes["steps_run"] == (40 + probes["S"]).where(stored, 100)).all()
    assert (probes["accuracy"] == stored.map({True: 1.0, False: 0.5})).all()
    probes, found = plan(new_rules(sweep), oracle)  # the rule stops the failing ones at a quarter: they fail there
    stored = probes["S"] <= 7 + probes["seed"]
    assert found == {("1,1,2", 8): 7} and probes["recorded"].all()
    assert (probes["steps_run"] == (40 + probes["S"]).where(stored, 25)).all()
    assert (probes["accuracy"] == stored.map({True: 1.0, False: 0.0})).all()


def test_the_oracle_s_shares_of_the_budget_are_the_recorded_probes(monkeypatch):
    """The share of its step budget a passing probe spent (99% itself passes), and a failing
    one's up to where the milestone rule stops it, else its end; 1 where nothing is recorded."""
    import analyses.capacity.plan as plan_module
    from analyses.capacity.plan import Oracle

    steps = list(range(0, 16385, 1024))
    flat = _curve_row([0.5] * len(steps), steps)  # stopped at 4096 of 16384
    ended = _curve_row([0.985] * 2, [0, 1024])  # never stopped: it ended at 1024
    recorded = [("a", {"accuracy": 0.99, "steps_run": 4096}, 16384), ("a", {"accuracy": 1.0, "steps_run": 8192}, 16384),
                ("b", flat, 16384), ("b", ended, 16384)]
    monkeypatch.setattr(plan_module, "recorded_probes", lambda root: (recorded, []))
    oracle = Oracle(())
    assert oracle.pass_share == pytest.approx((0.25 + 0.5) / 2)
    assert oracle.give_up_share == pytest.approx((0.25 + 1024 / 16384) / 2)
    monkeypatch.setattr(plan_module, "recorded_probes", lambda root: ([], []))
    assert (Oracle(()).pass_share, Oracle(()).give_up_share) == (1.0, 1.0)
