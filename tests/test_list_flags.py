"""One rule for every list flag (models.cli.list_items): at least one value, no empty item,
no value twice (a seed or a learning rate given twice would train, count and vote twice), in
every command; and a value that starts with '-' reaches the flag's own range check."""
import argparse

import pytest

from models.cli import comma_list, list_items, run_cli
from tests.test_analysis_cli import COMMANDS


def _programs() -> list[tuple[str, argparse.ArgumentParser]]:
    from models.aot.train import parser as aot_parser
    from models.recall.train import parser as train_parser

    return [(" ".join([name, *argv]), p) for name, argv, p in COMMANDS] + [
        ("models.train", train_parser()), ("models.aot.train", aot_parser())]


# flags whose items are the coordinates of one thing (a shape ALPHA,BETA,H; Adam's β1,β2): values may repeat
COORDINATES = {("capacity departures", "--shape"): ("2,2,8", (2.0, 2.0, 8.0)),
               ("capacity zipf", "--adam-betas"): ("0,0", (0.0, 0.0))}
LIST_FLAGS = [(program, action.option_strings[0], action.type) for program, p in _programs() for action in p._actions
              if getattr(action.type, "__name__", "").endswith(" list")]


def test_every_comma_list_flag_is_found():
    flags = {(program, flag) for program, flag, _ in LIST_FLAGS}
    assert {("models.train", "--seed"), ("models.train", "--lr"), ("capacity transformer", "--seeds"),
            ("capacity plan", "--d"), ("capacity memory", "--m-per-d"), ("tradeoff grid", "--heads"),
            ("aot_capacity", "--seeds"), ("aot_capacity", "--head-layout"), ("capacity departures", "--shape"),
            ("tradeoff compare", "--labels"), ("capacity zipf", "--seeds"), ("capacity zipf", "--d"),
            ("capacity oscillation", "--step-sizes"), ("capacity overoptimisation", "--tokens"),
            *COORDINATES} <= flags


@pytest.mark.parametrize("program, flag, parse", LIST_FLAGS, ids=[f"{p} {f}" for p, f, _ in LIST_FLAGS])
def test_every_list_flag_refuses_empty_items_and_repeats(program, flag, parse):
    value = "a" if parse.__name__.startswith("str") else "2"
    other = "b" if value == "a" else "3"
    for text, message in (("", "expected at least one value, got ''"),
                          (f"{value},,{other}", f"an empty value in '{value},,{other}'"),
                          (f"{value},", f"an empty value in '{value},'")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)
    assert parse(f"{value}, {other}") == tuple(type(parse(value)[0])(x) for x in (value, other))
    if (program, flag) in COORDINATES:  # one thing's coordinates may repeat: a shape 2,2,8, Adam's betas 0,0
        text, values = COORDINATES[program, flag]
        assert parse(text) == values
        return
    with pytest.raises(argparse.ArgumentTypeError, match=f"{value} given twice in '{value},{other},{value}': "
                                                         "list each value once"):
        parse(f"{value},{other},{value}")


def test_the_rule_names_values_that_read_the_same():
    with pytest.raises(ValueError, match=r"^1e-2 and 0.01 are the same value in '1e-2,0.01': list each value once$"):
        list_items("1e-2,0.01", float)
    with pytest.raises(argparse.ArgumentTypeError, match="got the item 'x'"):
        comma_list(int)("1,x")
    assert list_items(" 3 ,1", int) == (3, 1)


def refused(main, argv, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main([str(a) for a in argv]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_each_program_refuses_a_repeat_in_one_line(tmp_path, capsys):
    from analyses.aot_capacity import main as aot_capacity
    from analyses.capacity import main as capacity
    from analyses.tradeoff import main as tradeoff
    from models.aot.train import main as aot_train
    from models.train import main as train

    out = tmp_path / "out"
    cases = [(train, ["--seed", "0,0", "--out", out], "error: argument --seed: 0 given twice in '0,0'"),
             (train, ["--lr", "1e-2,0.01", "--out", out], "error: argument --lr: 1e-2 and 0.01 are the same value"),
             (capacity, ["transformer", "--seeds", "0,0", "--out", out], "error: argument --seeds: 0 given twice"),
             (capacity, ["plan", "--seeds", "1,1"], "error: argument --seeds: 1 given twice"),
             (capacity, ["plan", "--d", "8,,16"], "error: argument --d: an empty value in '8,,16'"),
             (capacity, ["plan", "--shape", "1,1,8", "--shape", "1,1,8,64"],
              "error: --shape 1,1,8 given twice: list each shape (ALPHA,BETA,H) once."),
             (tradeoff, ["grid", "--heads", "1,2,1", "--out", out], "error: argument --heads: 1 given twice"),
             (aot_capacity, ["--seeds", "0,0", "--out", out], "error: argument --seeds: 0 given twice"),
             (aot_train, ["association", "--seed", "-1", "--out", out],
              "error: argument --seed: a seed is an integer >= 0, got -1"),
             (train, ["--seed", "-1", "--out", out], "error: seeds must be integers >= 0, got -1."),
             (capacity, ["plan", "--shape", "-1,1,8"], "error: shape alpha=-1, beta=1, H=8 gives d_head=-2")]
    for main, argv, message in cases:
        assert refused(main, argv, capsys).startswith(message), (argv, message)
    assert not out.exists()


def test_locate_facts_checks_its_own_values(tiny_ckpt, tmp_path, capsys):
    """--facts by the rule of every list, and values that start with '-' by the tool's own range check."""
    from analyses.locate_facts import main

    out = tmp_path / "out"
    for argv, message in ((["--facts", ""], "error: --facts: expected at least one fact, got ''."),
                          (["--facts", "3:1,,7:0"], "error: --facts: an empty fact in '3:1,,7:0'"),
                          (["--facts", "3:1,3:1"], "error: --facts: 3:1 given twice in '3:1,3:1'"),
                          (["--facts", "-1:0"], "error: fact (-1, 0) is outside the task (subjects 0..15"),
                          (["--step", "-1"], "error: argument --step: a step is an integer >= 0, got -1"),
                          (["--seed", "-1"], "error: argument --seed: a seed is an integer >= 0, got -1")):
        assert refused(main, [tiny_ckpt, "--out", out, "--device", "cpu", *argv], capsys).startswith(message), argv
    assert not out.exists()
