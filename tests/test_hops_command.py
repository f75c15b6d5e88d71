"""The command of where each hop lives (analyses/hops.py), in this process on a two-block model of
random weights: the traced compositions, each fact's accuracy on its seed's prompts, the tracing
loop over sets, roles and noises (with a recording tracer: probe/hops.py's own is tested in
tests/test_hops.py), and main's files, summary, report, folder and progress bar."""
import inspect
import json
from dataclasses import asdict, replace

import pandas as pd
import pytest
import torch

import analyses.hops as command
from analyses import recorded
from analyses.hops import HopsSettings, locate_hops, trace_hops, traced_triples
from analyses.hops_summary import report
from models import build_bridge
from models.checkpoint import weights_sha256, write_checkpoint
from models.recall.config import ModelConfig
from models.section import shapes
from probe import columns
from probe.causal_tracing import COLUMNS, NOISE, n_steps
from probe.hops import REUSES, ROLES, composition_prompts, one_hop_prompts, trace_compositions
from probe.storage import StorageRule
from tasks import TwoHopTask
from tests.conftest import run_main

TASK = TwoHopTask(6, 3, 6, 8, fact_seed=1)
S, R = TASK.n_subjects, TASK.n_relations
SECTION = replace(ModelConfig(), n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32).checkpoint_section(TASK)
RUNS = [(name, corrupt, noise) for name in ("trained", "held_out") for corrupt in ROLES for noise in NOISE]


def random_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two blocks of random weights (tests/test_hops.py's random model): some facts right, most wrong."""
    generator = torch.Generator().manual_seed(seed)
    weights = {k: 0.3 * torch.randn(shape, generator=generator) for k, shape in shapes(SECTION).items()}
    weights["unembed.W_U"] *= 0.1
    return weights


@pytest.fixture(scope="module")
def model():
    return build_bridge(SECTION, random_weights())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The random model's final weights, and a snapshot at step 2 of other random weights."""
    return write_checkpoint(tmp_path_factory.mktemp("hops") / "ckpt", SECTION, TASK, {}, random_weights(),
                            snapshots={2: random_weights(1)})


class Tracer:
    """probe.hops.trace_compositions' stand-in: records each call's arguments (bound to the real
    signature, defaults applied) and returns, per composition, the MLP's and attention's effect at
    layer 1 and the last position, drawn from the generator given; progress once per step."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        bound = inspect.signature(trace_compositions).bind(*args, **kwargs)
        bound.apply_defaults()
        call = dict(bound.arguments)
        call["seeded"] = call["generator"].initial_seed()
        self.calls.append(call)
        s, r1, r2, _, _ = TASK.composition(call["triples"])
        drawn = torch.rand(len(s), generator=call["generator"])  # [F]
        for _ in range(n_steps(len(s), call["contexts"], call["draws"])):
            call["progress"]()
        rows = [(f"{a}:{b}:{c}", 1, "last", component, float(effect) / k, 0.5, 0.25)
                for a, b, c, effect in zip(s.tolist(), r1.tolist(), r2.tolist(), drawn) for k, component in
                ((1, "mlp"), (2, "attn"))]
        return pd.DataFrame(rows, columns=list(COLUMNS))


class Bar:
    made = []

    def __init__(self, **kwargs):
        self.kwargs, self.n, self.closed = kwargs, 0, False
        Bar.made.append(self)

    def update(self, n):
        assert not self.closed
        self.n += n

    def close(self):
        self.closed = True


@pytest.fixture
def tracer(monkeypatch):
    Bar.made = []
    monkeypatch.setattr(command, "progress_bar", Bar)
    recorder = Tracer()
    monkeypatch.setattr(command, "trace_compositions", recorder)
    return recorder


def test_the_traced_compositions_are_each_set_s_seeded_draw_sorted_and_all_when_fewer():
    chosen = traced_triples(TASK, 5, seed=4)
    assert list(chosen) == ["trained", "held_out"]
    for name, pool in [("trained", TASK.trained), ("held_out", TASK.held_out)]:
        drawn = chosen[name]
        assert len(drawn) == 5 and set(drawn.tolist()) <= set(pool.tolist()) and torch.equal(drawn, drawn.sort().values)
        assert torch.equal(traced_triples(TASK, 5, seed=4)[name], drawn)
    assert not torch.equal(traced_triples(TASK, 5, seed=5)["trained"], chosen["trained"])
    every = traced_triples(TASK, 1000, seed=4)
    assert torch.equal(every["trained"], TASK.trained) and torch.equal(every["held_out"], TASK.held_out)
    no_held = TwoHopTask(6, 3, 6, 8, held_out_fraction=0.0, fact_seed=1)
    assert list(traced_triples(no_held, 5, seed=4)) == ["trained"]


def test_each_fact_s_accuracy_is_the_share_of_its_seed_s_prompts_answered_and_right_is_half_or_more(model):
    one_hop, two_hop = locate_hops(model, TASK, contexts=2, seed=3)

    def answered(batch) -> list[float]:  # per fact, the share of its 2 prompts answered
        with torch.inference_mode():
            hit = model(batch.tokens)[:, -1].argmax(-1) == batch.answers
        return hit.float().reshape(-1, 2).mean(1).tolist()

    batch, index = one_hop_prompts(TASK, 2, 3)
    assert list(one_hop.index) == list(index) and len(index) == 2 * S * R
    assert one_hop[columns.ACCURACY].tolist() == answered(batch)
    batch, index = composition_prompts(TASK, torch.arange(S * R * R), 2, 3)
    assert list(two_hop.index) == list(index) and two_hop[columns.ACCURACY].tolist() == answered(batch)
    assert two_hop["right"].tolist() == [a >= 0.5 for a in two_hop[columns.ACCURACY]]
    assert 0 < two_hop["right"].sum() < len(two_hop)  # both outcomes
    assert two_hop["held_out"].sum() == len(TASK.held_out) and REUSES in two_hop


def test_tracing_runs_each_set_role_and_noise_on_its_own_generator_with_the_settings(model, tracer):
    settings = HopsSettings(contexts=2, trace_compositions=3, trace_contexts=1, draws=2)
    effects = trace_hops(model, TASK, settings, seed=7)  # with its progress bar by default
    chosen = traced_triples(TASK, 3, seed=7)
    assert [(c["corrupt"], c["noise"]) for c in tracer.calls] == [run[1:] for run in RUNS]
    for call, (name, _, _) in zip(tracer.calls, RUNS):
        assert torch.equal(call["triples"], chosen[name]) and call["task"] is TASK and call["model"] is model
        assert (call["contexts"], call["seed"], call["draws"]) == (1, 7, 2)
    seeds = [call["seeded"] for call in tracer.calls]
    assert len(set(seeds)) == len(RUNS)  # each run's noise its own
    assert list(effects.columns) == ["set", "corrupt", "noise", *COLUMNS]
    assert list(effects[["set", "corrupt", "noise"]].drop_duplicates().itertuples(index=False, name=None)) == RUNS
    assert len(effects) == len(RUNS) * 3 * 2 and list(effects.index) == list(range(len(effects)))
    [bar] = Bar.made
    per_run = n_steps(3, 1, 2)
    assert (bar.kwargs, bar.n, bar.closed) == (
        {"total": per_run * len(RUNS), "desc": "causal tracing", "unit": "draw", "disable": False}, per_run * 12, True)
    tracer.calls.clear()
    again = trace_hops(model, TASK, settings, seed=7, progress=False)
    assert [call["seeded"] for call in tracer.calls] == seeds and again.equals(effects)
    assert Bar.made[-1].kwargs["disable"] and Bar.made[-1].closed


def test_tracing_no_composition_runs_nothing_and_gives_the_columns(model, tracer):
    effects = trace_hops(model, TASK, HopsSettings(trace_compositions=0), seed=0)
    assert tracer.calls == [] and effects.empty and list(effects.columns) == ["set", "corrupt", "noise", *COLUMNS]
    assert Bar.made[-1].kwargs["disable"] and Bar.made[-1].closed


def test_the_settings_default_to_the_documented_counts_and_refuse_too_few():
    p = command.parser()
    assert HopsSettings() == HopsSettings(contexts=8, trace_compositions=32, trace_contexts=2, draws=3)
    assert command.cli.settings(p.parse_args(["ckpt"]), HopsSettings) == HopsSettings()
    HopsSettings(contexts=2, trace_compositions=0, trace_contexts=1, draws=1)  # the least of each
    for field, least in [("contexts", 2), ("trace_compositions", 0), ("trace_contexts", 1), ("draws", 1)]:
        with pytest.raises(ValueError, match=f"^--{field.replace('_', '-')} must be >= {least}, got {least - 1}"):
            HopsSettings(**{field: least - 1})


def test_the_help_names_the_command_its_seed_and_its_settings():
    shown = " ".join(command.parser().format_help().split())
    assert shown.startswith("usage: python -m analyses.hops ") and "where each hop of two-hop recall lives" in shown
    assert "seed of the prompts, the traced compositions and the noise (default 0)" in shown
    assert "what is measured: --contexts CONTEXTS prompts per fact and per composition for the storage rule" in shown
    assert "--out OUT output directory (default CKPT/analysis/hops)" in shown


def test_the_command_writes_each_hop_s_files_summary_and_report_into_its_settings_folder(ckpt, model, tracer,
                                                                                        capsys):
    argv = [ckpt, "--device", "cpu", "--contexts", "2", "--trace-compositions", "1", "--trace-contexts", "1",
            "--draws", "2", "--seed", "3"]
    code, out, err = run_main(command.main, argv, capsys)
    assert code == 0, err
    folder = ckpt / "analysis" / "hops" / "contexts-2_trace-compositions-1_trace-contexts-1_draws-2"
    one_hop, two_hop = locate_hops(model, TASK, contexts=2, seed=3)
    for name, frame in [("one_hop_facts.csv", one_hop), ("compositions.csv", two_hop)]:
        written = pd.read_csv(folder / name, keep_default_na=False)
        assert list(written.columns) == list(frame.reset_index().columns)
        assert written[columns.ACCURACY].tolist() == frame[columns.ACCURACY].tolist()
    tracing = pd.read_csv(folder / "tracing.csv")
    assert list(tracing.columns) == ["set", "corrupt", "noise", *COLUMNS] and len(tracing) == len(RUNS) * 2
    assert {call["seed"] for call in tracer.calls} == {3} and (folder / "hops.png").stat().st_size > 0
    numbers = json.loads((folder / "summary.json").read_text())
    assert numbers["settings"] == {"contexts": 2, "trace_compositions": 1, "trace_contexts": 1, "draws": 2,
                                   "seed": 3, "rule": asdict(StorageRule()), "device": "cpu"}
    assert numbers["n_layers"] == 2 and numbers["step"] is None and numbers["one_hop"]["facts"] == 2 * S * R
    assert sum(group["compositions"] for group in numbers["two_hop"].values()) == S * R * R
    assert len(numbers["tracing"]) == len(ROLES) * len(NOISE) * 2  # one right-or-wrong group per set: 1 each
    assert isinstance(numbers["seconds"], float) and 0 <= numbers["seconds"] == round(numbers["seconds"], 2) < 600
    assert out == report(numbers, str(ckpt), folder) + "\n"
    [bar] = Bar.made
    assert not bar.kwargs["disable"] and bar.n == bar.kwargs["total"] == 2 * len(RUNS)
    code, out, _ = run_main(command.main, [*argv, "--quiet", "--out", folder], capsys)  # the same settings: its own
    again = json.loads((folder / "summary.json").read_text())
    assert code == 0 and {**again, "seconds": 0} == {**numbers, "seconds": 0} and f"wrote {folder}/ " in out
    assert Bar.made[-1].kwargs["disable"] and not any(p.is_dir() for p in folder.iterdir())
    code, _, err = run_main(command.main, [*argv, "--draws", "1", "--quiet", "--out", folder], capsys)
    assert code == 2 and err.startswith(f"error: {folder} holds other hops results") and err.endswith(
        "which hops does not write over; move them, or choose another --out.\n") and err.count("\n") == 1
    assert json.loads((folder / "summary.json").read_text()) == again


def test_the_command_reads_a_snapshot_by_its_step_into_the_step_s_folder(ckpt, tracer, capsys):
    argv = [ckpt, "--device", "cpu", "--contexts", "2", "--trace-compositions", "0", "--seed", "3", "--step", "2"]
    code, _, err = run_main(command.main, argv, capsys)
    assert code == 0, err
    folder = ckpt / "analysis" / "step_2" / "hops" / "contexts-2_trace-compositions-0"
    numbers = json.loads((folder / "summary.json").read_text())
    assert numbers["step"] == 2 and numbers[recorded.HASH] == weights_sha256(ckpt, 2) != weights_sha256(ckpt)
    _, two_hop = locate_hops(build_bridge(SECTION, random_weights(1)), TASK, contexts=2, seed=3)
    written = pd.read_csv(folder / "compositions.csv")
    assert written[columns.ACCURACY].tolist() == two_hop[columns.ACCURACY].tolist() and tracer.calls == []
    assert run_main(command.main, [*argv, "--quiet"], capsys)[0] == 0  # the snapshot's results are its own
