"""The transformer capacity sweep without its training: the settings' refusals and records,
each run's configuration, the cells' keys, a probe's row from a stand-in result, the search's
bookkeeping from cells written by hand, and the tables and text from rows written by hand.
(Training the cells: tests/test_capacity_transformer.py.)"""
import json
import math

import pandas as pd
import pytest
import torch

from analyses.capacity import transformer as tf
from analyses.capacity.transformer import (
    TransformerSweep,
    paper_window,
    probe_cell,
    probe_key,
    probe_row,
    round_cell,
    search_transformers,
    shape_capacity,
    transformer_tables,
    transformer_text,
    write_transformer,
)
from analyses.least_squares import fit_log_log
from analyses.sweeps.cells import Cells
from analyses.sweeps.executors import ExecutorSettings
from models.recall.config import MILESTONES
from models.recall.weights import parameter_count

SHAPE = (1.0, 1.0, 2.0)


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize("field, value, message", [
    ("d", (8, 0), "--d must be >= 1, got 8,0."),
    ("answers", 1, "--answers must be >= 2, got 1."),
    ("seq_len", 2, "--seq-len must be >= 3, got 2."),
    ("steps", 0, "--steps must be >= 1, got 0."),
    ("batch_size", 0, "--batch-size must be >= 1, got 0."),
    ("eval_every", 0, "--eval-every must be >= 1, got 0."),
    ("eval_size", 0, "--eval-size must be >= 1, got 0."),
    ("min_size", 1, "--min-size must be >= 2, got 1."),
    ("probes", 0, "--probes must be >= 1, got 0."),
    ("max_size", 7, "--max-size must be >= 8, got 7."),
    ("lr", (0.01, 0.0), "--lr must be > 0, got 0.01,0.0."),
])
def test_each_transformer_setting_below_its_minimum_is_refused_by_name(field, value, message):
    with pytest.raises(ValueError) as refused:
        TransformerSweep(**{field: value})
    assert str(refused.value) == message


def test_every_transformer_setting_at_its_minimum_is_taken():
    sweep = TransformerSweep(shapes=((1.0, 1.0, 1.0),), d=(1,), answers=2, seq_len=3, steps=1, batch_size=1,
                             eval_every=1, eval_size=1, min_size=2, max_size=2, probes=1, lr=(1e-9,))
    assert sweep.sizes((1.0, 1.0, 1.0)) == [1]


def test_a_shape_is_refused_with_the_reason_at_its_largest_searched_d():
    assert TransformerSweep(shapes=((1.0, 1.0, 2.0, 8.0),), d=(8, 16)).sizes((1.0, 1.0, 2.0, 8.0)) == [8]
    with pytest.raises(ValueError) as refused:
        TransformerSweep(shapes=((1.0, 1.0, 2.0, 4.0),), d=(8, 16))
    assert str(refused.value) == "shape 1,1,2,4: its largest d is below every --d."
    with pytest.raises(ValueError) as refused:  # d_head rounds to 0 at every d up to 16
        TransformerSweep(shapes=((0.25, 4.0, 8.0, 16.0),), d=(8, 16, 32))
    assert str(refused.value) == ("shape alpha=0.25, beta=4, H=8 gives d_head=0, d_mlp=64 at d=16 (rounded down); "
                                  "both must be >= 1.")


def test_a_shape_s_sizes_leave_out_those_its_mlp_width_rounds_to_zero():
    sweep = TransformerSweep(shapes=((1.0, 0.1, 8.0),), d=(8, 16))  # m = int(0.1 d): 0 at d = 8
    assert sweep.sizes((1.0, 0.1, 8.0)) == [16]


def test_a_run_is_the_papers_task_at_s_equals_r_with_the_sweeps_training():
    sweep = TransformerSweep(d=(8, 64, 128), answers=3, seq_len=6, lr=(0.02, 0.05), seed=4, steps=70, batch_size=48,
                             eval_every=7, eval_size=96, sampler="generator", cuda_graph="off", give_up="milestones")
    run = sweep.run((0.5, 2.0, 2.0), 8, 5, "cpu")
    t = run.task
    assert (t.n_subjects, t.n_relations, t.answers_per_relation, t.n_noise, t.seq_len) == (5, 5, 3, 10, 6)
    assert run.model == sweep.model((0.5, 2.0, 2.0), 8)
    assert (run.model.d_model, run.model.n_heads, run.model.d_head, run.model.d_mlp) == (8, 2, 2, 16)
    tr = run.train
    assert (tr.lr, tr.seed, tr.steps, tr.batch_size, tr.eval_every, tr.eval_size) == ((0.02, 0.05), (4,), 70, 48, 7,
                                                                                      96)
    assert (tr.target_accuracy, tr.snapshots_per_octave, tr.give_up) == (0.99, 0, "milestones")
    assert (tr.device, tr.sampler, tr.cuda_graph) == ("cpu", "generator", "off")
    assert sweep.run((0.5, 2.0, 2.0), 8, 5, "cpu", seed=9).train.seed == (9,)
    assert sweep.run((0.5, 2.0, 2.0), 64, 5, "cpu").train.give_up == "milestones"  # the largest validated size
    assert sweep.run((0.5, 2.0, 2.0), 128, 5, "cpu").train.give_up == "never"  # above the validated sizes


def test_the_model_takes_the_sweeps_parameterisation_and_embedding():
    standard = TransformerSweep(parameterisation="standard", embedding="gaussian").model((0.5, 1.0, 2.0), 8)
    assert (standard.parameterisation, standard.embedding, standard.d_head, standard.d_mlp) == ("standard",
                                                                                               "gaussian", 2, 8)
    assert TransformerSweep(embedding="sphere").model(SHAPE, 8).embedding == "sphere"
    assert TransformerSweep().model(SHAPE, 8).embedding == "gaussian"  # auto: the authors' embedding


def test_the_recorded_settings_name_what_every_run_shares():
    base = {"analysis": "capacity transformer", "answers": 3, "seq_len": 6, "lr": [0.02], "seed": 4, "steps": 70,
            "batch_size": 48, "eval_every": 7, "eval_size": 96}
    kw = dict(answers=3, seq_len=6, lr=(0.02,), seed=4, steps=70, batch_size=48, eval_every=7, eval_size=96)
    assert TransformerSweep(**kw, parameterisation="standard", sampler="generator").recorded() == base
    assert TransformerSweep(**kw, parameterisation="standard", embedding="sphere",
                            sampler="generator").recorded() == base
    assert TransformerSweep(**kw, parameterisation="standard", embedding="gaussian").recorded() == {
        **base, "model": {"embedding": "gaussian"}, "sampler": "counter"}
    assert TransformerSweep(**kw, embedding="sphere", sampler="generator").recorded() == {
        **base, "model": {"parameterisation": "authors", "embedding": "sphere"}}
    seeds = TransformerSweep(**kw, seeds=(0, 1, 2), parameterisation="standard", sampler="generator",
                             give_up="milestones").recorded()
    assert seeds == {**{k: v for k, v in base.items() if k != "seed"}, "search": "majority of seeds",
                     "give_up": {"rule": "milestones", "milestones": [list(m) for m in MILESTONES], "up_to_d": 64}}
    assert list(seeds)[:5] == ["analysis", "answers", "seq_len", "lr", "search"]


# ------------------------------------------------------------------ cells
def test_cell_keys_name_the_shape_size_and_seed():
    assert probe_key((0.5, 2.0, 4.0), 8, 5) == "shape0.5,2,4_d8_S5"
    assert probe_key((0.5, 2.0, 4.0), 8, 5, 0) == "shape0.5,2,4_d8_S5_seed0"


def test_a_probe_cell_and_a_round_cell_keep_each_model_under_its_own_key(tmp_path):
    sweep = TransformerSweep(shapes=((0.5, 2.0, 4.0),), seeds=(0, 1))
    cells = Cells(tmp_path, sweep.recorded(), keep_checkpoints=True)
    cell = probe_cell((0.5, 2.0, 4.0), 8, 5, sweep, "cpu", cells)
    assert cell.key == "shape0.5,2,4_d8_S5" and cell.fn is tf.transformer_row
    assert cell.args == ((0.5, 2.0, 4.0), 8, 5, sweep, "cpu", cells.checkpoint("shape0.5,2,4_d8_S5"))
    assert cell.args[-1] == (tmp_path / "checkpoints" / "shape0.5,2,4_d8_S5").resolve()
    stack = round_cell((0.5, 2.0, 4.0), 8, (3, 5), sweep, "cpu", cells)
    parts = ("shape0.5,2,4_d8_S3_seed0", "shape0.5,2,4_d8_S3_seed1", "shape0.5,2,4_d8_S5_seed0",
             "shape0.5,2,4_d8_S5_seed1")
    assert stack.key == "shape0.5,2,4_d8_S3+5_seeds0,1" and stack.parts == parts and stack.fn is tf.round_rows
    assert stack.args[:5] == ((0.5, 2.0, 4.0), 8, (3, 5), sweep, "cpu")
    assert stack.args[5] == {k: (tmp_path / "checkpoints" / k).resolve() for k in parts}
    assert stack.args[6] == (tmp_path / "state" / stack.key).resolve()  # the round resumes from it


class _Result:
    """A stand-in for a training result: each learning rate's evaluation curve (rows of
    accuracies, one per learning rate; by default 0.5 throughout)."""

    def __init__(self, run, accuracies=None):
        self.run, self.saved = run, []
        accuracies = accuracies or [[0.5] * len(run.train.runs)] * 3
        self.metrics = [{"step": 10 * i, "models": [{"accuracy": a} for a in row]} for i, row in enumerate(accuracies)]
        self.training = {"final_accuracy": 0.9, "lr": run.train.lr[0], "steps_run": 20, "seconds": 1.5}
        self.section = run.model.checkpoint_section(run.task.build())

    def save(self, path):
        self.saved.append(path)


def test_a_probe_row_records_each_learning_rates_best_last_and_curve():
    sweep = TransformerSweep(lr=(0.01, 0.03), answers=2, seq_len=4)
    run = sweep.run((0.5, 2.0, 4.0), 8, 3, "cpu")
    result = _Result(run, ((0.1234567, 0.2), (0.9, 0.5), (0.8, 0.6)))
    row = probe_row((0.5, 2.0, 4.0), 8, 3, run, result)
    assert row == {"alpha": 0.5, "beta": 2.0, "heads": 4.0, "d": 8, "S": 3, "facts": 9, "accuracy": 0.9,
                   "best_accuracy": 0.9, "lr": 0.01, "steps_run": 20, "seconds": 1.5,
                   "parameters": parameter_count(result.section)["total"],
                   "runs": [{"lr": 0.01, "best_accuracy": 0.9, "final_accuracy": 0.8,
                             "curve": {"step": [0, 10, 20], "accuracy": [0.12346, 0.9, 0.8]}},
                            {"lr": 0.03, "best_accuracy": 0.6, "final_accuracy": 0.6,
                             "curve": {"step": [0, 10, 20], "accuracy": [0.2, 0.5, 0.6]}}]}
    assert list(row)[:6] == ["alpha", "beta", "heads", "d", "S", "facts"]


def _stand_in_training(monkeypatch):
    """Replace the trainers the cells call; the calls they received."""
    calls = []

    def train(run, *, progress):
        calls.append(("train", run, progress))
        return _Result(run)

    def train_stacks(runs, *, progress, state_folder=None):
        calls.append(("stacks", tuple(runs), progress) + ((state_folder,) if state_folder else ()))
        return [_Result(run) for run in runs]

    monkeypatch.setattr(tf, "train", train)
    monkeypatch.setattr(tf, "train_stacks", train_stacks)
    monkeypatch.setattr(tf, "resolve_device", torch.device)  # "cuda" names a CUDA device on any machine
    return calls


def test_a_probe_trains_quietly_and_keeps_its_model_where_asked(monkeypatch, tmp_path):
    calls = _stand_in_training(monkeypatch)
    sweep = TransformerSweep(answers=2, seq_len=4)
    row = tf.transformer_row(SHAPE, 8, 3, sweep, "cpu", tmp_path / "kept")
    ((kind, run, progress),) = calls
    assert (kind, run, progress) == ("train", sweep.run(SHAPE, 8, 3, "cpu"), False)
    assert (row["d"], row["S"], row["facts"]) == (8, 3, 9)


@pytest.mark.parametrize("stack, device, stacked", [("on", "cpu", True), ("off", "cuda", False),
                                                     ("auto", "cpu", False), ("auto", "cuda", True)])
def test_a_round_trains_every_size_and_seed_stacked_where_told(stack, device, stacked, monkeypatch, tmp_path):
    calls = _stand_in_training(monkeypatch)
    sweep = TransformerSweep(answers=2, seq_len=4, seeds=(3, 5), stack=stack)
    keep = {probe_key(SHAPE, 8, 2, 3): tmp_path / "a", probe_key(SHAPE, 8, 4, 5): None}
    rows = tf.round_rows(SHAPE, 8, (2, 4), sweep, device, keep, tmp_path / "state")
    runs = [sweep.run(SHAPE, 8, S, device, seed) for S in (2, 4) for seed in (3, 5)]
    assert [run.train.seed for run in runs] == [(3,), (5,), (3,), (5,)]
    if stacked:
        assert calls == [("stacks", tuple(runs), False, tmp_path / "state")]
    else:
        assert calls == [("train", run, False) for run in runs]
    assert list(rows) == [probe_key(SHAPE, 8, S, seed) for S in (2, 4) for seed in (3, 5)]
    assert [(r["S"], r["seed"], r["d"]) for r in rows.values()] == [(2, 3, 8), (2, 5, 8), (4, 3, 8), (4, 5, 8)]


def test_a_round_saves_the_models_it_is_asked_to_keep(monkeypatch, tmp_path):
    saved = []
    monkeypatch.setattr(_Result, "save", lambda self, path: saved.append((self.run.task.n_subjects,
                                                                           self.run.train.seed, path)))
    _stand_in_training(monkeypatch)
    sweep = TransformerSweep(answers=2, seq_len=4, seeds=(3, 5), stack="off")
    keep = {probe_key(SHAPE, 8, 2, 3): tmp_path / "a", probe_key(SHAPE, 8, 4, 5): None}
    tf.round_rows(SHAPE, 8, (2, 4), sweep, "cpu", keep)
    assert saved == [(2, (3,), tmp_path / "a")]
    saved.clear()
    tf.transformer_row(SHAPE, 8, 3, sweep, "cpu", tmp_path / "b")
    tf.transformer_row(SHAPE, 8, 3, sweep, "cpu")
    assert saved == [(3, (sweep.seed,), tmp_path / "b")]


# ------------------------------------------------------------------ the search
def _drive(job, accuracy):
    """Run a search job against an oracle accuracy(d, S); every size asked, in order."""
    asked = []
    try:
        request = next(job)
        while True:
            sizes = [cell.args[1:3] for cell in request]
            asked.extend(sizes)
            request = job.send(tuple({"accuracy": accuracy(d, S)} for d, S in sizes))
    except StopIteration:
        return asked


def test_the_search_grows_by_half_and_bisects_to_ten_percent_from_the_smallest_size(tmp_path):
    sweep = TransformerSweep(d=(8,), min_size=4, max_size=512)
    found = {}
    cells = Cells(tmp_path, sweep.recorded())
    asked = _drive(shape_capacity(SHAPE, sweep, "cpu", found, cells), lambda d, S: 0.99 if S <= 20 else 0.5)
    assert [S for _, S in asked] == [4, 6, 9, 13, 19, 28, 23, 21, 20]  # x1.5 up, then halves to within 10%
    assert found == {8: 20}
    found = {}
    asked = _drive(shape_capacity(SHAPE, sweep, "cpu", found, cells), lambda d, S: 0.5)
    assert [S for _, S in asked] == [4, 2] and found[8] < 2  # down to the smallest size searched, 2


def test_the_search_stops_within_ten_percent_and_fills_its_rounds_when_told(tmp_path):
    sweep = TransformerSweep(d=(8,), min_size=4, max_size=512)
    cells, found = Cells(tmp_path, sweep.recorded()), {}
    asked = _drive(shape_capacity(SHAPE, sweep, "cpu", found, cells), lambda d, S: 0.99 if S <= 30 else 0.5)
    assert [S for _, S in asked] == [4, 6, 9, 13, 19, 28, 42, 35, 31, 29] and found == {8: 29}  # 29..31: within 10%
    for fill, rounds in ((False, [(8, 4), (12,)]), (True, [(8, 4), (12, 10)])):
        sweep = TransformerSweep(d=(8,), min_size=8, max_size=12, probes=2, fill_rounds=fill)
        job, asked = shape_capacity(SHAPE, sweep, "cpu", {}, cells), []
        try:  # every size stored: the growth reaches --max-size in a round of one size, topped up with fill
            request = next(job)
            while True:
                asked.append(tuple(cell.args[2] for cell in request))
                request = job.send(tuple({"accuracy": 1.0} for _ in request))
        except StopIteration as stop:
            assert stop.value == {8: 12}
        assert asked == rounds


def test_the_majority_and_the_votes_count_exactly_99_percent_as_stored(tmp_path):
    from analyses.capacity.transformer import stored_by_most

    assert stored_by_most(({"accuracy": 0.99}, {"accuracy": 0.99}, {"accuracy": 0.5})) is True
    sweep = TransformerSweep(shapes=((1.0, 1.0, 2.0, 8.0),), d=(8,), min_size=2, max_size=2, seeds=(0, 1, 2),
                             answers=2, seq_len=4)
    cells = Cells(tmp_path, sweep.recorded())
    for seed, accuracy in zip((0, 1, 2), (0.99, 0.99, 0.5)):
        cells.record(probe_key(SHAPE, 8, 2, seed), {"accuracy": accuracy})
    rows = search_transformers(sweep, cells, ExecutorSettings(), "cpu", progress=False, compute=False)
    params = parameter_count(sweep.run(SHAPE, 8, 2, "cpu").model.checkpoint_section(
        sweep.run(SHAPE, 8, 2, "cpu").task.build()))["total"]
    assert rows == [{"shape": "1,1,2", "d": 8, "S_star": 2, "facts": 4, "parameters": params,
                     "facts_per_parameter": 4 / params, "seeds": 3, "stored_by": 2}]


def test_the_search_rows_read_the_recorded_probes(tmp_path):
    sweep = TransformerSweep(shapes=((1.0, 1.0, 2.0, 16.0), (1.0, 1.0, 1.0)), d=(8, 16), min_size=2, max_size=3,
                             answers=2, seq_len=4)
    cells = Cells(tmp_path, sweep.recorded())
    for d, S, accuracy in ((8, 2, 0.99), (8, 3, 0.5), (16, 2, 0.5)):
        cells.record(probe_key(SHAPE, d, S), {"accuracy": accuracy})
    cells.record(probe_key((1.0, 1.0, 1.0), 8, 2), {"accuracy": 0.99})
    cells.record(probe_key((1.0, 1.0, 1.0), 8, 3), {"accuracy": 0.99})
    rows = search_transformers(sweep, cells, ExecutorSettings(), "cpu", progress=False, compute=False)

    def params(shape, d):
        run = sweep.run(shape, d, 2, "cpu")
        return parameter_count(run.model.checkpoint_section(run.task.build()))["total"]

    assert rows == [
        {"shape": "1,1,2", "d": 8, "S_star": 2, "facts": 4, "parameters": params(SHAPE, 8),
         "facts_per_parameter": 4 / params(SHAPE, 8)},
        {"shape": "1,1,2", "d": 16, "S_star": 0, "facts": 0, "parameters": params(SHAPE, 16),
         "facts_per_parameter": 0.0},  # not even the smallest size: nothing stored
        {"shape": "1,1,1", "d": 8, "S_star": 3, "facts": 9, "parameters": params((1.0, 1.0, 1.0), 8),
         "facts_per_parameter": 9 / params((1.0, 1.0, 1.0), 8)}]  # the second shape stops at d = 8: 16 not recorded


def test_a_search_trains_what_is_not_recorded_unless_told_not_to(monkeypatch, tmp_path):
    calls = _stand_in_training(monkeypatch)  # every probe ends at 0.9: nothing stored
    sweep = TransformerSweep(shapes=((1.0, 1.0, 2.0, 8.0),), d=(8,), min_size=2, max_size=2, answers=2, seq_len=4)
    cells = Cells(tmp_path, sweep.recorded())
    assert search_transformers(sweep, cells, ExecutorSettings(), "cpu", progress=False, compute=False) == []
    assert calls == []
    (row,) = search_transformers(sweep, cells, ExecutorSettings(), "cpu")
    assert [kind for kind, *_ in calls] == ["train"] and cells.recorded(probe_key(SHAPE, 8, 2))["accuracy"] == 0.9
    assert (row["d"], row["S_star"]) == (8, 0)


def test_the_paper_window_keeps_each_shapes_order_and_an_open_end():
    table = pd.DataFrame({"shape": ["b", "b", "a", "a", "a"], "d": [16, 8, 8, 11, 16],
                          "facts": [11000, 81, 81, 11000, 11001]})
    shown = paper_window(table)
    assert list(zip(shown["shape"], shown["d"])) == [("b", 8), ("b", 16), ("a", 8), ("a", 11)]


# ------------------------------------------------------------------ tables and text
def _row(shape, d, S, parameters):
    return {"parameters": parameters, "facts_per_parameter": S * S / parameters, "S_star": S, "d": d,
            "shape": shape, "facts": S * S}


SWEEP = TransformerSweep(shapes=((1.0, 1.0, 2.0), (0.25, 4.0, 8.0, 45.0)), d=(8, 16, 32, 45), answers=4,
                         min_size=4, max_size=300, probes=2, fill_rounds=True, facts_per_parameter=0.2,
                         bits_per_parameter=1.5)
ROWS = [_row("1,1,2", 8, 9, 400), _row("1,1,2", 16, 0, 900), _row("1,1,2", 32, 100, 2500),
        _row("0.25,4,8", 32, 12, 1000)]


def test_the_tables_fit_facts_against_parameters_overall_and_per_shape():
    result = transformer_tables(ROWS, SWEEP, pd.DataFrame({"x": [1]}), computed=7)
    assert list(result.table.columns) == ["shape", "d", "S_star", "facts", "parameters", "facts_per_parameter"]
    assert result.probes["x"].tolist() == [1]
    s = result.summary
    ok = [(400, 81), (2500, 10000), (1000, 144)]
    assert s["fitted_slope"] == pytest.approx(fit_log_log(*zip(*ok)).get("slope"))
    assert list(s["shapes"]) == ["1,1,2", "0.25,4,8"]
    first = s["shapes"]["1,1,2"]
    assert first["fitted_slope"] is None  # two sizes: a line through them, whatever they are
    assert first["fit"] == {"undetermined": True, "points": 2, "parameters": 2}
    assert first["facts_per_parameter_measured"] == pytest.approx(math.sqrt(81 / 400 * 10000 / 2500))
    assert first["over_paper_line"] == pytest.approx(math.sqrt(81 / 400 * 10000 / 2500) / 0.2)
    assert [r["d"] for r in first["rows"]] == [8, 32] and "shape" not in first["rows"][0]
    assert first["rows"][0] == {"d": 8, "S_star": 9, "facts": 81, "parameters": 400, "facts_per_parameter": 81 / 400}
    second = s["shapes"]["0.25,4,8"]
    assert second["fitted_slope"] is None  # one size: no slope
    assert second["facts_per_parameter_measured"] == pytest.approx(144 / 1000)
    line = s["paper_line"]
    mean = math.exp((math.log(81 / 400) + math.log(10000 / 2500) + math.log(144 / 1000)) / 3)
    assert (line["facts_per_parameter"], line["facts_window"]) == (0.2, [64, 11000])
    assert line["facts_per_parameter_measured"] == pytest.approx(mean)
    assert line["over_paper_line"] == pytest.approx(mean / 0.2)
    assert (s["bits_per_parameter"], s["bits_per_fact"], s["settings"]) == (1.5, 2.0, SWEEP.recorded())
    assert s["search"] == {"min_size": 4, "max_size": 300, "grow": 1.5, "rel_tol": 0.1, "probes": 2,
                           "fill_rounds": True}
    assert s["sizes"] == {"shapes": [[1.0, 1.0, 2.0], [0.25, 4.0, 8.0, 45.0]], "d": [8, 16, 32, 45],
                          "skipped": [[0.25, 4.0, 8.0, 8], [0.25, 4.0, 8.0, 16]]}
    assert (s["searched"], s["probes_computed"]) == ("4 of 6", 7)


def test_the_tables_of_two_sizes_leave_the_slope_undetermined_and_of_none_inside_the_window_have_no_ratio():
    sweep = TransformerSweep(shapes=(SHAPE,), d=(8, 16), seeds=(0, 1, 2))
    rows = [{**_row("1,1,2", 8, 4, 100), "seeds": 3, "stored_by": 2},
            {**_row("1,1,2", 16, 0, 300), "stored_by": 0, "seeds": 3},
            {**_row("1,1,2", 16, 6, 300), "stored_by": 3, "seeds": 3}]
    result = transformer_tables(rows, sweep, pd.DataFrame(), computed=0)
    assert list(result.table.columns) == ["shape", "d", "S_star", "facts", "parameters", "facts_per_parameter",
                                          "seeds", "stored_by"]
    s = result.summary
    assert s["fitted_slope"] is None and s["fit"] == {"undetermined": True, "points": 2, "parameters": 2}
    assert "fitted slope undetermined (2 points, 2 parameters); theory 1" in transformer_text(result)
    assert s["shapes"]["1,1,2"]["facts_per_parameter_measured"] is None
    assert s["shapes"]["1,1,2"]["over_paper_line"] is None
    assert s["paper_line"]["over_paper_line"] is None and s["searched"] == "3 of 2"
    empty = transformer_tables([], sweep, pd.DataFrame(), computed=0)
    assert len(empty.table) == 0 and list(empty.table.columns)[-2:] == ["seeds", "stored_by"]
    assert empty.summary["fitted_slope"] is None and empty.summary["shapes"] == {}


def test_the_text_reports_the_slope_the_ratio_and_each_size():
    result = transformer_tables(ROWS, SWEEP, pd.DataFrame(), computed=0)
    s = result.summary
    mean = s["paper_line"]["facts_per_parameter_measured"]
    low, high = fit_log_log([400, 2500, 1000], [81, 10000, 144]).interval("slope")  # three sizes: one degree of freedom
    assert low < s["fitted_slope"] < high
    assert transformer_text(result).split("\n") == [
        "sizes searched: 4 of 6",
        f"facts stored against parameters: fitted slope {s['fitted_slope']:.2f} [95% CI {low:.2f}, {high:.2f}]; "
        "theory 1",
        f"facts per parameter (geometric mean over 64 to 11000 facts): {mean / 0.2:.2f}x the paper's 0.2 "
        f"({mean:.3f})",
        "  shape 1,1,2  d=8    S*=R*=9    facts=81     parameters=400     facts/parameter=0.203",
        "  shape 1,1,2  d=16   nothing stored (not even S = R = 2; left out of the fits)  parameters=900",
        "  shape 1,1,2  d=32   S*=R*=100  facts=10000  parameters=2500    facts/parameter=4.000",
        "  shape 0.25,4,8  d=32   S*=R*=12   facts=144    parameters=1000    facts/parameter=0.144"]


def test_the_text_says_undetermined_for_a_missing_slope_and_n_a_for_a_missing_ratio():
    result = transformer_tables([_row("1,1,2", 8, 4, 100)], SWEEP, pd.DataFrame(), computed=0)
    lines = transformer_text(result).split("\n")
    assert lines[1:3] == ["facts stored against parameters: fitted slope undetermined (1 point, 2 parameters); "
                          "theory 1",
                          "facts per parameter (geometric mean over 64 to 11000 facts): n/a, no size inside the "
                          "window (the paper's line: 0.2)"]


def test_the_figure_draws_the_table_with_its_fitted_slope(monkeypatch, tmp_path):
    drawn = []
    monkeypatch.setattr(tf, "facts_figure", lambda *args: drawn.append(args))
    stored = transformer_tables(ROWS, SWEEP, pd.DataFrame({"S": [2]}), computed=0)
    write_transformer(stored, SWEEP, tmp_path)
    ((table, slope, sweep, path),) = drawn
    assert table is stored.table and slope == stored.summary["fitted_slope"] and slope is not None
    assert (sweep, path) == (SWEEP, tmp_path / "facts_vs_parameters.png")


def test_the_tables_are_written_with_a_figure_only_where_something_was_stored(tmp_path):
    stored = transformer_tables(ROWS, SWEEP, pd.DataFrame({"S": [2]}), computed=0)
    write_transformer(stored, SWEEP, tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["capacity.csv", "facts_vs_parameters.png",
                                                                  "probes.csv", "summary.json"]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["searched"] == "4 of 6"
    assert pd.read_csv(tmp_path / "a" / "capacity.csv")["facts"].tolist() == [81, 0, 10000, 144]
    nothing = transformer_tables([_row("1,1,2", 8, 0, 100)], SWEEP, pd.DataFrame({"S": [2]}), computed=0)
    write_transformer(nothing, SWEEP, tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["capacity.csv", "probes.csv", "summary.json"]
