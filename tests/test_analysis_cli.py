"""The analyses' shared CLI layer (analyses/sweeps/cli.py): every analysis takes its shared flags from
it and refuses a bad shared value with the same one line and exit code 2; every settings
dataclass refuses each bad field, naming it."""
import argparse
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import analyses
from analyses.aot_capacity import AotSweep
from analyses.capacity import MemorySweep, TransformerSweep
from analyses.hallucination import HallucinationSettings
from analyses.locate_facts import LocateSettings
from analyses.sweeps import cli
from analyses.sweeps.executors import ExecutorSettings
from analyses.tradeoff import Grid, Shrink
from analyses.visualize import ViewSettings
from models.cli import run_cli
from probe.phases import PhaseRule

NAMED = {"locate_facts", "hallucination", "capacity", "tradeoff", "aot_capacity", "visualize", "report"}
SWEEP_FLAGS = ("--executor", "--jobs", "--ray-address", "--gpus-per-cell", "--torch-threads")
READERS = {("tradeoff", "compare"), ("capacity", "plan")}  # read what sweeps recorded: no device, no executor


def entry_points() -> dict:
    """Every analyses.* module with a main(), by name."""
    modules = {m.name: importlib.import_module(f"analyses.{m.name}") for m in pkgutil.iter_modules(analyses.__path__)}
    return {name: module for name, module in modules.items() if hasattr(module, "main")}


def source(module) -> str:
    """The source of an analysis: its module, or every module of its package."""
    if not hasattr(module, "__path__"):
        return inspect.getsource(module)
    return "".join(path.read_text() for path in sorted(Path(module.__path__[0]).glob("*.py")))


def commands() -> list[tuple[str, list[str], argparse.ArgumentParser]]:
    """(analysis, subcommand argv, parser) for every analysis and each of its subcommands."""
    found = []
    for name, module in sorted(entry_points().items()):
        p = module.parser()
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            found += [(name, [command], sub) for command, sub in subs[0].choices.items()]
        else:
            found.append((name, [], p))
    return found


COMMANDS = commands()


def options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


def checkpoint(p: argparse.ArgumentParser) -> argparse.Action | None:
    """The positional CKPT argument, if the analysis reads a checkpoint."""
    return next((a for a in p._actions if a.dest == "ckpt" and not a.option_strings), None)


def test_every_analysis_is_found():
    assert NAMED <= set(entry_points())


@pytest.mark.parametrize("name, argv, p", COMMANDS, ids=[" ".join([n, *a]) for n, a, _ in COMMANDS])
def test_shared_flags_come_from_the_shared_layer(name, argv, p):
    flags = options(p)
    reference = argparse.ArgumentParser()  # the shared layer's own declarations, to compare with
    for add in (cli.add_device, cli.add_quiet, cli.add_step, cli.add_sweep):
        add(reference)
    reference = options(reference)
    assert isinstance(p, cli.Parser)  # one-line refusals
    assert "--out" in flags
    assert flags["--out"].type is cli.directory and flags["--out"].help.startswith("output directory (")
    if (name, *argv) in READERS:
        assert not {"--device", *SWEEP_FLAGS} & set(flags)
        return
    assert "--device" in flags and "--quiet" in flags  # every analysis that measures takes both
    for flag in ("--device", "--quiet", "--step", *SWEEP_FLAGS):
        if flag in flags:
            ours, shared = flags[flag], reference[flag]
            assert (ours.type, ours.help, ours.default, type(ours)) == (shared.type, shared.help, shared.default,
                                                                        type(shared)), (name, flag)
    runs_a_sweep = "open_executor" in source(entry_points()[name])
    assert all((flag in flags) == runs_a_sweep for flag in SWEEP_FLAGS), name
    if "--seed" in flags and "--freeze-ov" not in flags:  # with the training flags, --seed is the training's seeds
        assert flags["--seed"].type is cli.seed and flags["--seed"].help.startswith("seed of ")
    if checkpoint(p) is not None:
        assert checkpoint(p).help.startswith(cli.CHECKPOINT_HELP.split(" (")[0])


def refusal(module, argv, capsys) -> str:
    """The one line `python -m analyses.NAME ARGV` prints when it refuses ARGV (exit code 2)."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: module.main([str(a) for a in argv]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("bad, message", [
    (["--device", "tpu"], "error: argument --device: unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
    (["--out", "FILE/sub"], "error: argument --out: FILE exists and is not a directory"),
    (["--executor", "dask"], "error: unknown --executor 'dask': choose local, processes or ray."),
    (["--executor", "processes", "--jobs", "0"], "error: --jobs must be an integer >= 1, got 0."),
    (["--torch-threads", "0"], "error: --torch-threads must be an integer >= 1, got 0."),
])
def test_a_bad_shared_value_is_the_same_one_line_everywhere(bad, message, tmp_path, capsys):
    blocker = tmp_path / "FILE"
    blocker.write_text("x")
    message = message.replace("FILE", str(blocker))
    bad = [str(blocker / "sub") if b == "FILE/sub" else b for b in bad]
    modules = entry_points()
    errors = {}
    for name, argv, p in COMMANDS:
        flags = options(p)
        if bad[0] not in flags:
            continue
        positional = [str(tmp_path / "absent")] if checkpoint(p) is not None else []
        out = [] if bad[0] == "--out" else ["--out", tmp_path / "out"]
        errors[" ".join([name, *argv])] = refusal(modules[name], [*argv, *positional, *out, *bad], capsys)
    everywhere = {"--out": len(COMMANDS), "--device": len(COMMANDS) - len(READERS)}
    assert len(errors) >= everywhere.get(bad[0], 6), errors
    assert set(errors.values()) == {message + "\n"}, errors  # the very same line from every analysis
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ settings
INVALID = [
    (LocateSettings, {"contexts": 1}, "--contexts"),
    (LocateSettings, {"patch_contexts": 0}, "--patch-contexts"),
    (HallucinationSettings, {"eval_size": 0}, "--eval-size"),
    (HallucinationSettings, {"storage_points": -1}, "--storage-points"),
    (HallucinationSettings, {"contexts": 0}, "--contexts"),
    (PhaseRule, {"level_tolerance": -0.1}, "--level-tolerance"),
    (PhaseRule, {"relation_only_max": float("nan")}, "--relation-only-max"),
    (PhaseRule, {"min_snapshots": 0}, "--min-snapshots"),
    (ViewSettings, {"contexts": 0}, "--contexts"),
    (MemorySweep, {"d": (8, 0)}, "--d"),
    (MemorySweep, {"seeds": ()}, "--seeds"),
    (MemorySweep, {"seeds": (0, -1)}, "--seeds"),
    (MemorySweep, {"steps": 0}, "--steps"),
    (MemorySweep, {"lr": 0.0}, "--lr"),
    (MemorySweep, {"outputs_per_input": 1.5}, "--outputs-per-input"),
    (MemorySweep, {"outputs": 1}, "--outputs"),
    (MemorySweep, {"m": (4,), "m_per_d": (1.0,)}, "--m-per-d"),
    (MemorySweep, {"kind": "mlp"}, "--kind mlp"),
    (MemorySweep, {"kind": "quadratic"}, "kind"),
    (TransformerSweep, {"d": (0,)}, "--d"),
    (TransformerSweep, {"answers": 1}, "--answers"),
    (TransformerSweep, {"seq_len": 2}, "--seq-len"),
    (TransformerSweep, {"lr": (1e-3, 0.0)}, "--lr"),
    (TransformerSweep, {"steps": 0}, "--steps"),
    (TransformerSweep, {"batch_size": 0}, "--batch-size"),
    (TransformerSweep, {"eval_every": 0}, "--eval-every"),
    (TransformerSweep, {"eval_size": 0}, "--eval-size"),
    (TransformerSweep, {"shapes": ((0.25, 1.0, 8.0),)}, "shape"),
    (TransformerSweep, {"min_size": 1}, "--min-size"),
    (TransformerSweep, {"max_size": 4}, "--max-size"),
    (Grid, {"heads": (1, 0)}, "--heads"),
    (Grid, {"widths": (0,)}, "--widths"),
    (Shrink, {"mlp_steps": 0}, "--mlp-steps"),
    (AotSweep, {"stack": 0}, "--stack"),
    (AotSweep, {"seeds": ()}, "--seeds"),
    (AotSweep, {"head_layout": ("standard", "paper")}, "head_layout"),
    (AotSweep, {"d_model": 0}, "d_model"),
    (AotSweep, {"d_heads": (0,)}, "d_head"),
    (ExecutorSettings, {"executor": "dask"}, "--executor"),
    (ExecutorSettings, {"ray_address": "127.0.0.1:1"}, "--ray-address"),
    (ExecutorSettings, {"gpus_per_cell": 0.5}, "--gpus-per-cell"),
    (ExecutorSettings, {"torch_threads": 0}, "--torch-threads"),
]


@pytest.mark.parametrize("settings_cls, values, named", INVALID,
                         ids=[f"{c.__name__}-{','.join(v)}" for c, v, _ in INVALID])
def test_settings_refuse_each_invalid_field_naming_it(settings_cls, values, named):
    settings_cls()  # the defaults are valid
    with pytest.raises(ValueError, match=named):
        settings_cls(**values)


def test_settings_are_frozen_and_flags_keep_their_defaults():
    settings = cli.settings(analyses.locate_facts.parser().parse_args(["ckpt"]), LocateSettings)
    assert settings == LocateSettings()
    with pytest.raises(AttributeError):
        settings.contexts = 3
    args = analyses.locate_facts.parser().parse_args(["ckpt", "--contexts", "5", "--seed", "7"])
    assert cli.settings(args, LocateSettings) == LocateSettings(contexts=5, seed=7)
