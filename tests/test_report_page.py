"""analyses.report's sections from results written by hand (no model, no training): the
model, locate_facts and hallucination sections, the reuse of recorded results, and the
facts the page shows. (The page of a trained checkpoint: tests/test_visualize_report.py.)"""
import base64
import html
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analyses import report
from models.recall.constructions import CONSTRUCTION_TASK

INTERVAL = {"value": 0.5, "low": 0.25, "high": 0.75}


def locate_summary(**extra) -> dict:
    return {"n_facts": 12, "settings": {"contexts": 8},
            "accuracy_interval": {"value": 0.9876, "low": 0.95, "high": 1.0},
            "label_counts": {"attention": 3, "mlp": 5, "both": 1, "distributed": 0, "not_stored": 3},
            "label_share_intervals": {label: INTERVAL for label in ("attention", "mlp", "both", "distributed",
                                                                    "not_stored")}, **extra}


def model_json(**model) -> dict:
    """A config.json model section of the default task."""
    from models.recall.config import ModelConfig, RunConfig

    return ModelConfig(**model).checkpoint_section(RunConfig().task.build()).to_json()


def test_numbers_and_tables_are_written_as_the_page_shows_them():
    assert report._interval({"value": 0.12345, "low": 0.1, "high": 0.2}) == "0.123 [0.100, 0.200]"
    assert report._interval(INTERVAL, percent=True) == "50.0% [25.0, 75.0]"
    assert report._short(1.234567) == "1.235" and report._short(7) == "7" and report._short("x") == "x"
    assert report._short({"a": [1, 2]}) == '{"a": [1, 2]}' and report._short([Path("p")]) == '["p"]'
    assert report._table([[1, "<b>"]], ["h", "&"]) == ("<table><thead><tr><th>h</th><th>&amp;</th></tr></thead>"
                                                       "<tbody><tr><td>1</td><td>&lt;b&gt;</td></tr></tbody></table>")


def test_an_image_is_embedded_with_its_caption(tmp_path):
    png = tmp_path / "margins.png"
    data = b"\x89PNG data"
    png.write_bytes(data)
    encoded = base64.b64encode(data).decode()
    figure = report._image(png, 'A "caption"')
    assert figure == ('<figure><img alt="A &quot;caption&quot;" src="data:image/png;base64,'
                      f'{encoded}"><figcaption>A &quot;caption&quot; '
                      "(<code>margins.png</code>)</figcaption></figure>")


def test_the_model_section_names_the_shape_the_training_and_the_snapshots(tmp_path):
    (tmp_path / "snapshots").mkdir()
    for step in (0, 4):
        (tmp_path / "snapshots" / f"step_{step:08d}.safetensors").write_bytes(b"")
    config = {"model": model_json(d_model=16, n_heads=2, d_head=8, d_mlp=32),
              "training": {"optimizer": "adam", "lr": 0.0123456, "seed": 3, "steps_run": 40, "other": 1}}
    section = report.model_section(tmp_path, config, "TASK")
    assert section.startswith("<h2>Model</h2><table>")
    assert "<td>task</td><td>&#x27;TASK&#x27;</td>" in section and "<td>d=16 H=2 d_h=8 m=32</td>" in section
    assert "<td>optimizer=adam, lr=0.01235, seed=3, steps_run=40</td>" in section
    assert "<td>snapshots</td><td>2</td>" in section
    attn = report.model_section(Path(tmp_path / "none"), {"model": model_json(attn_only=True)}, "T")
    assert "attention only" in attn and "<td>not recorded</td>" in attn
    assert "<td>snapshots</td><td>0</td>" in attn


def test_the_locate_section_shows_accuracy_labels_probes_heads_and_figures(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(locate_summary(
        recall={"subject": INTERVAL}, path_accuracy={"attention": {"value": 1.0, "low": 1.0, "high": 1.0}})))
    pd.DataFrame({"head": [0, 1], "subject_score": [0.1, 0.9], "relation_score": [0.8, 0.05],
                  "subjects": ["", "S1 S2"], "relations": ["R0", ""], "denoising_score": [0.8, 0.9]}).to_csv(
        tmp_path / "heads.csv", index=False)
    (tmp_path / "margins.png").write_bytes(b"png")
    section = report.locate_section(tmp_path)
    assert f"From <code>{tmp_path}</code>, 12 facts, settings {{&quot;contexts&quot;: 8}}." in section
    assert "<p>accuracy 0.988 [0.950, 1.000]</p>" in section
    assert "<tr><td>mlp</td><td>5</td><td>50.0% [25.0, 75.0]</td></tr>" in section
    assert "<td>subject recall probe</td><td>0.500 [0.250, 0.750]</td>" in section
    assert "<td>attention path accuracy</td><td>1.000 [1.000, 1.000]</td>" in section
    heads = section[section.index("<h3>Heads"):]
    assert heads.index("<td>S1 S2</td>") < heads.index("<td>R0</td>")  # the higher denoising score first
    assert "<tr><td>1</td><td>0.90</td><td>0.05</td><td>S1 S2</td><td>-</td></tr>" in heads
    assert section.count("<figure>") == 1 and "Per fact: logit margin written by attention vs by the MLP" in section
    (tmp_path / "summary.json").write_text(json.dumps(locate_summary()))
    (tmp_path / "heads.csv").unlink()
    bare = report.locate_section(tmp_path)
    assert "recall probe" not in bare and "<h3>Heads" not in bare and "<table>" in bare


def test_the_hallucination_section_shows_the_phase_or_its_absence(tmp_path):
    summary = {"phase": {"start_step": 8, "end_step": 45, "plateau_loss": 1.38629}, "log_D": 1.3862943}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "loss_curve.png").write_bytes(b"png")
    (tmp_path / "metrics.csv").write_text("step\n0\n")
    section = report.hallucination_section(tmp_path)
    assert "Hallucination phase from step 8 to 45" in section and "<td>plateau_loss</td><td>1.386</td>" in section
    assert "<td>log_D</td><td>1.386</td>" in section and "<td>phase</td>" not in section
    assert '<img alt="loss curve"' in section and "Data: <code>metrics.csv</code> in" in section
    (tmp_path / "summary.json").write_text(json.dumps({"phase": None, "log_D": 1.0}))
    (tmp_path / "metrics.csv").unlink()
    none = report.hallucination_section(tmp_path)
    assert "<p>No hallucination phase found in the training curves.</p>" in none and "Data:" not in none
    assert report.hallucination_section(None).startswith("<h2>Hallucination phase</h2><p class=\"note\">Absent")


def test_the_page_shows_the_first_fact_of_each_label_found():
    facts = pd.DataFrame({"subject": [0, 1, 2, 3, 4], "relation": [0, 0, 1, 1, 2],
                          "label": ["mlp", "attention", "mlp", "not_stored", "attention"]})
    assert report.facts_to_show(facts) == [(1, 0), (0, 0), (3, 1)]  # attention, mlp, not_stored
    both = pd.DataFrame({"subject": [5, 6, 7], "relation": [0, 1, 2], "label": ["not_stored", "both", "mlp"]})
    assert report.facts_to_show(both) == [(7, 2), (6, 1), (5, 0)]


def test_the_report_takes_facts_and_fresh_but_no_step():
    args = report.parser().parse_args(["CKPT", "--facts", "1:2", "--fresh"])
    assert (args.facts, args.fresh) == ("1:2", True)
    defaults = report.parser().parse_args(["CKPT"])
    assert (defaults.facts, defaults.fresh) == (None, False) and not hasattr(defaults, "step")


# ------------------------------------------------------------------ the page of a checkpoint whose results are recorded
@pytest.fixture
def recorded_ckpt(tmp_path):
    """The Theorem 4 construction as a checkpoint with two snapshots, and locate_facts and
    hallucination results written by hand with the report's settings (so nothing is computed)."""
    from dataclasses import asdict

    from analyses.hallucination import HallucinationSettings
    from analyses.locate_facts import LocateSettings
    from models.checkpoint import snapshots_sha256, weights_sha256, write_checkpoint
    from models.cli import override
    from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build
    from probe.phases import PhaseRule
    from probe.storage import StorageRule

    task = CONSTRUCTION_TASK.build()
    config = override(CONSTRUCTION_MODEL, {"attn_only": False})
    weights = build("mlp", task, config)
    ckpt = write_checkpoint(tmp_path / "ckpt", config.checkpoint_section(task), task,
                            {"optimizer": "adam", "lr": 0.01, "seed": 0}, weights, [], {0: weights, 4: weights})
    located = ckpt / "analysis" / "locate_facts"
    located.mkdir(parents=True)
    settings = {**asdict(LocateSettings()), "rule": asdict(StorageRule()), "device": "cuda"}
    (located / "summary.json").write_text(json.dumps(locate_summary(step=None, settings=settings,
                                                                    weights_sha256=weights_sha256(ckpt))))
    pd.DataFrame({"subject": [0, 1, 2], "relation": [0, 0, 1], "label": ["mlp", "mlp", "attention"]}).to_csv(
        located / "facts.csv", index=False)
    dynamics = ckpt / "analysis" / "hallucination"
    dynamics.mkdir()
    (dynamics / "summary.json").write_text(json.dumps({
        "snapshots_sha256": snapshots_sha256(ckpt), "settings": asdict(HallucinationSettings()),
        "rule": asdict(PhaseRule()), "phase": {"start_step": 8, "end_step": 45}, "log_D": 1.386}))
    return ckpt


def test_the_page_reuses_recorded_results_and_shows_their_facts(recorded_ckpt):
    said = []
    page = report.build(recorded_ckpt, "cpu", progress=False, say=said.append)
    same = "(the same weights and settings)"
    assert said[:2] == [f"locate_facts: reusing {recorded_ckpt / 'analysis' / 'locate_facts'} {same}",
                        f"hallucination: reusing {recorded_ckpt / 'analysis' / 'hallucination'} {same}"]
    assert len(said) == 3 and re.fullmatch(r"attention views of S\d+ R\d+ \(\w+\), S\d+ R\d+ \(\w+\)", said[2])
    assert "(attention)" in said[2] and "(mlp)" in said[2]  # the facts shown, with their labels
    assert "<title>Report: ckpt</title>" in page
    assert f"Checkpoint <code>{recorded_ckpt}</code>. Everything on this page is in this one file" in page
    assert "<td>snapshots</td><td>2</td>" in page and "optimizer=adam, lr=0.01, seed=0" in page
    assert "Hallucination phase from step 8 to 45" in page
    assert "stored in: attention</h3>" in page and "stored in: mlp</h3>" in page  # a view per label found
    assert "<h2>Attention</h2><h3>Which heads pick which subject and relation</h3>" in page
    assert "<h2>MLP</h2><h3>MLP units that fire and write each fact's answer</h3>" in page
    assert f"<td>task</td><td>{html.escape(repr(CONSTRUCTION_TASK.build()))}</td>" in page
    assert page.count('id="circuits-vis-') == 3  # the two facts shown, the neuron view
    chosen = report.build(recorded_ckpt, "cpu", facts="3:1", progress=False, say=said.append)
    assert chosen.count('id="circuits-vis-') == 2 and "S3" in chosen


def test_the_report_writes_one_page_beside_the_results_it_reads(recorded_ckpt, tmp_path, capsys):
    assert report.main([str(recorded_ckpt), "--device", "cpu", "--quiet"]) == 0
    out = recorded_ckpt / "analysis" / "report"
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-1].startswith(f"wrote {out}/index.html (") and said[-1].endswith(" MB, opens offline)")
    assert (out / "index.html").read_text().startswith("<!DOCTYPE html>")
    elsewhere = tmp_path / "elsewhere"
    assert report.main([str(recorded_ckpt), "--device", "cpu", "--quiet", "--out", str(elsewhere)]) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == ["index.html"]  # the results recorded in CKPT are read
    assert "reusing" in capsys.readouterr().out


def test_results_not_recorded_are_computed_into_the_folder_asked(recorded_ckpt, tmp_path):
    from models import load

    model, task = load(recorded_ckpt, "cpu", kind="factual_recall")
    said = []
    into = tmp_path / "report" / "locate_facts"
    recorded = recorded_ckpt / "analysis" / "locate_facts" / "summary.json"
    recorded.write_text(json.dumps({**json.loads(recorded.read_text()), "step": 4}))  # a snapshot's: not these
    assert done(report.located_results(recorded_ckpt, model, task, into, progress=False, say=said.append)) == into
    summary = json.loads((into / "summary.json").read_text())
    assert summary["step"] is None
    assert said == [f"locate_facts: not reusing {recorded.parent} (step: recorded 4, now null)"]
    assert (into / "facts.csv").is_file()
    said.clear()
    again = done(report.located_results(recorded_ckpt, model, task, into, say=said.append))  # not fresh by default
    assert again == into and said == [f"locate_facts: reusing {into} (the same weights and settings)"]


def test_the_sections_in_full(tmp_path):
    """The HTML of the model and hallucination sections, whole, for small inputs."""
    config = {"model": model_json(d_model=4, n_heads=1, d_head=2, d_mlp=3),
              "training": {"final_accuracy": 0.5, "final_loss": 0.25}}
    assert report.model_section(tmp_path, config, "T") == (
        "<h2>Model</h2><table><thead><tr><th></th><th></th></tr></thead><tbody>"
        "<tr><td>task</td><td>&#x27;T&#x27;</td></tr><tr><td>model</td><td>d=4 H=1 d_h=2 m=3</td></tr>"
        "<tr><td>training</td><td>final_accuracy=0.5, final_loss=0.25</td></tr>"
        "<tr><td>snapshots</td><td>0</td></tr></tbody></table>")
    (tmp_path / "summary.json").write_text(json.dumps({"phase": {"start_step": 8, "end_step": 9}, "log_D": 2}))
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text("x\n")
    assert report.hallucination_section(tmp_path) == (
        "<h2>Hallucination phase</h2>\n<p>Hallucination phase from step 8 to 9: the model answers from the "
        "relation alone (loss near log D) before it recalls the subject's answer.</p>\n"
        "<table><thead><tr><th>phase</th><th>value</th></tr></thead><tbody><tr><td>start_step</td><td>8</td></tr>"
        "<tr><td>end_step</td><td>9</td></tr></tbody></table>\n"
        "<table><thead><tr><th>field</th><th>value</th></tr></thead><tbody><tr><td>log_D</td><td>2</td></tr>"
        '</tbody></table>\n<p class="note">Data: <code>a.csv</code>, <code>b.csv</code> in '
        f"<code>{tmp_path}</code>.</p>")
    (tmp_path / "summary.json").write_text(json.dumps({"log_D": 2}))
    assert "\n<p>No hallucination phase found in the training curves.</p>\n<table>" in report.hallucination_section(
        tmp_path)
    assert report.hallucination_section(None) == (
        '<h2>Hallucination phase</h2><p class="note">Absent: the checkpoint has no snapshots (train with '
        "<code>--snapshots-per-octave</code> &gt; 0 to study the training dynamics).</p>")
    (tmp_path / "summary.json").write_text(json.dumps({k: v for k, v in locate_summary().items() if k != "settings"}))
    assert report.locate_section(tmp_path).startswith(
        "<h2>Where the facts live (locate_facts)</h2>\n"
        f'<p class="note">From <code>{tmp_path}</code>, 12 facts, settings {{}}. Intervals are 95% bootstrap '
        "intervals over facts.</p>\n<p>accuracy")
    (tmp_path / "summary.json").write_text(json.dumps({**locate_summary(), "intervals": "wilson"}))
    assert "Intervals are 95% Wilson intervals over facts.</p>" in report.locate_section(tmp_path)


def test_the_report_s_help_names_its_options():
    text = " ".join(report.parser().format_help().split())
    assert text.startswith("usage: python -m analyses.report [-h] [--out OUT] [--device DEVICE] [--seed SEED] "
                           "[--quiet] [--facts S:R,...] [--fresh] ckpt python -m analyses.report CKPT/ : one offline")
    assert ("--facts S:R,... facts whose attention to show (default: the first fact of each storage label found) "
            "--fresh rerun locate_facts and the hallucination analysis even when results with the same settings are "
            "recorded") in text
    assert "--seed SEED seed of the attention-view prompts (default 0)" in text


def test_the_locate_section_in_full(tmp_path):
    summary = locate_summary(recall={"subject": INTERVAL})
    summary["label_share_intervals"] = {label: {"value": 0.0, "low": 0.0, "high": 0.0} for label in
                                        summary["label_share_intervals"]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"head": [0], "subject_score": [0.1], "relation_score": [0.8], "subjects": [""],
                  "relations": ["R0"], "denoising_score": [0.8]}).to_csv(tmp_path / "heads.csv", index=False)
    labels = "".join(f"<tr><td>{label}</td><td>{count}</td><td>0.0% [0.0, 0.0]</td></tr>"
                     for label, count in summary["label_counts"].items())
    assert report.locate_section(tmp_path) == (
        "<h2>Where the facts live (locate_facts)</h2>\n"
        f'<p class="note">From <code>{tmp_path}</code>, 12 facts, settings {{&quot;contexts&quot;: 8}}. Intervals are '
        "95% bootstrap intervals over facts.</p>\n<p>accuracy 0.988 [0.950, 1.000]</p>\n"
        "<table><thead><tr><th>label</th><th>facts</th><th>share [95% CI]</th></tr></thead><tbody>"
        f"{labels}</tbody></table>\n"
        "<table><thead><tr><th>measure</th><th>mean over facts [95% CI]</th></tr></thead><tbody>"
        "<tr><td>subject recall probe</td><td>0.500 [0.250, 0.750]</td></tr></tbody></table>\n"
        "<h3>Heads (denoising: 1 = all of the EOS query's attention on the token, 0 = uniform)</h3>\n"
        "<table><thead><tr><th>head</th><th>subject score</th><th>relation score</th><th>subjects (&gt;= 0.5)</th>"
        "<th>relations (&gt;= 0.5)</th></tr></thead><tbody><tr><td>0</td><td>0.10</td><td>0.80</td><td>-</td>"
        "<td>R0</td></tr></tbody></table>")


def done(found) -> Path | None:
    """The folder of an analysis the report asked for, computed and written first where the
    report defers that (an object with `folder`, `compute` and `write`)."""
    if found is None or isinstance(found, Path):
        return found
    if found.compute is not None:
        found.write(found.compute())
    return found.folder


def _without_ids(page: str) -> str:
    return re.sub(r'circuits-vis-[\w-]+', "circuits-vis", page)


def test_the_page_s_defaults_and_its_results_read_from_the_folder_asked(recorded_ckpt, tmp_path):
    page = report.build(recorded_ckpt, progress=False, say=lambda _: None)  # device auto: the CPU here
    assert _without_ids(page) == _without_ids(report.build(recorded_ckpt, "cpu", seed=0, progress=False,
                                                           say=lambda _: None))
    assert _without_ids(page) != _without_ids(report.build(recorded_ckpt, "cpu", seed=1, progress=False,
                                                           say=lambda _: None))
    assert "opens offline.</p>\n<h2>Model</h2>" in page and "</table>\n<h2>Where the facts live" in page
    moved = tmp_path / "moved"
    shutil.move(recorded_ckpt / "analysis", moved)
    said = []
    report.build(recorded_ckpt, "cpu", progress=False, analyses=moved, say=said.append)
    assert said[:2] == [f"locate_facts: reusing {moved / 'locate_facts'} (the same weights and settings)",
                        f"hallucination: reusing {moved / 'hallucination'} (the same weights and settings)"]


def test_the_report_cli_reads_and_writes_beside_its_out(recorded_ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(recorded_ckpt / "analysis", out)
    shutil.rmtree(recorded_ckpt / "analysis")
    assert report.main([str(recorded_ckpt), "--device", "cpu", "--quiet", "--out", str(out), "--facts", "3:1",
                        "--seed", "2"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"locate_facts: reusing {out / 'locate_facts'} (the same weights and settings)"
    text = (out / "index.html").read_text()
    assert said[-1] == f"wrote {out}/index.html ({len(text) / 1e6:.1f} MB, opens offline)"
    assert text.count('id="circuits-vis-') == 2 and not (recorded_ckpt / "analysis").exists()
    again = report.build(recorded_ckpt, "cpu", facts="3:1", seed=2, progress=False, analyses=out, say=lambda _: None)
    assert _without_ids(again) == _without_ids(text)


def test_results_computed_for_the_page_go_into_the_report_s_own_folder(recorded_ckpt):
    recorded = recorded_ckpt / "analysis" / "locate_facts"
    (recorded / "summary.json").unlink()
    before = {p.name: p.read_bytes() for p in recorded.iterdir() if p.is_file()}
    assert report.main([str(recorded_ckpt), "--device", "cpu", "--quiet"]) == 0
    summary = json.loads((recorded_ckpt / "analysis" / "report" / "locate_facts" / "summary.json").read_text())
    assert summary["step"] is None and summary["n_facts"] == CONSTRUCTION_TASK.build().n_facts
    assert {p.name: p.read_bytes() for p in recorded.iterdir() if p.is_file()} == before  # left as it was


def test_a_hallucination_analysis_not_recorded_is_run_into_the_folder_asked(recorded_ckpt, tmp_path):
    (recorded_ckpt / "analysis" / "hallucination" / "summary.json").unlink()
    into = tmp_path / "hallucination"
    said = []
    assert done(report.hallucination_results(recorded_ckpt, into, say=said.append)) == into  # device auto: the CPU
    assert (into / "summary.json").is_file() and said == []
    assert done(report.hallucination_results(recorded_ckpt, into, say=said.append)) == into
    assert said == [f"hallucination: reusing {into} (the same weights and settings)"]
    shutil.rmtree(recorded_ckpt / "snapshots")
    assert report.hallucination_results(recorded_ckpt, into, say=said.append) is None  # nothing to follow


def test_fresh_reruns_both_analyses_though_their_results_are_recorded(recorded_ckpt, capsys):
    recorded = recorded_ckpt / "analysis" / "hallucination" / "summary.json"
    written_by_hand = recorded.read_bytes()
    assert report.main([str(recorded_ckpt), "--device", "cpu", "--quiet", "--fresh"]) == 0
    assert "reusing" not in capsys.readouterr().out
    own = recorded_ckpt / "analysis" / "report"
    located = json.loads((own / "locate_facts" / "summary.json").read_text())
    assert located["n_facts"] == CONSTRUCTION_TASK.build().n_facts and "label_counts" in located
    dynamics = json.loads((own / "hallucination" / "summary.json").read_text())
    assert dynamics.get("phase") != {"start_step": 8, "end_step": 45}  # the analysis', not the one written by hand
    assert recorded.read_bytes() == written_by_hand  # a recorded result is never written over
