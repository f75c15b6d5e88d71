"""The one --out rule (models.out_folder.claim), held by every `python -m` command of the
package that takes --out. The commands are found here, not listed: every module of analyses/
and models/ with a `__main__` block or a `__main__.py`, its subcommands read from its argparse
parser. A command added later is checked with no change to this file."""
import argparse
import importlib
import json
import re
import signal
from pathlib import Path

import pytest

from models.out_folder import is_checkpoint
from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r'if __name__ == "__main__":\s*\n\s*(?:\w+\.)?(?:run_cli\((\w+)\)|sys\.exit\((\w+)\()')


class _Parsed(Exception):
    """Raised by a patched parse_args: the command's parser, read without running it."""

    def __init__(self, parser):
        self.parser = parser


def _entry_points() -> list[tuple[str, object]]:
    """(`python -m` name, its main) for every module of analyses/ and models/ run as a command."""
    found = []
    for package in ("analyses", "models"):
        for path in sorted((ROOT / package).rglob("*.py")):
            match = ENTRY.search(path.read_text())
            if match is None:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
            found.append((name, getattr(importlib.import_module(".".join(parts)), match[1] or match[2])))
    return found


def _parser(main) -> argparse.ArgumentParser | None:
    """The argparse parser `main` builds (None: it parses no arguments with argparse)."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, *args, **kwargs):
        raise _Parsed(self)
    argparse.ArgumentParser.parse_args = parse_args
    try:
        main([])
    except _Parsed as parsed:
        return parsed.parser
    except (SystemExit, Exception):
        return None
    finally:
        argparse.ArgumentParser.parse_args = original
    return None


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(subcommand words, its parser) for every command `parser` runs."""
    sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not sub:
        yield prefix, parser
        return
    for word, child in sub[0].choices.items():
        yield from _leaves(child, (*prefix, word))


def commands() -> list[tuple[str, object, tuple[str, ...], argparse.ArgumentParser]]:
    """(name, main, subcommand words, parser) of every command that takes --out."""
    found = []
    for name, main in _entry_points():
        parser = _parser(main)
        for words, leaf in (_leaves(parser) if parser is not None else ()):
            if "--out" in leaf._option_string_actions:
                found.append((" ".join((name, *words)), main, words, leaf))
    return found


COMMANDS = commands()


def test_the_commands_are_found():
    """The walk finds the commands of every kind that writes: trainers, analyses of a checkpoint,
    sweeps, the Zipf studies, the induction family."""
    names = {c[0] for c in COMMANDS}
    for expected in ("models.train", "models.induction.train", "analyses.locate_facts", "analyses.capacity zipf",
                     "analyses.capacity oscillation", "analyses.tradeoff compare", "analyses.induction location"):
        assert expected in names, sorted(names)


# a required option whose value is neither a choice nor a path: an example every checkpoint here takes
EXAMPLES = {"--fact": "0:0", "--to": "R0:a1"}


def _arguments(parser: argparse.ArgumentParser, ckpt: Path, grids: list[Path]) -> list[str]:
    """The least a command needs besides --out: its positionals and required options, the first
    choice where there are choices, an example (EXAMPLES) or a checkpoint where it takes one."""
    argv = []
    for action in parser._actions:
        if action.option_strings and (not action.required or "--out" in action.option_strings):
            continue
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        example = next((EXAMPLES[o] for o in action.option_strings if o in EXAMPLES), None)
        value = [str(next(iter(action.choices)))] if action.choices else [example] if example else \
            [str(g) for g in grids] if action.nargs == 2 else [str(ckpt)]
        argv += [action.option_strings[0], *value] if action.option_strings else value
    return argv


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


class _TooLong(BaseException):
    """A command not refused at once: it went on to compute."""


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A working directory inside a home folder, a hand-built checkpoint (the command's), another
    one, a user's folders (notes; a summary.json of their own) and two recorded grids' stand-ins."""
    from models.recall.constructions import main

    root = tmp_path_factory.mktemp("rule")
    work = root / "home" / "work" / "here"
    work.mkdir(parents=True)
    assert main(["--kind", "attention", "--out", str(root / "other")]) == 0
    from models.train import main  # a trained checkpoint, with snapshots (the hallucination analysis follows them)

    assert main(["--steps", "3", "--eval-every", "1", "--quiet", "--device", "cpu", "--out", str(root / "ckpt")]) == 0
    (root / "other" / "analysis").mkdir()
    for name, file, text in (("notes", "notes.txt", "keep me\n"), ("mine", "summary.json", '{"mine": true}\n')):
        (root / name).mkdir()
        (root / name / file).write_text(text)
    return root, work


def _outs(root: Path, work: Path) -> dict[str, tuple[str, str]]:
    """--out value -> what its refusal says: the working directory, its parent, a user's folders,
    a checkpoint's own folder and a folder in another checkpoint's analysis/."""
    return {".": "the working directory", "..": "a parent of the working directory",
            str(root / "notes"): "notes", str(root / "mine"): "mine", str(root / "ckpt"): "ckpt",
            str(root / "other" / "analysis" / "x"): "other"}


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_every_command_refuses_an_out_that_is_not_its_own(name, places, capsys, monkeypatch):
    """--out `.`, `..`, a user's folder (notes.txt; their own summary.json), a checkpoint's folder
    and a folder inside another checkpoint: each refused in one line `error: ...` naming it,
    exit 2, before anything is computed, and nothing on disk changed or left behind."""
    root, work = places
    _, main, words, parser = next(c for c in COMMANDS if c[0] == name)
    argv = [*words, *_arguments(parser, root / "ckpt", [root / "ckpt", root / "other"])]
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(root / "home"))

    def too_long(*_):
        raise _TooLong(f"{name} was not refused within 60 s")
    previous = signal.signal(signal.SIGALRM, too_long)
    try:
        for out, said in _outs(root, work).items():
            before = _tree(root)
            signal.alarm(60)
            code, _, err = run_main(main, [*argv, "--out", out], capsys)
            signal.alarm(0)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], \
                (name, out, err)
            assert _tree(root) == before, (name, out)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_an_analysis_may_write_in_its_checkpoints_analysis_folder_only(places):
    """claim: in the checkpoint's own analysis/ an analysis of it writes; elsewhere in that
    checkpoint, in another one, and in any checkpoint for a command analysing none, it is refused."""
    from models.out_folder import claim

    root, _ = places
    ckpt, other = root / "ckpt", root / "other"
    assert claim(ckpt / "analysis" / "locate_facts", ckpt=ckpt) == ckpt / "analysis" / "locate_facts"
    for out, ckpt_of, says in ((ckpt / "snapshots" / "x", ckpt, "but not in its analysis/"),
                               (other / "analysis" / "x", ckpt, "inside another checkpoint"),
                               (ckpt / "analysis" / "x", None, "is inside a checkpoint")):
        with pytest.raises(ValueError, match=says):
            claim(out, ckpt=ckpt_of)


def test_a_foreign_config_json_is_no_checkpoint(tmp_path, capsys):
    """Another program's config.json (no `format` of this toolkit) and weights: not a checkpoint,
    so --force refuses the folder and deletes neither file."""
    from models.train import main

    folder = tmp_path / "theirs"
    folder.mkdir()
    files = {"config.json": json.dumps({"model_type": "gpt2", "n_layer": 2}).encode(), "model.safetensors": b"\0" * 8}
    for file, data in files.items():
        (folder / file).write_bytes(data)
    code, _, err = run_main(main, ["--steps", "1", "--quiet", "--device", "cpu", "--out", folder, "--force"], capsys)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == files
    assert code == 2 and "not a checkpoint's (config.json, model.safetensors)" in err, err
    assert not is_checkpoint(folder)


def test_a_refused_induction_run_leaves_nothing_behind(tmp_path, capsys):
    """An unknown --frozen weight is refused before --out is made: the corrected command then runs
    into a folder that is not there, not one holding the refused run's run.json."""
    from models.induction.train import main

    out = tmp_path / "run"
    code, _, err = run_main(main, ["--frozen", "blocks.0.attn.W_X", "--out", out, "--quiet"], capsys)
    assert code == 2 and "cannot freeze 'blocks.0.attn.W_X'" in err, err
    assert not out.exists()


def test_a_refusal_says_what_the_folder_holds(places, capsys, monkeypatch):
    """The induction analyses' refusals name what is there: a user's notes (not this command's
    results), another analysis' results (the circuit's, for location), the working directory."""
    from analyses.induction.cli import main

    root, work = places
    monkeypatch.chdir(work)
    circuit = root / "circuit"
    circuit.mkdir()
    (circuit / "circuit.html").write_text("<html></html>\n")
    (circuit / "summary.json").write_text(json.dumps({"step": None, "settings": {}}))
    for out, says in ((root / "notes", f"{root / 'notes'} holds files that are not induction_location results "
                                       "(notes.txt)"),
                      (circuit, f"{circuit} holds induction_circuit results, which the induction location"),
                      (".", "--out . is the working directory")):
        code, _, err = run_main(main, ["location", root / "ckpt", "--out", out], capsys)
        assert code == 2 and err.startswith(f"error: {says}"), err


def test_a_study_never_writes_over_a_checkpoints_analysis(places, capsys):
    """`capacity oscillation --out CKPT/analysis/locate_facts` is refused: locate_facts' summary.json
    stays, and locate_facts goes on taking its own folder."""
    from analyses.capacity.cli import main

    root, _ = places
    own = root / "ckpt" / "analysis" / "locate_facts"
    own.mkdir(parents=True)
    (own / "summary.json").write_text('{"step": null}\n')
    code, _, err = run_main(main, ["oscillation", "--out", own, "--quiet"], capsys)
    assert code == 2 and err.startswith(f"error: --out {own} is inside a checkpoint"), err
    assert sorted(p.name for p in own.iterdir()) == ["summary.json"]
    assert (own / "summary.json").read_text() == '{"step": null}\n'
