"""What the GPU runs record (analyses.sweeps.gpu_records), in-process: an entry recorded keeps the
others, the code's name is its files' paths and bytes, the commit beside it, and the command line's
hash, get, set and one usage line (exit 2) for anything else."""
import datetime
import hashlib
import json
import subprocess
import time

import pytest

from analyses.sweeps.gpu_records import CODE, ROOT, code_hash, commit, read, record, run

USAGE = ("usage: python -m analyses.sweeps.gpu_records hash tests|bench | get FILE ENTRY FIELD | "
         "set FILE ENTRY FIELD=VALUE...\n")


@pytest.fixture
def east_of_utc(monkeypatch):
    """The process's local time 9 hours ahead of UTC (a POSIX TZ rule: no time-zone database needed)."""
    monkeypatch.setenv("TZ", "JST-9")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_recording_an_entry_keeps_the_others(tmp_path, monkeypatch, capsys, east_of_utc):
    """`set` replaces one entry of a record file whole (its date, in UTC, and commit added) and leaves every
    other entry as it was, so a call does not rerun what passed before; `get` reads a field back, '' when
    absent."""
    monkeypatch.setenv("GPU_RUN_COMMIT", "abc1234")
    path = tmp_path / "results" / "gpu" / "passed.json"  # folders made as needed
    record(path, "tests", {"code": "t1", "old": "x"})
    assert run(["set", str(path), "checks", "code=c1", "note=a=b"]) == 0
    record(path, "tests", {"code": "t2"})
    entries = read(path)
    assert sorted(entries) == ["checks", "tests"]
    assert {k: v for k, v in entries["checks"].items() if k != "date"} == {"code": "c1", "note": "a=b",
                                                                            "commit": "abc1234"}
    assert entries["tests"]["code"] == "t2" and sorted(entries["tests"]) == ["code", "commit", "date"]
    date = datetime.datetime.strptime(entries["tests"]["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs(date - datetime.datetime.now(datetime.UTC).replace(tzinfo=None)) < datetime.timedelta(minutes=5)
    assert path.read_text() == json.dumps(entries, indent=1) + "\n"
    capsys.readouterr()
    assert [run(["get", str(path), entry, "code"]) for entry in ("checks", "tests", "bench")] == [0, 0, 0]
    assert capsys.readouterr().out == "c1\nt2\n\n"
    assert [p.name for p in path.parent.iterdir()] == ["passed.json"]  # written whole, no temporary left
    assert run(["set", str(path), "bare"]) == 0 and sorted(read(path)["bare"]) == ["commit", "date"]


def test_a_record_file_that_is_absent_unreadable_or_no_table_reads_as_empty(tmp_path, capsys):
    path = tmp_path / "measured.json"
    assert read(path) == {}
    for text in ("{not json", "[1, 2]"):
        path.write_text(text)
        assert read(path) == {}
    path.write_text('{"a": {"code": "x"}, "b": 3}')
    assert read(path) == {"a": {"code": "x"}, "b": 3}
    capsys.readouterr()
    assert run(["get", str(path), "b", "code"]) == 0 and run(["get", str(path), "a", "code"]) == 0
    assert capsys.readouterr().out == "\nx\n"  # an entry that is no table has no fields


def test_code_is_named_by_its_python_files_paths_and_bytes_in_path_order(tmp_path):
    """The name every record holds: sha256 over each .py file's path, NUL, bytes, NUL, in path order, cut
    to 16 hex digits (a change to it would make every recorded name stale); folders are read whole,
    absent paths count as absent."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    files = {"pkg/sub/b.py": b"x = 1\n", "pkg/a.py": b"y = 2\n", "top.py": b"z = 3\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "pkg" / "notes.txt").write_text("not code")
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    name = code_hash(["top.py", "pkg", "absent.py", "absent"], tmp_path)
    assert name == digest.hexdigest()[:16]
    assert code_hash(["pkg", "top.py", "pkg/a.py"], tmp_path) == name  # each file once, whatever the order
    (tmp_path / "pkg" / "a.py").rename(tmp_path / "pkg" / "c.py")  # the same bytes under another path
    assert code_hash(["top.py", "pkg"], tmp_path) != name


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


def test_the_commit_is_gits_with_changes_marked_else_told_else_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_RUN_COMMIT", raising=False)
    assert commit(tmp_path) == "unknown"  # no git here
    _git(tmp_path, "init", "-q")
    assert commit(tmp_path) == "unknown"  # nor a commit
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / "new.py").write_text("untracked\n")  # untracked files are not changes
    assert commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert commit(tmp_path) == head + "+changes"
    monkeypatch.setenv("GPU_RUN_COMMIT", "abc1234+changes")  # a copy without git is told its commit
    assert commit(tmp_path) == "abc1234+changes"


def test_the_command_line_hashes_the_named_code_and_refuses_anything_else(tmp_path, capsys):
    assert run(["hash", "tests"]) == 0 and run(["hash", "bench"]) == 0
    assert capsys.readouterr().out.split() == [code_hash(CODE["tests"], ROOT), code_hash(CODE["bench"], ROOT)]
    path = tmp_path / "passed.json"
    for argv in ([], ["hash"], ["hash", "other"], ["hash", "tests", "x"], ["get", str(path), "tests"],
                 ["get", str(path), "tests", "code", "x"], ["set", str(path)], ["set", str(path), "e", "no_value"],
                 ["set", str(path), "e", "a=1", "b"], ["put", str(path), "e", "a=1"]):
        assert run(argv) == 2, argv
        assert capsys.readouterr() == ("", USAGE), argv
    assert not path.exists()


@pytest.mark.parametrize("code", list(CODE))
def test_the_named_code_exists(code):
    """Every path the names read is in the checkout (a renamed file would silently leave the name)."""
    missing = [p for p in CODE[code] if not (ROOT / p).exists()]
    assert missing == []
