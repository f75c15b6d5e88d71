"""Results that belong to their checkpoint (analyses/recorded.py): the content hash of the
weights an analysis read, reuse only of results of these weights and settings, and the
folders an analysis refuses to write into."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from analyses import recorded
from analyses.locate_facts import LocateSettings
from models.checkpoint import snapshot_path, snapshots_sha256, weights_sha256


def test_the_hash_is_of_the_weights_read(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "snapshots").mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"final")
    snapshot_path(ckpt, 4).write_bytes(b"four")
    final = weights_sha256(ckpt)
    assert final == hashlib.sha256(b"final").hexdigest()  # the file's bytes
    assert weights_sha256(ckpt, 4) not in (final, weights_sha256(ckpt, None))
    copy = shutil.copytree(ckpt, tmp_path / "copy")
    assert weights_sha256(copy) == final  # a copy is the same weights
    (copy / "model.safetensors").write_bytes(b"retrained")
    assert weights_sha256(copy) != final
    before = snapshots_sha256(ckpt)
    snapshot_path(ckpt, 8).write_bytes(b"four")
    assert snapshots_sha256(ckpt) != before
    assert recorded.source(ckpt, 4) == {"checkpoint": str(ckpt), "step": 4, "weights_sha256": weights_sha256(ckpt, 4)}


def test_recorded_results_are_reused_only_from_the_same_weights_and_settings(tmp_path):
    said = []
    first, second, third, empty = (tmp_path / n for n in ("first", "second", "third", "empty"))
    for folder, contexts, sha in ((first, 4, "a" * 64), (second, 8, "b" * 64), (third, 8, "a" * 64)):
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({"step": None, "weights_sha256": sha,
                                                         "settings": {"contexts": contexts, "device": "cuda"}}))
    wanted = {"step": None, "weights_sha256": "a" * 64, "settings": {"contexts": 8}}
    found = recorded.recorded_results("locate_facts", [empty, first, second, third, first], wanted, False, said.append)
    assert found == third  # the device is not a setting
    assert said == [f"locate_facts: not reusing {first} (settings.contexts: recorded 4, now 8)",
                    f"locate_facts: not reusing {second} (weights_sha256: recorded \"bbbbbbbbbbbb...\", now "
                    "\"aaaaaaaaaaaa...\")",
                    f"locate_facts: reusing {third} (the same weights and settings)"]
    assert recorded.recorded_results("locate_facts", [third], wanted, True, said.append) is None  # fresh
    assert recorded.recorded_results("x", [first], {"step": 3, "settings": {"contexts": 5}}, False, said.append) is None
    assert said[-1] == f"x: not reusing {first} (settings.contexts: recorded 4, now 5; step: recorded null, now 3)"
    (second / "summary.json").write_text(json.dumps({"step": None, "settings": {"contexts": 8}}))  # recorded before
    assert recorded.recorded_results("y", [second], wanted, False, said.append) is None  # hashes were recorded
    assert said[-1] == f"y: not reusing {second} (weights_sha256: recorded null, now \"aaaaaaaaaaaa...\")"
    (first / "summary.json").write_text("{cut")
    with pytest.raises(ValueError, match=r"summary.json: not valid JSON \(.*\); rerun with --fresh\.$"):
        recorded.recorded_results("locate_facts", [first], wanted, False, said.append)


def test_a_folder_of_other_results_is_refused_and_one_of_the_same_taken(tmp_path):
    """A folder an analysis would write into: absent, empty, holding only subfolders or the very
    results wanted passes; a sweep, a checkpoint, results of other settings or of other weights
    are refused in one line naming what differs; in the checkpoint's own analysis/ folder the
    results of its earlier weights are stale and replaced."""
    ckpt = tmp_path / "ckpt"
    wanted = {"settings": {"contexts": 8}, "step": None, "weights_sha256": "a" * 64}
    into = tmp_path / "locate_facts"
    recorded.refuse_other_results("locate_facts", into, wanted, ckpt, "the report")  # absent
    (into / "facts_3-1").mkdir(parents=True)
    recorded.refuse_other_results("locate_facts", into, wanted, ckpt, "the report")  # subfolders only
    (into / "facts.csv").write_text("fact\n")
    with pytest.raises(ValueError) as refused:
        recorded.refuse_other_results("locate_facts", into, wanted, ckpt, "the report")
    assert str(refused.value) == (f"{into} holds other locate_facts results (no summary.json), which the report "
                                  "does not write over; move them, or choose another --out.")
    summary = {"settings": {"contexts": 8, "device": "cuda"}, "step": None, "weights_sha256": "a" * 64}
    (into / "summary.json").write_text(json.dumps(summary))
    recorded.refuse_other_results("locate_facts", into, wanted, ckpt, "the report")  # the same, on another device
    (into / "summary.json").write_text(json.dumps({**summary, "settings": {"contexts": 4}}))
    with pytest.raises(ValueError) as refused:
        recorded.refuse_other_results("locate_facts", into, wanted, ckpt, "locate_facts")
    assert str(refused.value) == (f"{into} holds other locate_facts results (settings.contexts: recorded 4, now 8), "
                                  "which locate_facts does not write over; move them, or choose another --out.")
    with pytest.raises(ValueError) as refused:  # named by what it holds, not by the analysis refused
        recorded.refuse_other_results("hallucination", into, wanted, ckpt, "the hallucination analysis")
    assert str(refused.value) == (f"{into} holds locate_facts results, which the hallucination analysis does not "
                                  "write over; move them, or choose another --out.")
    (into / "summary.json").write_text(json.dumps({**summary, "weights_sha256": "b" * 64}))
    with pytest.raises(ValueError, match=r"holds other locate_facts results \(weights_sha256: recorded "
                                         r"\"bbbbbbbbbbbb...\", now \"aaaaaaaaaaaa...\"\)"):
        recorded.refuse_other_results("locate_facts", into, wanted, ckpt, "locate_facts")
    own = ckpt / "analysis" / "locate_facts"
    shutil.copytree(into, own)
    recorded.refuse_other_results("locate_facts", own, wanted, ckpt, "locate_facts")  # stale: its earlier weights
    (own / "summary.json").write_text(json.dumps({**summary, "weights_sha256": "b" * 64, "settings": {"contexts": 4}}))
    with pytest.raises(ValueError, match=r"\(settings.contexts: recorded 4, now 8\)"):  # never another setting's
        recorded.refuse_other_results("locate_facts", own, wanted, ckpt, "locate_facts")
    for name, what in (("settings.json", "a sweep (settings.json)"), ("config.json", "a checkpoint (config.json)")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_text("{}")
        (folder / "summary.json").write_text(json.dumps(summary))
        with pytest.raises(ValueError) as refused:
            recorded.refuse_other_results("locate_facts", folder, wanted, ckpt, "locate_facts")
        assert str(refused.value) == (f"{folder} holds {what}, which locate_facts does not write over; move them, or "
                                      "choose another --out.")


def test_results_of_other_settings_get_a_folder_named_after_them():
    assert recorded.settings_folder(LocateSettings()) == ""
    assert recorded.settings_folder(LocateSettings(contexts=4, seed=1)) == "contexts-4_seed-1"
    assert recorded.settings_folder(LocateSettings(patch_contexts=3)) == "patch-contexts-3"


# ------------------------------------------------------------ two checkpoints, one's results where the other's look
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """Two small checkpoints of the tiny preset, trained a few steps from seeds 0 and 1 (no
    snapshots, so the report runs locate_facts only)."""
    from models.cli import override
    from models.recall.presets import preset
    from models.recall.trainer import train
    from tests.conftest import quick

    base = preset("tiny")
    root = tmp_path_factory.mktemp("two")
    made = []
    for name, seed in (("fresh", 0), ("fresh2", 1)):
        run = quick(base, steps=40, eval_every=20, eval_size=256, snapshots_per_octave=0, seed=(seed,))
        run = type(run)(override(run.task, {"n_subjects": 8}), run.model, run.train)
        made.append(train(run, progress=False, preset_name="tiny").save(root / name))
    return made


def _run(main, argv, capsys) -> tuple[int, str, str]:
    from models.cli import run_cli

    capsys.readouterr()
    try:
        run_cli(lambda: main([str(a) for a in argv]))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _files(folder) -> list:
    return sorted((p, p.read_bytes()) for p in folder.rglob("*") if p.is_file())


def test_the_report_shows_its_own_checkpoint_s_numbers_never_another_s(two_checkpoints, tmp_path, capsys):
    from analyses import locate_facts, report

    fresh, fresh2 = two_checkpoints
    quiet = ["--device", "cpu", "--quiet"]
    assert _run(locate_facts.main, [fresh, *quiet], capsys)[0] == 0
    assert _run(locate_facts.main, [fresh2, *quiet, "--out", tmp_path / "fresh2_own"], capsys)[0] == 0
    theirs = json.loads((fresh / "analysis" / "locate_facts" / "summary.json").read_text())
    own = json.loads((tmp_path / "fresh2_own" / "summary.json").read_text())
    assert theirs["weights_sha256"] == weights_sha256(fresh) != own["weights_sha256"] == weights_sha256(fresh2)
    assert theirs["accuracy"] != own["accuracy"]  # the two checkpoints' numbers differ

    # fresh's results copied where fresh2's report looks: not reused, fresh2's own computed
    shutil.copytree(fresh / "analysis", fresh2 / "analysis")
    code, said, err = _run(report.main, [fresh2, *quiet], capsys)
    assert code == 0, err
    assert (f"locate_facts: not reusing {fresh2 / 'analysis' / 'locate_facts'} (weights_sha256: recorded "
            f"\"{theirs['weights_sha256'][:12]}...\", now \"{own['weights_sha256'][:12]}...\")") in said
    computed = json.loads((fresh2 / "analysis" / "report" / "locate_facts" / "summary.json").read_text())
    assert computed["weights_sha256"] == own["weights_sha256"] and computed["accuracy"] == own["accuracy"]
    assert computed["label_counts"] == own["label_counts"]
    page = (fresh2 / "analysis" / "report" / "index.html").read_text()
    shown = own["accuracy_interval"]
    assert f"<p>accuracy {shown['value']:.3f} [{shown['low']:.3f}, {shown['high']:.3f}]</p>" in page
    assert f"sha256 {own['weights_sha256']}" in page and theirs["weights_sha256"][:12] not in page

    # and into another checkpoint's folders nothing is written: one line, exit 2
    before = _files(fresh)
    for main, argv in ((report.main, [fresh2, "--out", fresh / "analysis" / "report"]),
                       (locate_facts.main, [fresh2, "--out", fresh / "analysis" / "locate_facts"])):
        code, _, err = _run(main, [*argv, *quiet], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: --out {argv[2]} is inside another checkpoint ({fresh.resolve()})"), err
    assert _files(fresh) == before


def test_locate_facts_never_writes_over_other_results(two_checkpoints, tmp_path, capsys):
    """Other settings get their own folder; a sweep's folder, a checkpoint's own folder and a
    folder of other settings' results are refused in one line, and nothing there changes."""
    from analyses import locate_facts

    ckpt = Path(shutil.copytree(two_checkpoints[0], tmp_path / "ckpt", ignore=shutil.ignore_patterns("analysis")))
    quiet = ["--device", "cpu", "--quiet", "--patch-contexts", "1"]
    assert _run(locate_facts.main, [ckpt, *quiet], capsys)[0] == 0
    default = ckpt / "analysis" / "locate_facts"
    before = _files(default)
    code, out, _ = _run(locate_facts.main, [ckpt, *quiet, "--contexts", "4", "--seed", "1"], capsys)
    own = default / "contexts-4_patch-contexts-1_seed-1"
    assert code == 0 and f"wrote {own}/" in out
    assert [f for f in _files(default) if own not in f[0].parents] == before  # the default results: untouched
    assert json.loads((own / "summary.json").read_text())["settings"]["contexts"] == 4

    sweep = tmp_path / "sweep"  # a finished sweep's folder
    (sweep / "cells").mkdir(parents=True)
    for name in ("settings.json", "summary.json"):
        (sweep / name).write_text('{"analysis": "capacity memory"}')
    (sweep / "cells" / "d8.json").write_text("{}")
    refusals = {sweep: f"error: {sweep} holds a sweep (settings.json), which locate_facts does not write over",
                own: f"error: {own} holds other locate_facts results (settings.contexts: recorded 4, now 8; "
                     "settings.seed: recorded 1, now 0)",
                ckpt: f"error: argument --out: {ckpt} is a checkpoint's own folder: results go to a folder of "
                      f"their own, by default {ckpt / 'analysis'}/NAME"}
    for out, message in refusals.items():
        before = _files(tmp_path)
        code, _, err = _run(locate_facts.main, [ckpt, *quiet, "--out", out], capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith(message), err
        assert _files(tmp_path) == before
    code, _, err = _run(locate_facts.main, [ckpt, *quiet, "--out", own, "--contexts", "4", "--seed", "1"], capsys)
    assert code == 0, err  # the same settings' results: recomputed in place
