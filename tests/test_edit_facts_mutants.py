"""python -m analyses.edit_facts held to what it documents (docs/editing.md; docs/testing.md,
its mutation score): the folder of a set of edits, the columns and records it writes, each
line it prints, an ov write at the head asked, the saved model's record of its edits, each
option's help, and each refusal's whole line."""
import json
import sys

import pandas as pd
import pytest
import torch

from analyses.edit_facts import edits_folder, main, parser
from models import load
from models.checkpoint import read_config, weights_sha256, write_checkpoint
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, build_storage
from probe.editing import FactEdit
from probe.hooks import hooked_last_logits
from probe.prompts import fact_batch
from tests.conftest import run_main

TASK = CONSTRUCTION_TASK.build()
STRUCTURED = override(CONSTRUCTION_TASK, {"facts": "structured"}).build()
QUIET = ["--quiet", "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Theorem 4 (mlp), Theorem 3 (attention), and a model keeping each fact where a plan says."""
    root = tmp_path_factory.mktemp("edit_mutants")
    ckpts = {}
    for kind in ("mlp", "attention"):
        cfg = override(CONSTRUCTION_MODEL, {"attn_only": kind == "attention"})
        ckpts[kind] = write_checkpoint(root / kind, cfg.checkpoint_section(TASK), TASK, {}, build(kind, TASK, cfg))
    pattern = ["attention", "mlp", "both", "mlp"]
    plan = [[pattern[(s + r) % 4] for r in range(4)] for s in range(8)]
    ckpts["planned"] = write_checkpoint(root / "planned", CONSTRUCTION_MODEL.checkpoint_section(STRUCTURED),
                                        STRUCTURED, {}, build_storage(STRUCTURED, CONSTRUCTION_MODEL, plan, 5.0, 5.0))
    return ckpts


def test_a_set_of_edits_is_named_by_its_first_four_and_how_many_more():
    edits = [FactEdit(s, 1, 4 + s % 4) for s in range(6)]
    assert edits_folder(edits[:4], "mlp") == "0-1_to_4_1-1_to_5_2-1_to_6_3-1_to_7_at-mlp"
    assert edits_folder(edits[:5], "ov") == "0-1_to_4_1-1_to_5_2-1_to_6_3-1_to_7_and_1_more_at-ov"
    assert edits_folder(edits, "auto") == "0-1_to_4_1-1_to_5_2-1_to_6_3-1_to_7_and_2_more_at-auto"
    assert edits_folder(edits[:1], "mlp", 0, "subject") == "0-1_to_4_at-mlp-L0-subject"  # then the layer, the position
    assert edits_folder(edits[:1], "ov", 1) == "0-1_to_4_at-ov-L1"
    assert edits_folder(edits[:1], "mlp", None, "subject") == "0-1_to_4_at-mlp-subject"


def test_an_ov_write_at_the_head_asked_is_written_recorded_and_printed_line_by_line(checkpoints, capsys):
    ckpt = checkpoints["attention"]
    code, out, err = run_main(main, [ckpt, "--fact", "3:1", "--to", "R1:a0", "--at", "ov", "--head", "0",
                                     "--margin", "3", *QUIET], capsys)
    assert code == 0 and err == "", err
    folder = ckpt / "analysis" / "edit_facts" / "3-1_to_4_at-ov" / "margin-3"
    edits = pd.read_csv(folder / "edits.csv")
    assert list(edits.columns) == ["subject", "relation", "at", "head", "layer", "position", "old_answer",
                                   "new_answer", "efficacy", "efficacy_low", "efficacy_high", "old_rank", "new_margin",
                                   "leak", "old_name", "new_name", "boost", "value"]
    e = edits.iloc[0]
    assert (e["at"], e["head"], e["layer"], e["position"], e["old_name"], e["new_name"], e["boost"], e["efficacy"],
            e["value"]) == ("ov", 0, 0, "last", "R1:a3", "R1:a0", 1.0, 1.0, "closed")  # the closed form's write won
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["settings"] == {"contexts": 8, "margin": 3.0, "form": "exact", "value": "auto", "seed": 0,
                                   "at": "ov", "head": 0, "layer": None, "position": "last", "edits": [[3, 1, 4]]}
    assert summary["step"] is None and summary["efficacy"] == 1.0 and list(summary["weight_change"]) == ["W_O"]
    model, _ = load(ckpt, "cpu")
    change = summary["weight_change"]["W_O"]
    assert change["relative"] == pytest.approx(change["norm"] / model.W_O[0].detach().norm().item(), rel=1e-5)
    spec = summary["specificity"]
    lines = [f"{ckpt}: 1 edit",
             f"  S3 R1: R1:a3 -> R1:a0 at ov (head 0), layer 0: efficacy 1.00 [{e['efficacy_low']:.2f}, 1.00], "
             f"old answer's rank {e['old_rank']:.1f}, margin {e['new_margin']:+.2f}, leak {e['leak']:.2f}",
             *(f"  other facts unchanged, {group.replace('_', ' ')}: {spec[group]['share']:.3f} "
               f"[{spec[group]['low']:.3f}, {spec[group]['high']:.3f}] of {spec[group]['facts']}"
               for group in ("same_subject", "same_relation", "other", "all")),
             f"  weight change W_O: {change['norm']:.3g} ({100 * change['relative']:.1f}% of its norm)",
             f"wrote {folder}/ (edits.csv, summary.json)"]
    assert out.splitlines() == lines
    assert "margin +3.00" in lines[1] and "same relation: 1.000" in out


def test_the_saved_model_records_its_edits_and_force_replaces_an_earlier_one(checkpoints, tmp_path, capsys):
    ckpt, saved = checkpoints["mlp"], tmp_path / "edited"
    argv = [ckpt, "--fact", "3:1", "--to", "R1:a0", "--fact", "0:2", "--to", "11", "--head", "2", "--save", saved,
            *QUIET]  # --head: an mlp write has none
    assert run_main(main, [*argv, "--out", tmp_path / "first", "--form", "memit"], capsys)[0] == 0
    code, out, err = run_main(main, [*argv, "--force", "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:2] == [f"--force: replaced the model in {saved}.", f"{ckpt}: 2 edits"]
    assert " at mlp, layer 0: efficacy 1.00" in lines[2] and lines[2].endswith("leak 0.00")
    assert lines[-1] == f"wrote {tmp_path / 'run'}/ (edits.csv, summary.json) and the edited model to {saved}/"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    config, _ = read_config(saved)
    assert config["training"]["edited"] == {k: summary[k] for k in ("checkpoint", "step", "weights_sha256", "settings")}
    assert summary["settings"]["edits"] == [[3, 1, 4], [0, 2, 11]] and summary["checkpoint"] == str(ckpt)
    edits = pd.read_csv(tmp_path / "run" / "edits.csv")
    assert edits["head"].isna().all() and edits["at"].tolist() == ["mlp", "mlp"]
    original, _ = load(ckpt, "cpu")
    edited, _ = load(saved, "cpu")
    change = (edited.W_out - original.W_out)[0].detach()
    weight = summary["weight_change"]["W_out"]
    assert change.norm().item() == pytest.approx(weight["norm"], rel=1e-4)
    assert weight["relative"] == pytest.approx(weight["norm"] / original.W_out[0].detach().norm().item(), rel=1e-5)
    memit = json.loads((tmp_path / "first" / "summary.json").read_text())["weight_change"]["W_out"]["norm"]
    assert memit < 0.99 * weight["norm"]  # MEMIT's form reaches each key's value only in part
    assert isinstance(summary["seconds"], float) and 0 <= summary["seconds"] < 600
    assert round(summary["seconds"], 2) == summary["seconds"]
    assert torch.equal(edited.W_O, original.W_O)


def test_a_snapshot_asked_by_step_is_the_one_edited_recorded_and_saved(tmp_path, capsys):
    """The final weights hold no fact (Theorem 4's MLP zeroed), the snapshot of step 5 is
    Theorem 4: --step 5 edits that snapshot, records it, and saves it with the write."""
    built = build("mlp", TASK, CONSTRUCTION_MODEL)
    ckpt = write_checkpoint(tmp_path / "c", CONSTRUCTION_MODEL.checkpoint_section(TASK), TASK, {},
                            {**built, "blocks.0.mlp.W_out": torch.zeros_like(built["blocks.0.mlp.W_out"])},
                            snapshots={5: built})
    saved = tmp_path / "edited"
    code, _, err = run_main(main, [ckpt, "--step", "5", "--fact", "3:1", "--to", "R1:a0", "--save", saved, "--out",
                                   tmp_path / "run", *QUIET], capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary) == {"step", "weights_sha256", "settings", "checkpoint", "specificity", "weight_change",
                            "efficacy", "seconds"}
    assert summary["step"] == 5 and summary["weights_sha256"] == weights_sha256(ckpt, 5) != weights_sha256(ckpt)
    assert read_config(saved)[0]["training"]["edited"]["step"] == 5 and summary["efficacy"] == 1.0
    model, task = load(saved, "cpu")
    answers = hooked_last_logits(model, fact_batch(task, 4, seed=5).tokens).argmax(-1).reshape(-1, 4)  # [F, 4]
    assert (answers[3 * 4 + 1] == 4).all() and (answers[0] == int(TASK.facts[0, 0])).all()


def test_a_checkpoint_of_another_task_is_refused_in_its_whole_line(checkpoints, tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "c", CONSTRUCTION_MODEL.checkpoint_section(TASK), TASK, {},
                            build("mlp", TASK, CONSTRUCTION_MODEL))
    config = json.loads((ckpt / "config.json").read_text())
    config["task"]["kind"] = "association"
    (ckpt / "config.json").write_text(json.dumps(config))
    code, _, err = run_main(main, [ckpt, "--fact", "3:1", "--to", "R1:a0", *QUIET], capsys)
    assert code == 2 and err.strip() == (f"error: {ckpt / 'config.json'}: task kind 'association' is not a "
                                         "factual-recall task; this tool reads factual_recall checkpoints only.")


def test_the_same_edits_again_find_their_own_results(checkpoints, tmp_path, capsys):
    argv = [checkpoints["mlp"], "--fact", "3:1", "--to", "R1:a0", "--out", tmp_path, *QUIET]
    assert run_main(main, argv, capsys)[0] == 0
    code, _, err = run_main(main, argv, capsys)
    assert code == 0, err


def test_the_same_edits_with_other_settings_are_refused_and_the_first_results_kept(checkpoints, tmp_path, capsys):
    argv = [checkpoints["mlp"], "--fact", "3:1", "--to", "R1:a0", "--out", tmp_path, *QUIET]
    assert run_main(main, [*argv, "--margin", "3"], capsys)[0] == 0
    first = (tmp_path / "summary.json").read_text()
    code, _, err = run_main(main, [*argv, "--margin", "2", "--seed", "1"], capsys)
    assert code == 2 and err.strip() == (f"error: {tmp_path} holds other edit_facts results (settings.margin: "
                                         "recorded 3.0, now 2.0; settings.seed: recorded 0, now 1), which edit_facts "
                                         "does not write over; move them, or choose another --out."), err
    assert (tmp_path / "summary.json").read_text() == first


def test_auto_writes_a_fact_at_the_head_carrying_its_subject_or_at_the_head_asked(checkpoints, tmp_path, capsys):
    """Facts 0:0 and 3:1 live in the attention, subjects 0 and 3 at head 0 (head 3 reads every
    subject too: the tie goes to the larger key of the fact itself)."""
    ckpt = checkpoints["planned"]
    facts = []
    for s, r in ((0, 0), (3, 1)):
        facts += ["--fact", f"{s}:{r}", "--to", str(4 * r + (int(STRUCTURED.facts[s, r]) + 1) % 4)]
    for head, chosen in ((None, 0), ("3", 3)):  # the head asked, not the best
        out = tmp_path / f"head-{head}"
        code, _, err = run_main(main, [ckpt, *facts, "--at", "auto", *(["--head", head] if head else []),
                                       "--out", out, *QUIET], capsys)
        assert code == 0 and err == "", err
        assert pd.read_csv(out / "edits.csv")[["at", "head"]].values.tolist() == [["ov", chosen]] * 2


def test_study_goes_to_the_editing_study(capsys):
    code, out, _ = run_main(main, ["study", "--help"], capsys)
    assert code == 0 and out.startswith("usage: python -m analyses.edit_study")


OPTIONS = {  # option: its help, metavar, whether it is required, its choices and its default
    "--fact": ("the fact to edit, as locate_facts --facts names it (3:1); once per edited fact", "S:R", True, None,
               None),
    "--to": ("its new answer: a name the toolkit prints (R1:a2) or an answer id; once per --fact", "ANSWER", True,
             None, None),
    "--at": ("the store written: the MLP's W_out, a head's W_O, or where the fact lives (default mlp)", None, False,
             ("mlp", "ov", "auto"), "mlp"),
    "--head": ("the head an ov write goes to (needed with more than one head, but for --at auto)", None, False, None,
               None),
    "--layer": ("the block written (default: the last; block 0 with --position subject)", None, False, None, None),
    "--position": ("where an MLP write's key is read: the last position, or the subject's (ROME's key; the block's "
                   "MLP output there reaches the answer through a later block's heads)", None, False,
                   ("last", "subject"), "last"),
    "--save": ("write the edited model as a checkpoint to DIR (never the checkpoint read)", "DIR", False, None, None),
    "--force": ("replace the checkpoint at --save: its model's files only (a user's files stay, its analysis/ is "
                "moved aside); a folder that is not a checkpoint is refused", None, False, None, False),
}


def test_each_option_says_what_it_does_and_takes_what_it_says():
    p = parser()
    actions = {a.option_strings[0]: a for a in p._actions if a.option_strings}
    for option, (said, metavar, required, choices, default) in OPTIONS.items():
        a = actions[option]
        assert (a.help, a.metavar, a.required, a.choices, a.default) == (said, metavar, required, choices, default)
    assert p.prog == "python -m analyses.edit_facts" and p.description.startswith("python -m analyses.edit_facts CKPT")
    assert actions["--seed"].help == "seed of the noise contexts of the keys (default 0)"
    group = next(g for g in p._action_groups if "--margin" in [o for a in g._group_actions for o in a.option_strings])
    assert group.title == "the edit"


def test_a_run_from_the_command_line_reads_sys_argv(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["edit_facts", "study", "--help"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m analyses.edit_study")


def test_one_context_and_a_margin_below_one_are_taken(checkpoints, tmp_path, capsys):
    code, _, err = run_main(main, [checkpoints["mlp"], "--fact", "3:1", "--to", "R1:a0", "--contexts", "1",
                                   "--margin", "0.5", "--out", tmp_path, *QUIET], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "summary.json").read_text())["settings"]["contexts"] == 1


@pytest.mark.parametrize("kind, args, said", [
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--fact", "0:0"], "give one --to per --fact: 2 --fact, 1 --to."),
    ("mlp", ["--fact", "3:1", "--to", "R2:a0"],
     "--to R2:a0: not one of relation R1's answers (R1:a0, R1:a1, R1:a2, R1:a3, or ids 4..7)."),
    ("mlp", ["--fact", "3:1", "--to", "12"],
     "--to 12: not one of relation R1's answers (R1:a0, R1:a1, R1:a2, R1:a3, or ids 4..7)."),
    ("mlp", ["--fact", "3:1,0:0", "--to", "R1:a0"],
     "--fact takes one fact (give --fact/--to once per fact), got '3:1,0:0'."),
    ("attention", ["--fact", "3:1", "--to", "R1:a0", "--at", "ov"],
     "an ov write needs a head: the model has 4 heads (--head H)."),
    ("mlp", ["--fact", "3", "--to", "R1:a0"], "--fact: SUBJECT:RELATION pairs like 3:1,7:0 expected, got '3'."),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--head", "x"], "argument --head: a head is an integer >= 0, got 'x'"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--layer", "-1"],
     "argument --layer: a layer is an integer >= 0, got -1"),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--contexts", "0"], "--contexts must be >= 1, got 0."),
    ("mlp", ["--fact", "3:1", "--to", "R1:a0", "--at", "auto", "--position", "subject"],
     "--at auto writes where each fact lives: give --layer and --position with --at mlp or ov."),
])
def test_each_refusal_is_its_whole_line(checkpoints, kind, args, said, capsys):
    code, _, err = run_main(main, [checkpoints[kind], *args, *QUIET], capsys)
    assert code == 2 and err.strip() == f"error: {said}", err


def test_the_checkpoint_read_or_a_folder_inside_it_is_refused_as_save(checkpoints, capsys):
    ckpt = checkpoints["mlp"]
    for save in (ckpt, ckpt / "edited"):
        code, _, err = run_main(main, [ckpt, "--fact", "3:1", "--to", "R1:a0", "--save", save, *QUIET], capsys)
        assert err.strip() == (f"error: --save {save} is the checkpoint read (or inside it): the edited model goes "
                               "to a folder of its own.")


def test_a_folder_of_a_user_s_files_is_not_written_into(checkpoints, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep\n")
    code, _, err = run_main(main, [checkpoints["mlp"], "--fact", "3:1", "--to", "R1:a0", "--out", tmp_path, *QUIET],
                            capsys)
    assert code == 2 and err.strip() == (f"error: {tmp_path} holds files that are not edit_facts results (notes.txt), "
                                         "which edit_facts does not write over; move them, or choose another --out.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("value, column", [("closed", None), ("optimise", "optimised")])
def test_edits_csv_says_each_edit_s_value_unless_the_run_is_the_closed_form_s(checkpoints, tmp_path, capsys, value,
                                                                              column):
    code, _, err = run_main(main, [checkpoints["attention"], "--fact", "3:1", "--to", "R1:a0", "--at", "ov",
                                   "--head", "0", "--value", value, "--contexts", "2", "--out", tmp_path, *QUIET],
                            capsys)
    assert code == 0, err
    edits = pd.read_csv(tmp_path / "edits.csv")
    assert (edits["value"].tolist() if "value" in edits else None) == (None if column is None else [column])
