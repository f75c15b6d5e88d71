"""The milestone rule (a run that cannot reach 99% gives up early), its validation on the
recorded curves, rounds that fill their stack, and `analyses.capacity plan`."""
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

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
    model-steps, today's and with the milestone rule, are what each sweep then spends."""
    oracle = tmp_path / "oracle"
    assert _cli(["transformer", *TINY, "--device", "cpu", "--quiet", "--out", str(oracle)], capsys)[0] == 0
    code, text, _ = _cli(["plan", *TINY, "--oracle", str(oracle), "--out", str(tmp_path / "plan")], capsys)
    assert code == 0 and "stopped wrongly" in text and "model-steps today" in text
    assert "plan of 1 shape x d = 8,11, 1 learning rate, 1 seed, 64 steps;" in text  # counts in words
    planned = pd.read_csv(tmp_path / "plan" / "plan.csv")
    assert planned["recorded"].all()
    for rules, flags in (("today", []), ("new", ["--give-up", "milestones", "--fill-rounds"])):
        out = tmp_path / rules
        code, _, err = _cli(["transformer", *TINY, *flags, "--device", "cpu", "--quiet", "--out", str(out)], capsys)
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
