"""analyses.visualize and analyses.report: what they write, that it loads nothing from a
network, what the attention views show, and one-line refusals of bad input."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analyses import recorded, report, visualize
from models.cli import run_cli
from tests.test_locate_facts import constructed

REMOTE_SCRIPT = re.compile(r"""<script[^>]*\ssrc=|(import|from)\s*\(?\s*["']https?://""")
PNG = "data:image/png;base64,"


def run(module, *args):
    return subprocess.run([sys.executable, "-m", f"analyses.{module}", *map(str, args)],
                          capture_output=True, text=True, check=False)


def refused(main, args, capsys) -> str:
    """Run a CLI's main in this process as `python -m` would; it must exit 2 with one line."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(list(map(str, args))))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt, tmp_path_factory):
    """A private copy of the tiny checkpoint (it has snapshots)."""
    return Path(shutil.copytree(tiny_ckpt, tmp_path_factory.mktemp("views") / "tiny"))


@pytest.mark.slow
def test_visualize_cli_writes_offline_views(ckpt):
    proc = run("visualize", ckpt, "--facts", "3:1,7:0", "--device", "cpu", "--quiet")
    assert proc.returncode == 0, proc.stderr
    out = ckpt / "analysis" / "visualize"
    page = (out / "index.html").read_text()
    assert len(re.findall(r'id="circuits-vis-', page)) == 3  # one attention_heads view per fact, one neuron view
    assert "CircuitsVis.render" in page and "AttentionHeads" in page and "TextNeuronActivations" in page
    assert not REMOTE_SCRIPT.search(page) and "unpkg.com" not in page
    assert 'class="heat"' in page and ">S15<" in page and ">R3<" in page  # head x token table
    views = json.loads((out / "views.json").read_text())
    assert [(f["subject"], f["relation"]) for f in views["facts"]] == [(3, 1), (7, 0)]
    for f in views["facts"]:
        assert f["tokens"][-1] == "EOS" and len(f["tokens"]) == 12
        assert f"S{f['subject']}" in f["tokens"] and f"R{f['relation']}" in f["tokens"]
        assert all(re.fullmatch(r"n\d+", t) for t in f["tokens"] if t[0] not in "SRE")
        assert len(f["unit_writes"]) == visualize.TOP_UNITS


@pytest.mark.parametrize("args, message", [
    (["--facts", "99:0"], "outside the task"),
    (["--facts", "3-1"], "SUBJECT:RELATION"),
    (["--contexts", "0"], "--contexts"),
])
def test_visualize_bad_input_one_line(ckpt, tmp_path, args, message, capsys):
    assert message in refused(visualize.main, [ckpt, "--out", tmp_path / "views", *args], capsys)
    assert not (tmp_path / "views").exists()


@pytest.mark.parametrize("facts, message", [("3-1", "SUBJECT:RELATION"), ("99:0", "outside the task")])
def test_report_refuses_bad_facts_before_writing_anything(tiny_ckpt, tmp_path, facts, message, capsys):
    ckpt = Path(shutil.copytree(tiny_ckpt, tmp_path / "tiny"))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    err = refused(report.main, [ckpt, "--facts", facts, "--device", "cpu", "--quiet"], capsys)
    assert message in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no analysis/ in the checkpoint


@pytest.mark.slow
def test_missing_checkpoint_one_line(tmp_path, capsys):
    proc = run("report", tmp_path / "absent")  # through the real entry point once
    assert proc.returncode == 2 and "no such directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "no such directory" in refused(visualize.main, [tmp_path / "absent"], capsys)
    assert not (tmp_path / "absent").exists()


def test_views_show_the_construction_heads():
    """Theorem 3 construction: each subject has one head that attends to it from EOS; the
    view's labels and masses must find it at the subject's position."""
    model, task = constructed("attention")
    facts = [(s, s % task.n_relations) for s in range(task.n_subjects)]
    prompts = visualize.fact_prompts(model, task, facts, seed=3)
    for p in prompts:
        eos_row = [head[-1] for head in p.pattern]  # [head][key]
        assert all(abs(sum(row) - 1) < 1e-5 for row in eos_row)
        at = p.tokens.index(f"S{p.subject}")
        assert max(row[at] for row in eos_row) > 0.99 and max(p.eos_on_subject) > 0.99
        assert p.predicted == p.answer
        assert all(head[0][1:] == [0.0] * (len(p.tokens) - 1) for head in p.pattern)  # causal
    # a fact's prompt does not depend on the other facts shown
    assert visualize.fact_prompts(model, task, facts[2:3], seed=3)[0].tokens == prompts[2].tokens
    assert len(visualize.attention_views(model, task)) == len(visualize.default_facts(task))


def test_cdn_html_is_small_and_closed():
    """What the committed notebook shows: a few kB that import circuitsvis from unpkg, its
    container closed like offline_html's."""
    model, task = constructed("attention")
    html = visualize.cdn_html(visualize.attention_views(model, task)[0])
    assert html.lstrip().startswith("<div") and "></div>" in html and "/>" not in html.partition("<script")[0]
    assert "https://unpkg.com/circuitsvis" in html and len(html) < 20_000


def test_default_facts_are_spread_and_fixed():
    _, task = constructed("attention")
    facts = visualize.default_facts(task)
    assert facts == visualize.default_facts(task) and len(set(facts)) == 3
    assert facts[0] == (0, 0) and facts[-1] == (task.n_subjects - 1, task.n_relations - 1)


def test_report_cli_reuses_locate_facts_and_hallucination(ckpt):
    assert report.main([str(ckpt), "--device", "cpu", "--quiet"]) == 0
    located, dynamics = ckpt / "analysis" / "report" / "locate_facts", ckpt / "analysis" / "report" / "hallucination"
    page = (ckpt / "analysis" / "report" / "index.html").read_text()
    assert (located / "summary.json").is_file() and (located / "facts.csv").is_file()
    assert (dynamics / "summary.json").is_file() and (dynamics / "metrics.csv").is_file()  # tiny has snapshots
    assert "Where the facts live" in page and "Hallucination phase" in page and "Absent" not in page
    assert page.count(PNG) == 3 + 2 + 1  # locate_facts', the hallucination analysis' and the edit's figures
    assert "<h2>Editing</h2><h3>S" in page and "<td>mlp</td><td>" in page and "<td>ov</td><td>" in page
    assert not REMOTE_SCRIPT.search(page) and "unpkg.com" not in page
    labels = set(__import__("pandas").read_csv(located / "facts.csv")["label"])
    assert len(re.findall(r'id="circuits-vis-', page)) == len(labels) + 1  # a view per storage label found, the neurons
    assert all(f"stored in: {label}</h3>" in page for label in labels)

    # results on disk are read, not recomputed
    recorded = json.loads((dynamics / "summary.json").read_text())
    (dynamics / "summary.json").write_text(json.dumps({"phase": {"start_step": 8, "end_step": 45,
                                                                 "plateau_loss": 1.3862},
                                                       "log_D": 1.3862943611198906, "rule": recorded["rule"],
                                                       "settings": recorded["settings"],
                                                       "snapshots_sha256": recorded["snapshots_sha256"]}))
    stamp = os.stat(located / "summary.json").st_mtime_ns
    page = report.build(ckpt, "cpu", facts="0:0", progress=False)
    assert os.stat(located / "summary.json").st_mtime_ns == stamp  # locate_facts results reused, not rerun
    assert "from step 8 to 45" in page and "1.386" in page and "metrics.csv" in page
    assert page.count(PNG) == 6  # the edit's figure too
    assert len(re.findall(r'id="circuits-vis-', page)) == 2  # the attention view of 0:0, the neuron view
    assert "Absent: the checkpoint has no snapshots" in report.hallucination_section(None)


def test_report_out_holds_what_it_computes_and_reuses_results_of_the_same_settings(ckpt, tmp_path, capsys):
    from analyses import hallucination, locate_facts

    fresh = Path(shutil.copytree(ckpt, tmp_path / "ckpt", ignore=shutil.ignore_patterns("analysis")))
    assert locate_facts.main([str(fresh), "--device", "cpu", "--quiet"]) == 0  # the report's settings
    assert hallucination.main([str(fresh), "--device", "cpu", "--quiet", "--eval-size", "64",  # not them, where
                               "--out", str(fresh / "analysis" / "hallucination")]) == 0  # the report looks
    before = sorted((p, p.stat().st_mtime_ns) for p in (fresh / "analysis").rglob("*"))
    capsys.readouterr()
    out = tmp_path / "report"
    assert report.main([str(fresh), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert f"locate_facts: reusing {fresh / 'analysis' / 'locate_facts'} (the same weights and settings)" in said
    assert (f"hallucination: not reusing {fresh / 'analysis' / 'hallucination'} "
            "(settings.eval_size: recorded 64, now 2048)") in said
    assert sorted((p, p.stat().st_mtime_ns) for p in (fresh / "analysis").rglob("*")) == before  # nothing written
    assert (out / "index.html").is_file() and (out / "hallucination" / "summary.json").is_file()
    assert not (out / "locate_facts").exists()
    assert report.main([str(fresh), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    assert f"hallucination: reusing {out / 'hallucination'} (the same weights and settings)" in capsys.readouterr().out


def files(folder: Path) -> list:
    """Every file under `folder` with its modification time."""
    return sorted((p, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file())


def test_report_leaves_results_of_other_settings_alone(ckpt, tmp_path, capsys):
    from analyses import hallucination, locate_facts

    fresh = Path(shutil.copytree(ckpt, tmp_path / "ckpt", ignore=shutil.ignore_patterns("analysis")))
    # other settings' results where the report looks (by default they go to folders of their own)
    assert locate_facts.main([str(fresh), "--device", "cpu", "--quiet", "--contexts", "4",
                              "--out", str(fresh / "analysis" / "locate_facts")]) == 0
    assert hallucination.main([str(fresh), "--device", "cpu", "--quiet", "--eval-size", "64",
                               "--storage-points", "0", "--out", str(fresh / "analysis" / "hallucination")]) == 0
    theirs = files(fresh / "analysis")
    capsys.readouterr()
    assert report.main([str(fresh), "--device", "cpu", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "(settings.contexts: recorded 4, now 8)" in said and "(settings.eval_size: recorded 64, now 2048" in said
    assert [f for f in files(fresh / "analysis") if "report" not in f[0].parts] == theirs  # none written over
    ours = fresh / "analysis" / "report"
    assert json.loads((ours / "locate_facts" / "summary.json").read_text())["settings"]["contexts"] == 8
    assert (ours / "hallucination" / "summary.json").is_file() and (ours / "index.html").is_file()

    # a report folder that holds other results is refused before anything runs or is written
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(fresh / "analysis" / "locate_facts", elsewhere / "locate_facts")
    before = files(tmp_path)
    err = refused(report.main, [fresh, "--out", elsewhere, "--device", "cpu", "--quiet"], capsys)
    assert f"{elsewhere / 'locate_facts'} holds other locate_facts results (settings.contexts" in err
    assert files(tmp_path) == before


def test_report_fresh_on_a_truncated_snapshot_writes_nothing(ckpt, tmp_path, capsys):
    from analyses import locate_facts

    broken = Path(shutil.copytree(ckpt, tmp_path / "broken", ignore=shutil.ignore_patterns("analysis")))
    assert locate_facts.main([str(broken), "--device", "cpu", "--quiet"]) == 0
    last = sorted((broken / "snapshots").iterdir())[-1]
    last.write_bytes(last.read_bytes()[:100])
    before = files(broken)
    err = refused(report.main, [broken, "--fresh", "--device", "cpu", "--quiet"], capsys)
    assert str(last) in err and files(broken) == before


def test_a_snapshot_s_analysis_has_its_own_folder(ckpt, tmp_path):
    """--step N writes under CKPT/analysis/step_N/, never over the final weights' analysis."""
    from analyses import locate_facts
    from models.checkpoint import snapshot_steps

    fresh = Path(shutil.copytree(ckpt, tmp_path / "ckpt", ignore=shutil.ignore_patterns("analysis")))
    step = snapshot_steps(fresh)[-2]
    common = ["--device", "cpu", "--quiet", "--contexts", "2"]
    assert locate_facts.main([str(fresh), *common, "--patch-contexts", "1"]) == 0
    assert visualize.main([str(fresh), *common, "--facts", "3:1"]) == 0
    finals = files(fresh / "analysis")
    assert locate_facts.main([str(fresh), *common, "--patch-contexts", "1", "--step", str(step)]) == 0
    assert visualize.main([str(fresh), *common, "--facts", "3:1", "--step", str(step)]) == 0
    assert [f for f in files(fresh / "analysis") if f"step_{step}" not in f[0].parts] == finals
    snapshot = fresh / "analysis" / f"step_{step}"
    located = snapshot / "locate_facts" / "contexts-2_patch-contexts-1"  # not the default settings: their own folder
    assert json.loads((located / "summary.json").read_text())["step"] == step
    assert recorded.differences(located, {"step": None}) == [f"step: recorded {step}, now null"]
    assert json.loads((snapshot / "visualize" / "views.json").read_text())["step"] == step


def test_report_refuses_corrupt_locate_results(ckpt, tmp_path, capsys):
    broken = Path(shutil.copytree(ckpt, tmp_path / "broken", ignore=shutil.ignore_patterns("analysis")))
    (broken / "analysis" / "locate_facts").mkdir(parents=True)
    (broken / "analysis" / "locate_facts" / "summary.json").write_text("{not json")
    err = refused(report.main, [broken, "--out", tmp_path / "report", "--device", "cpu"], capsys)
    assert "summary.json: not valid JSON" in err and not (tmp_path / "report").exists()


def test_neuron_view_finds_each_fact_s_own_unit():
    """Theorem 4 construction: MLP unit s*R + r alone fires on fact (s, r) and writes its
    answer; the unit writes add up to the MLP's direct write onto a* less its output bias's."""
    from models.recall.constructions import ANSWER_LOGIT
    from probe.hooks import HOOK_MLP_OUT
    from probe.neurons import unit_writes

    model, task = constructed("mlp")
    facts = [(3, 1), (7, 0), (5, 3)]
    prompts = visualize.fact_prompts(model, task, facts, seed=2)
    view = visualize.unit_view(model, prompts, top=4)
    own = [s * task.n_relations + r for s, r in facts]
    assert set(view.units[:3]) == set(own)
    for i, unit in enumerate(own):
        writes = dict(zip(view.units, view.writes[i]))
        assert writes[unit] == pytest.approx(ANSWER_LOGIT, abs=1e-3)
        assert all(abs(w) < 1e-3 for k, w in writes.items() if k != unit)
    ids = torch.tensor([p.ids for p in prompts])
    answers = torch.tensor([p.answer for p in prompts])
    activations, direct = unit_writes(model, ids, answers)
    _, cache = model.run_with_cache(ids, names_filter=HOOK_MLP_OUT)
    mlp_onto_answer = (cache[HOOK_MLP_OUT][:, -1] - model.b_out[0]) @ model.W_U  # [n, O]
    expected = mlp_onto_answer.gather(-1, answers[:, None])[:, 0]
    assert torch.allclose((activations[:, -1] * direct).sum(-1), expected, atol=1e-4)
    html_text = visualize.neurons_section(view, prompts)
    assert f"unit {own[0]}" in html_text and "circuits-vis" in html_text
    attention_only, _ = constructed("attention")
    assert visualize.unit_view(attention_only, visualize.fact_prompts(attention_only, task, facts)) is None


def test_a_final_weights_report_never_shows_a_step_result(ckpt, tmp_path, capsys):
    """locate_facts --step measures a snapshot; the report is about the final weights, so it
    never shows that result, wherever it lies: where --step writes by default, or in the
    folder the report reads first (--out), as a user may have put it."""
    from analyses import locate_facts
    from models.checkpoint import snapshot_steps

    fresh = Path(shutil.copytree(ckpt, tmp_path / "ckpt", ignore=shutil.ignore_patterns("analysis")))
    step = snapshot_steps(fresh)[1]
    located = fresh / "analysis" / "locate_facts"

    def shown(page: str) -> dict:  # the summary of the locate_facts results the page shows
        folder = re.search(r"From <code>([^<]+)</code>", page).group(1)
        return json.loads((Path(folder) / "summary.json").read_text())

    assert locate_facts.main([str(fresh), "--step", str(step), "--device", "cpu", "--quiet"]) == 0
    assert shown(report.build(fresh, "cpu", progress=False, say=lambda _: None))["step"] is None
    assert locate_facts.main([str(fresh), "--step", str(step), "--device", "cpu", "--quiet", "--out",
                              str(located)]) == 0
    page = report.build(fresh, "cpu", progress=False, analyses=tmp_path / "report", say=lambda _: None)
    assert shown(page)["step"] is None
    assert json.loads((located / "summary.json").read_text())["step"] == step  # left as it was
