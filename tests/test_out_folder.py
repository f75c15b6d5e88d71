"""--out and --force never lose what is not the model's: a user's files in the way survive."""
import shlex
from pathlib import Path

import pytest

from models.cli import run_cli

FAST = ["--steps", "3", "--eval-every", "1", "--quiet", "--device", "cpu"]
AOT = ["association", "--n-tokens", "4", "--batches", "2", "--epochs", "1", "--batch-size", "8", "--quiet",
       "--device", "cpu"]


def _main(command: str):
    if command == "models.train":
        from models.train import main
    elif command == "models.aot.train":
        from models.aot.train import main
    else:
        from models.recall.constructions import main
    return main


def refused(capsys, command: str, *args: str) -> str:
    """Run `command` in this process; assert a one-line refusal with exit 2; its line."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: _main(command)(list(args)))
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def user_files(folder: Path) -> dict[str, bytes]:
    """A user's files put in the way: a table at the top and notes in a subfolder."""
    (folder / "results").mkdir(parents=True, exist_ok=True)
    files = {"data.csv": b"x,y\n1,2\n", "results/notes.txt": b"keep me\n"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def survives(folder: Path, files: dict[str, bytes]) -> bool:
    return all((folder / name).read_bytes() == data for name, data in files.items())


COMMANDS = {"models.train": FAST, "models.aot.train": AOT, "models.recall.constructions": ["--kind", "attention"]}


@pytest.mark.parametrize("command", COMMANDS)
def test_force_refuses_a_folder_that_is_not_a_checkpoint(tmp_path, capsys, command):
    folder = tmp_path / "mine"
    files = user_files(folder)
    err = refused(capsys, command, *COMMANDS[command], "--out", str(folder), "--force")
    assert "not a checkpoint's (data.csv, results/)" in err and "choose another --out" in err
    assert survives(folder, files) and sorted(p.name for p in folder.iterdir()) == ["data.csv", "results"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", [".", "..", "~", "HOME", "PARENT"])
def test_force_refuses_the_working_directory_its_parents_and_home(tmp_path, capsys, monkeypatch, command, where):
    home, work = tmp_path / "home", tmp_path / "home" / "work" / "here"
    files = {**user_files(home), **{f"work/here/{k}": v for k, v in user_files(work).items()}}
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    out = {"HOME": str(home), "PARENT": str(home / "work")}.get(where, where)
    err = refused(capsys, command, *COMMANDS[command], "--out", out, "--force")
    assert "a checkpoint goes in a folder of its own" in err, err
    assert survives(home, files) and not (work / "~").exists()


def _trained(folder: Path, capsys, *extra: str) -> None:
    from models.train import main

    assert main(["--out", str(folder), *FAST, *extra]) == 0
    capsys.readouterr()


def test_force_replaces_only_the_model_of_a_checkpoint(tmp_path, capsys):
    """A checkpoint with a user's notes, a file among its snapshots and an analysis: --force
    replaces the model's files, keeps the notes in place and moves the analysis aside."""
    from models.train import main

    ckpt = tmp_path / "X"
    _trained(ckpt, capsys, "--snapshots-per-octave", "1")
    files = {"NOTES.txt": b"notes\n", "snapshots/my_plot.png": b"png", "analysis/locate_facts/summary.json": b"{}"}
    for name, data in files.items():
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).write_bytes(data)
    old_model = (ckpt / "model.safetensors").read_bytes()
    assert main(["--out", str(ckpt), *FAST, "--seed", "1", "--force"]) == 0
    said = capsys.readouterr().out.splitlines()[0]
    (aside,) = ckpt.glob("analysis.replaced-*")
    assert said == (f"--force: replaced the model in {ckpt}; moved analysis/ (the replaced model's results) to "
                    f"{aside}/; kept NOTES.txt, snapshots/my_plot.png.")
    assert (ckpt / "NOTES.txt").read_bytes() == b"notes\n" and (ckpt / "snapshots/my_plot.png").read_bytes() == b"png"
    assert (aside / "locate_facts/summary.json").read_bytes() == b"{}" and not (ckpt / "analysis").exists()
    assert (ckpt / "model.safetensors").read_bytes() != old_model and (ckpt / "config.json").is_file()


def _main_sh_train_args() -> list[str]:
    """The models.train flags scripts/main.sh passes."""
    script = (Path(__file__).resolve().parents[1] / "scripts" / "main.sh").read_text()
    (line,) = [line for line in script.splitlines() if "-m models.train" in line]
    args = shlex.split(line, comments=True)
    return args[args.index("models.train") + 1:]


def test_main_sh_run_again_keeps_the_checkpoint_and_its_analysis(tmp_path, capsys):
    """The README's first command, run a second time, trains nothing and deletes nothing."""
    from models.train import main

    args = _main_sh_train_args()
    args[args.index("--out") + 1] = str(tmp_path / "tiny")
    args += ["--quiet", "--device", "cpu"]
    assert "--force" in args and main(args) == 0
    ckpt, files = tmp_path / "tiny", {"analysis/locate_facts/summary.json": b"{}", "NOTES.txt": b"n"}
    for name, data in files.items():
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).write_bytes(data)
    before = {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")}
    capsys.readouterr()
    assert main(args) == 0
    assert "holds a checkpoint trained with these settings" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")} == before and survives(ckpt, files)


def test_reuse_resumes_an_interrupted_run_and_replaces_one_of_other_settings(tmp_path, capsys):
    from models.train import main

    ckpt = tmp_path / "run"
    _trained(ckpt, capsys, "--snapshots-per-octave", "1")
    (ckpt / "config.json").unlink()  # as if killed before the checkpoint was written
    (ckpt / "analysis").mkdir()
    assert main(["--out", str(ckpt), *FAST, "--snapshots-per-octave", "1", "--reuse"]) == 0
    assert "holds an interrupted run of these settings; resuming it" in capsys.readouterr().out
    assert (ckpt / "config.json").is_file() and (ckpt / "analysis").is_dir()
    err = refused(capsys, "models.train", "--out", str(ckpt), *FAST, "--reuse")  # other settings, no --force
    assert "already holds files; pass --force" in err and (ckpt / "analysis").is_dir()
    assert main(["--out", str(ckpt), *FAST, "--reuse", "--force"]) == 0
    assert "replaced the model" in capsys.readouterr().out and list(ckpt.glob("analysis.replaced-*"))
