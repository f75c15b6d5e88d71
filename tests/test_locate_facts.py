"""locate_facts labels models whose storage is known, and its instruments measure what they claim."""
import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
import torch

from analyses.locate_facts import locate
from models import build_bridge
from models.cli import override
from models.recall.config import RunConfig
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build
from models.recall.presets import preset
from models.recall.trainer import train
from probe import columns
from probe.hooks import HOOK_Z
from probe.prompts import fact_batch
from probe.stats import wilson_interval
from probe.storage import StorageRule
from tests.conftest import quick, run_main

SMALL = dict(contexts=4, patch_contexts=1, progress=False)


def constructed(kind):
    task = CONSTRUCTION_TASK.build()
    model = override(CONSTRUCTION_MODEL, {"attn_only": kind == "attention"})
    return build_bridge(model.checkpoint_section(task), build(kind, task, model)), task


def trained(freeze_ov=False, **model_overrides):
    run = preset("tiny")
    run = RunConfig(run.task, override(run.model, model_overrides), run.train)
    result = train(quick(run, freeze_ov=freeze_ov), progress=False)
    assert result.training["final_accuracy"] >= 0.99
    return build_bridge(result.section, result.weights), result.task


@pytest.fixture(scope="module")
def attention_construction():
    model, task = constructed("attention")
    return model, task, locate(model, task, **SMALL)


@pytest.fixture(scope="module")
def mlp_construction():
    model, task = constructed("mlp")
    return model, task, locate(model, task, **SMALL)


def share(located, label):
    return located.summary.label_shares[label]


def test_theorem3_construction_is_attention(attention_construction):
    _, _, located = attention_construction
    assert located.summary.accuracy == 1.0
    assert share(located, "attention") >= 0.95
    assert located.summary.recall["ov_probe"].value == 1.0  # the OV memory recalls every fact


def test_theorem4_construction_is_mlp(mlp_construction):
    _, _, located = mlp_construction
    assert located.summary.accuracy == 1.0
    assert share(located, "mlp") >= 0.95
    assert located.summary.recall["mlp_probe"].value == 1.0
    facts = located.facts
    assert facts["mean_ablate_mlp_accuracy"].mean() < 0.5  # without the MLP the facts are gone
    assert facts["mlp_path_accuracy"].mean() == 1.0
    assert facts["patch_subject_mlp"].mean() > 0.9  # restoring the MLP output restores the answer


def test_attention_only_trained_model_is_attention():
    model, task = trained(attn_only=True)
    assert share(locate(model, task, **SMALL), "attention") >= 0.95


def test_freeze_ov_trained_model_is_mlp():
    model, task = trained(freeze_ov=True)
    located = locate(model, task, **SMALL)
    assert share(located, "mlp") >= 0.95 and share(located, "both") == 0  # its random OV stores nothing


def test_denoising_finds_the_construction_heads(attention_construction):
    model, task, located = attention_construction
    heads = located.heads.set_index("head")
    relation_head = heads["relation_score"].idxmax()
    assert heads.loc[relation_head, "relation_mass"] > 0.99
    assert heads.loc[relation_head, "n_relations"] == task.n_relations
    # every subject is picked out by exactly one head, with almost all of its attention
    assert (located.head_tokens.filter(like="S").max(axis=0) > 0.99).all()
    assert ((located.head_tokens.filter(like="S") > 0.5).sum(axis=0) == 1).all()


def test_ablating_every_head_destroys_recall(attention_construction):
    _, task, located = attention_construction
    chance = 1 / task.d_vocab_out
    facts = located.facts
    assert facts["zero_ablate_heads_accuracy"].mean() <= 4 * chance
    # right in every context: the share is 1 and its Wilson interval [1 - a few %, 1], not a point
    contexts = located.summary.settings["contexts"]
    every, none = (wilson_interval(torch.tensor(share), contexts) for share in (1.0, 0.0))
    assert (facts["accuracy"] == 1.0).all() and (facts["accuracy_high"] == 1.0).all()
    assert facts["accuracy_low"].to_numpy() == pytest.approx(float(every[0])) and float(every[0]) < 0.9
    # without attention the last position reads EOS alone: one answer in every context
    ablated = facts["zero_ablate_heads_accuracy"]
    assert ablated.isin([0.0, 1.0]).all()
    for share, (low, high) in ((1.0, every), (0.0, none)):
        rows = facts[ablated == share]
        assert rows["zero_ablate_heads_accuracy_low"].to_numpy() == pytest.approx(float(low))
        assert rows["zero_ablate_heads_accuracy_high"].to_numpy() == pytest.approx(float(high))


def test_attribution_margins_add_up(mlp_construction):
    _, _, located = mlp_construction
    f = located.facts
    total = f["attention_margin"] + f["mlp_margin"] + f["direct_margin"]
    assert (total - f["margin"]).abs().max() < 1e-3


def documented_columns(n_heads: int, mlp: bool) -> list[str]:
    """The columns of facts.csv as docs/locate_facts.md lists them, for a model's heads."""
    page = (Path(__file__).parents[1] / "docs" / "locate_facts.md").read_text()
    section = page.split("## The columns of `facts.csv`")[1].split("\n## ")[0]
    listed = []
    for row in re.findall(r"^\| `.*\|$", section, re.M):
        names, interval, what = (cell.strip() for cell in row.strip("|").split("|"))
        if "with an MLP only" in what and not mlp:
            continue
        per_head = [range(n_heads)] if "<h>" in names else [[None]]
        for h in per_head[0]:
            for name in re.findall(r"`([^`]+)`", names):
                name = name.replace("<h>", str(h))
                listed += [name, f"{name}_low", f"{name}_high"] if interval == "interval" else [name]
    return listed


@pytest.mark.parametrize("fixture", ["attention_construction", "mlp_construction"])
def test_facts_have_the_documented_columns(fixture, request):
    model, _, located = request.getfixturevalue(fixture)
    expected = documented_columns(model.cfg.n_heads, mlp=not model.cfg.attn_only)
    assert located.facts.index.names == list(columns.FACT)  # the instruments' index: one fact a row
    assert list(located.facts.reset_index().columns) == expected


def test_locate_builds_the_prompts_once(attention_construction, monkeypatch):
    import probe.prompts

    model, task, _ = attention_construction
    built = []
    monkeypatch.setattr(probe.prompts, "fact_batch", lambda *args: built.append(args) or fact_batch(*args))
    locate(model, task, **SMALL)
    assert len(built) == 2  # once for --contexts, once for --patch-contexts, shared by every instrument
    locate(model, task, **{**SMALL, "patch_contexts": SMALL["contexts"]})
    assert len(built) == 3


@pytest.mark.slow
def test_cli_writes_results_and_summary(tiny_ckpt, tmp_path):
    out = tmp_path / "located"
    proc = subprocess.run([sys.executable, "-m", "analyses.locate_facts", str(tiny_ckpt), "--out", str(out),
                           "--contexts", "4", "--patch-contexts", "1", "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "where the facts live" in proc.stdout and "top heads" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    labels = {"attention", "mlp", "both", "distributed", "not_stored"}
    assert set(summary["label_counts"]) == labels == set(summary["label_shares"])
    assert summary["n_facts"] == 64 and sum(summary["label_counts"].values()) == 64
    assert {"accuracy", "seconds", "settings"} <= set(summary)
    facts = pd.read_csv(out / "facts.csv")
    assert {"subject", "relation", "answer", "label", "accuracy", "attention_margin", "mlp_margin",
            "zero_ablate_mlp_accuracy", "ov_probe", "mlp_probe", "patch_subject_mlp"} <= set(facts.columns)
    assert len(facts) == 64 and len(pd.read_csv(out / "heads.csv")) == 4
    for png in ("labels_per_relation.png", "head_tokens.png", "margins.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("make_bad, message", [
    (lambda p: p / "absent", "no such directory"),
    (lambda p: (p / "config.json").write_text("{}") and p, "lacks the required field 'format'"),
])
def test_cli_bad_checkpoint_one_line_nonzero(tmp_path, capsys, make_bad, message):
    """In this process (run_main: the path `python -m` takes); the command's process is the test above."""
    from analyses.locate_facts import main

    ckpt = make_bad(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    code, _, err = run_main(main, [ckpt], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before  # neither the checkpoint nor its analysis/ created


def _counting_positions(model) -> list[int]:
    """Make `model` count the token positions it runs (every hooked or cached forward)."""
    counted = []
    for name in ("run_with_cache", "run_with_hooks"):
        method = getattr(model, name)

        def counting(tokens, *args, _method=method, **kw):
            counted.append(tokens.numel())
            return _method(tokens, *args, **kw)
        setattr(model, name, counting)
    return counted


def test_chosen_facts_get_their_rows_of_the_run_over_every_fact_for_less_work(mlp_construction):
    """locate(facts=...) measures each chosen fact on its own prompts against the model-wide
    references of every fact (ablation means, chance levels, patching's swaps): its row is
    the one of the whole run, its heads and tokens are its own, and the model runs a
    fraction of the positions."""
    model, task, every = mlp_construction
    model, _ = constructed("mlp")  # a private copy whose forwards are counted
    counted = _counting_positions(model)
    chosen = [(5, 1), (0, 0), (5, 1)]  # in this order, the repeat dropped
    one = locate(model, task, **SMALL, facts=chosen)
    assert [(s, r) for s, r, _ in one.facts.index] == [(5, 1), (0, 0)]
    # the same prompts and references; only float rounding of other batch sizes differs
    pd.testing.assert_frame_equal(one.facts, every.facts.loc[one.facts.index], atol=1e-5)
    assert list(one.facts[columns.ANSWER_NAME]) == [task.answer_label(int(task.facts[s, r])) for s, r in chosen[:2]]
    assert list(one.head_tokens.columns) == ["S5", "S0", "R1", "R0"]
    assert one.summary.n_facts == 2 and one.summary.settings["facts"] == [[5, 1], [0, 0]]
    chosen_positions = sum(counted)
    counted.clear()
    locate(model, task, **SMALL)
    assert chosen_positions < sum(counted) / 2  # every fact's clean runs: the only forwards of every prompt
    with pytest.raises(ValueError, match=r"fact \(99, 0\) is outside the task"):
        locate(model, task, **SMALL, facts=[(99, 0)])


def test_cli_measures_chosen_facts_beside_the_run_over_every_fact(tiny_ckpt, tmp_path, capsys):
    from analyses.locate_facts import main
    from models.cli import run_cli

    ckpt = Path(shutil.copytree(tiny_ckpt, tmp_path / "tiny"))
    assert main([str(ckpt), "--facts", "3:1", "--contexts", "4", "--patch-contexts", "1", "--quiet",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    folder = ckpt / "analysis" / "locate_facts" / "contexts-4_patch-contexts-1" / "facts_3-1"  # settings', facts' own
    facts = pd.read_csv(folder / "facts.csv")
    assert len(facts) == 1 and (facts.subject[0], facts.relation[0]) == (3, 1)
    name = facts.answer_name[0]
    assert re.fullmatch(r"R1:a\d+", name) and f"fact S3 R1 -> {name}: {facts.label[0]}" in out
    assert out.count("  head ") == 4 and "attention on S3" in out and out.startswith(f"{ckpt}: 1 chosen fact\n")
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["settings"]["contexts"], summary["settings"]["facts"], summary["checkpoint"]) == (
        4, [[3, 1]], str(ckpt))
    assert main([str(ckpt), "--facts", "3:1", "--step", "4", "--contexts", "2", "--patch-contexts", "1", "--quiet",
                 "--device", "cpu"]) == 0  # a snapshot's results: beside the final weights', never over them
    step_4 = ckpt / "analysis" / "step_4" / "locate_facts" / "contexts-2_patch-contexts-1" / "facts_3-1"
    at_step = json.loads((step_4 / "summary.json").read_text())
    assert (at_step["step"], at_step["checkpoint"], summary["step"]) == (4, str(ckpt), None)
    capsys.readouterr()
    assert not (ckpt / "analysis" / "locate_facts" / "facts.csv").exists()  # the run over every fact: untouched
    chosen = tmp_path / "chosen"  # --out: the folder named, not a facts_ folder inside it
    assert main([str(ckpt), "--facts", "3:1", "--contexts", "4", "--patch-contexts", "1", "--quiet",
                 "--device", "cpu", "--out", str(chosen)]) == 0
    assert f"wrote {chosen}/ (" in capsys.readouterr().out
    assert sorted(p.name for p in chosen.iterdir() if p.suffix == ".csv") == ["facts.csv", "head_tokens.csv",
                                                                              "heads.csv"]
    assert pd.read_csv(chosen / "facts.csv").equals(facts)
    with pytest.raises(SystemExit) as exit_:  # a snapshot's results into the final weights' folder: refused
        run_cli(lambda: main([str(ckpt), "--facts", "3:1", "--step", "4", "--contexts", "4", "--patch-contexts", "1",
                              "--quiet", "--device", "cpu", "--out", str(chosen)]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"error: {chosen} holds other locate_facts results (step: ")
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main([str(ckpt), "--facts", "3:7", "--out", str(tmp_path / "bad")]))
    assert exit_.value.code == 2 and "outside the task" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_chosen_facts_get_their_own_prompts_and_every_fact_s_means(mlp_construction):
    """A chosen fact's prompts are its prompts among all facts; mean-ablation writes the mean
    over every fact's prompts, not over the chosen ones."""
    from probe.ablation import ablation_hooks
    from probe.prompts import FactPrompts

    model, task, _ = mlp_construction
    every = FactPrompts.build(model, task, contexts=4, seed=0)
    some = FactPrompts.build(model, task, contexts=4, seed=0, facts=[(5, 1)])
    first = (5 * task.n_relations + 1) * 4
    assert torch.equal(some.batch.tokens, every.batch.tokens[first:first + 4])
    assert some.every_fact.batch.tokens.shape == every.batch.tokens.shape
    mean_heads = dict(ablation_hooks(model, task, prompts=some)[columns.ablation("mean", "heads")])[HOOK_Z]
    z = torch.zeros(1, task.seq_len, model.cfg.n_heads, model.cfg.d_head)
    assert torch.allclose(mean_heads(z, None)[0, -1], every.run.z.mean(0), atol=1e-6)
    assert not torch.allclose(every.run.z.mean(0), some.run.z.mean(0), atol=1e-3)  # the chosen ones' would differ


def test_the_report_says_where_the_facts_live_and_what_the_top_heads_attend_to(attention_construction):
    """The printed summary, line by line, against the tables it summarises: the storage split
    (count, share, interval), at most four heads by denoising score with the tokens they
    attend to (six named, the rest counted), where it wrote."""
    from dataclasses import replace

    from analyses.locate_facts import report
    from probe.storage import LABELS

    _, _, located = attention_construction
    s, facts = located.summary, located.facts
    doubled = replace(located, summary=replace(s, top_heads=[*s.top_heads, *s.top_heads]))  # more heads than shown
    text = report(doubled, "ckpt/x", Path("out/y")).splitlines()
    acc = s.accuracy_interval
    assert text[:2] == [f"ckpt/x: {len(facts)} facts, accuracy {acc.value:.3f} [95% CI {acc.low:.3f}, {acc.high:.3f}]",
                        "where the facts live:"]
    for line, label in zip(text[2:2 + len(LABELS)], LABELS):
        n, ci = int((facts[columns.LABEL] == label).sum()), s.label_share_intervals[label]
        assert line.split() == [label, str(n), f"{100 * n / len(facts):.1f}%", f"[{100 * ci.low:.1f},",
                                f"{100 * ci.high:.1f}]"]
    assert text[2 + len(LABELS)] == "top heads by denoising score (1 = all attention on the token, 0 = uniform):"
    shown, heads = text[3 + len(LABELS):-1], located.heads.set_index("head")
    assert len(shown) == 4
    for line, h in zip(shown, doubled.summary.top_heads):
        tokens = f"{heads.loc[h.head].subjects} {heads.loc[h.head].relations}".split()
        listed = " ".join(tokens[:6]) + (f" ... (+{len(tokens) - 6})" if len(tokens) > 6 else "")
        assert line == (f"  head {h.head}: subject {h.subject_score:.2f}, relation {h.relation_score:.2f}; "
                        f"attends to {listed}")
    assert re.fullmatch(r"wrote out/y/ \(facts\.csv, heads\.csv, head_tokens\.csv, summary\.json, figures\) in "
                        r"\d+\.\d s", text[-1])


def test_a_head_s_tokens_are_named_up_to_six_and_the_rest_counted():
    from analyses.locate_facts import _abbreviate

    assert _abbreviate([]) == "no single token (>= 0.5 of its attention)"
    assert _abbreviate(list("abcdef")) == "a b c d e f"
    assert _abbreviate(list("abcdefgh")) == "a b c d e f ... (+2)"


def test_the_report_of_chosen_facts_gives_each_fact_s_margin_and_each_head_s_part(mlp_construction):
    from analyses.locate_facts import report

    model, task, _ = mlp_construction
    chosen = locate(model, task, **SMALL, facts=[(2, 1)])
    text = report(chosen, "ckpt/x", Path("out/y")).splitlines()
    number = r"-?\d+\.\d\d"
    assert text[0] == "ckpt/x: 1 chosen fact"
    assert re.fullmatch(rf"fact S2 R1 -> R1:a\d+: mlp; accuracy 1\.000, margin {number} logits \[95% CI {number}, "
                        rf"{number}\] \(attention {number}, mlp {number}, direct {number}\)", text[1]), text[1]
    heads = text[2:-1]
    assert [line.split(":")[0] for line in heads] == [f"  head {h}" for h in range(model.cfg.n_heads)]
    assert all(re.fullmatch(rf"  head \d: margin [+-]\d+\.\d\d, attention on S2 {number}, on R1 {number}; patching "
                            rf"restores {number} \(subject\), {number} \(relation\)", line) for line in heads), heads
    assert text[-1].startswith("wrote out/y/ (facts.csv, heads.csv, head_tokens.csv, summary.json, figures) in ")


@pytest.fixture(scope="module")
def construction_ckpt(tmp_path_factory):
    """Theorem 4's construction (every fact in the MLP) as a checkpoint: built, not trained."""
    from models.recall.constructions import main as construct

    out = tmp_path_factory.mktemp("construction") / "mlp"
    assert construct(["--kind", "mlp", "--out", str(out)]) == 0
    return out


def test_the_cli_in_process_writes_every_fact_s_results_with_its_settings(construction_ckpt, tmp_path, capsys,
                                                                           monkeypatch):
    """`locate_facts CKPT` with its settings: the tables, summary.json (the settings and the
    checkpoint measured), the figures in CKPT/analysis/locate_facts/, the summary printed, a
    progress bar counting every run unless --quiet; --step of a checkpoint without snapshots
    refused in one line."""
    import analyses.locate_facts as module
    from models.cli import run_cli
    from probe.ablation import n_ablation_runs

    ckpt = Path(shutil.copytree(construction_ckpt, tmp_path / "mlp"))
    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.n = kwargs, 0
            bars.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True
    monkeypatch.setattr(module, "progress_bar", Bar)
    assert module.main([str(ckpt), "--contexts", "3", "--patch-contexts", "1", "--seed", "2", "--device", "cpu"]) == 0
    out = ckpt / "analysis" / "locate_facts" / "contexts-3_patch-contexts-1_seed-2"  # settings not the defaults'
    printed = capsys.readouterr().out
    assert printed.startswith(f"{ckpt}: 32 facts, accuracy 1.000") and f"\nwrote {out}/ (" in printed
    assert {p.name for p in out.iterdir()} == {"facts.csv", "heads.csv", "head_tokens.csv", "summary.json",
                                               "labels_per_relation.png", "head_tokens.png", "margins.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary["settings"][k] for k in ("contexts", "patch_contexts", "seed")} == {
        "contexts": 3, "patch_contexts": 1, "seed": 2}
    assert (summary["checkpoint"], summary["step"], summary["label_counts"]["mlp"]) == (str(ckpt), None, 32)
    assert (summary["settings"]["device"], summary["settings"]["rule"]) == ("cpu", asdict(StorageRule()))
    assert summary["task"] == repr(CONSTRUCTION_TASK.build())
    assert isinstance(summary["seconds"], float) and 0 < summary["seconds"] == round(summary["seconds"], 2) < 600
    assert list(pd.read_csv(out / "facts.csv").columns[:4]) == ["subject", "relation", "answer", "answer_name"]
    model, _ = constructed("mlp")
    assert [(b.kwargs, b.n, b.closed) for b in bars] == [
        ({"total": 6 + n_ablation_runs(model), "desc": "locating facts", "unit": "run", "disable": False},
         6 + n_ablation_runs(model), True)]
    bars.clear()
    assert module.main([str(ckpt), "--contexts", "2", "--patch-contexts", "1", "--quiet", "--device", "cpu",
                        "--out", str(tmp_path / "quiet")]) == 0
    assert [b.kwargs["disable"] for b in bars] == [True]
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: module.main([str(ckpt), "--step", "5", "--quiet", "--device", "cpu"]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "step 5" in err
    from models.aot.train import main as aot_train  # a checkpoint of another task kind: refused in one line

    aot = tmp_path / "aot"
    assert aot_train(["association", "--n-tokens", "4", "--batches", "1", "--epochs", "1", "--batch-size", "4",
                      "--device", "cpu", "--quiet", "--out", str(aot)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: module.main([str(aot), "--quiet", "--device", "cpu"]))
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        f"error: {aot}/config.json: task kind 'association' is not a factual-recall task; this tool reads "
        "factual_recall checkpoints only.\n")
    assert module.parser().description == module.__doc__


def test_locate_s_defaults_and_settings_are_recorded(monkeypatch):
    """locate's defaults are the command's (8 prompts a fact, 2 for patching, seed 0, a
    progress bar), and too few prompts are refused."""
    import analyses.locate_facts as module
    from analyses.locate_facts import LocateSettings

    bars = []
    real = module.progress_bar
    monkeypatch.setattr(module, "progress_bar", lambda **kw: bars.append(kw) or real(**{**kw, "disable": True}))
    located = locate(*constructed("mlp"))
    assert {k: located.summary.settings[k] for k in ("contexts", "patch_contexts", "seed")} == {
        "contexts": 8, "patch_contexts": 2, "seed": 0}
    assert [kw["disable"] for kw in bars] == [False]
    assert asdict(LocateSettings()) == {"contexts": 8, "patch_contexts": 2, "seed": 0}
    LocateSettings(contexts=2, patch_contexts=1)
    with pytest.raises(ValueError, match="contexts"):
        LocateSettings(contexts=1)
    with pytest.raises(ValueError, match="patch_contexts|patch-contexts"):
        LocateSettings(patch_contexts=0)


def test_the_folder_of_chosen_facts_names_up_to_eight_and_digests_more():
    from analyses.locate_facts import facts_folder

    eight = [(s, s % 3) for s in range(8)]
    assert facts_folder(eight) == "facts_" + "_".join(f"{s}-{r}" for s, r in eight)
    nine = eight + [(9, 0)]
    digest = hashlib.sha1("_".join(f"{s}-{r}" for s, r in nine).encode()).hexdigest()[:8]
    assert facts_folder(nine) == f"facts_9_{digest}"


def test_each_head_s_effects_are_its_means_over_the_facts():
    """heads.csv's per-head columns: the means over facts of that head's margin, its zero- and
    mean-ablation accuracy, its OV recall and the shares it restores under patching."""
    located = locate(*constructed("attention"), **SMALL)  # measured here: mutation testing maps it to this test
    facts, heads = located.facts, located.heads.set_index("head")
    for h in heads.index:
        head = columns.head(h)
        expected = {"mean_margin": columns.head_margin(h),
                    "zero_ablation_accuracy": columns.ablated_accuracy("zero", head),
                    "mean_ablation_accuracy": columns.ablated_accuracy("mean", head), "ov_recall": columns.ov_probe(h),
                    "patch_subject_restored": columns.patch("subject", head),
                    "patch_relation_restored": columns.patch("relation", head)}
        means = {k: facts[c].mean() for k, c in expected.items()}
        assert {k: heads.loc[h, k] for k in expected} == pytest.approx(means)


def test_the_cli_takes_a_folder_of_the_same_results_and_refuses_one_of_others(construction_ckpt, tmp_path, capsys):
    """--out holding locate_facts results of the same weights and settings is written again;
    of other settings (or chosen facts) it is refused in one line naming what differs; in the
    checkpoint's own analysis/ folder, results of weights it held before are replaced."""
    import analyses.locate_facts as module
    from models.cli import run_cli

    ckpt = Path(shutil.copytree(construction_ckpt, tmp_path / "mlp"))
    out, quick = tmp_path / "out", ["--patch-contexts", "1", "--quiet", "--device", "cpu"]
    assert module.main([str(ckpt), "--contexts", "2", *quick, "--out", str(out)]) == 0
    assert module.main([str(ckpt), "--contexts", "2", *quick, "--out", str(out)]) == 0  # the same results
    for other, differs in ((["--contexts", "3"], "settings.contexts: recorded 2, now 3"),
                           (["--contexts", "2", "--facts", "1:1"], "settings.facts: recorded (absent), now [[1, 1]]")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            run_cli(lambda other=other: module.main([str(ckpt), *other, *quick, "--out", str(out)]))
        assert exit_.value.code == 2 and capsys.readouterr().err == (
            f"error: {out} holds other locate_facts results ({differs}), which locate_facts does not write over; "
            "move them, or choose another --out.\n")
    own = ckpt / "analysis" / "locate_facts" / "contexts-2_patch-contexts-1"
    assert module.main([str(ckpt), "--contexts", "2", *quick]) == 0
    summary = json.loads((own / "summary.json").read_text())
    (own / "summary.json").write_text(json.dumps({**summary, "weights_sha256": "0" * 64}))  # weights it held before
    assert module.main([str(ckpt), "--contexts", "2", *quick]) == 0
    assert json.loads((own / "summary.json").read_text())["weights_sha256"] == summary["weights_sha256"]


def test_the_chosen_fact_report_writes_no_negative_zero_and_counts_in_words():
    """A value that rounds to zero prints as 0.00 (+0.00), never -0.00; one fact is '1 chosen fact'."""
    from types import SimpleNamespace

    from analyses.locate_facts import Located, fact_report

    tiny = -0.001
    fact = {columns.ANSWER_NAME: "R1:a3", columns.LABEL: "mlp", columns.ACCURACY: 1.0,
            **dict(zip(columns.interval(columns.MARGIN), (tiny, -0.004, 0.003))),
            **{columns.margin(c): tiny for c in (*columns.STORES, "direct")}, columns.head_margin(0): tiny,
            columns.patch("subject", columns.head(0)): tiny, columns.patch("relation", columns.head(0)): tiny}
    facts = pd.DataFrame([fact], index=pd.MultiIndex.from_tuples([(3, 1, 11)], names=columns.FACT))
    tokens = pd.DataFrame({"S3": [0.5], "R1": [-0.0001]}, index=pd.Index([0], name="head"))
    text = fact_report(Located(facts, pd.DataFrame(), tokens, SimpleNamespace(seconds=1.0)), "ckpt", Path("out"))
    assert "-0.00" not in text and text.startswith("ckpt: 1 chosen fact\n")
    assert "margin 0.00 logits [95% CI 0.00, 0.00] (attention 0.00, mlp 0.00, direct 0.00)" in text
    assert "head 0: margin +0.00, attention on S3 0.50, on R1 0.00; patching restores 0.00 (subject), 0.00" in text
