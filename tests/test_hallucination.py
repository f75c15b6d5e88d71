"""The hallucination phase: metrics, phase detection, the linear-attention model and the CLI."""
import json
import math
import shutil
from dataclasses import replace

import pandas as pd
import pytest
import torch

from analyses import hallucination
from models.bridge import build_bridge, load
from models.checkpoint import CheckpointError, write_checkpoint
from models.cli import run_cli
from models.recall.presets import preset
from models.recall.trainer import train
from models.recall.weights import init_weights, trainable_keys
from probe.hallucination import conditional_entropy, recall_metrics, relation_prior
from probe.phases import PhaseRule, hallucination_phase
from tasks.factual_recall import FactualRecallTask
from tests.conftest import quick

# S = 2, R = 2, D = 2: relation 0 owns answers {0, 1}, relation 1 owns {2, 3}.
TABLE = [[0, 2], [1, 3]]


def test_recall_metrics_by_hand():
    task = FactualRecallTask(2, 2, 2, 3, 4, facts=TABLE)
    batch = task.fact_prompts(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.Generator().manual_seed(0))
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1],  # fact (0, 0) -> 0: favours 1, valid for r=0 but not s=0's
                      [0.25, 0.25, 0.1, 0.4]])  # fact (1, 1) -> 3: right
    got = recall_metrics(p.log() + 5.0, batch, task)  # logits up to a constant
    # p(a | r) is uniform over each relation's two answers (one subject each)
    expected = {
        "loss": -(math.log(0.1) + math.log(0.4)) / 2,
        "accuracy": 0.5,
        "relation_only_loss": -(math.log(0.7) + math.log(0.5)) / 2,
        "subject_only_loss": -(math.log(0.1 + 0.2) + math.log(0.25 + 0.4)) / 2,  # A_0 = {0, 2}, A_1 = {1, 3}
        "hallucination_rate": ((0.7 - 0.1) + (0.5 - 0.4)) / 2,  # p(A_r) - p(a*)
        "kl_relation_prior": (0.5 * math.log(0.5 / 0.1) + 0.5 * math.log(0.5 / 0.6)
                              + 0.5 * math.log(0.5 / 0.1) + 0.5 * math.log(0.5 / 0.4)) / 2,
    }
    assert got == pytest.approx(expected, abs=1e-6)



def test_recall_metrics_with_zero_probabilities():
    """Answers of probability 0 (logits -inf) outside the relation's block: the KL sums
    over the prior's support only and stays finite; both prompts are answered right."""
    task = FactualRecallTask(2, 2, 2, 3, 4, facts=TABLE)
    batch = task.fact_prompts(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.Generator().manual_seed(0))
    p = torch.tensor([[0.6, 0.4, 0.0, 0.0],  # fact (0, 0) -> 0
                      [0.0, 0.0, 0.3, 0.7]])  # fact (1, 1) -> 3
    got = recall_metrics(p.log(), batch, task)
    expected = {
        "loss": -(math.log(0.6) + math.log(0.7)) / 2,
        "accuracy": 1.0,
        "relation_only_loss": 0.0,
        "subject_only_loss": -(math.log(0.6) + math.log(0.7)) / 2,  # A_0 = {0, 2}, A_1 = {1, 3}
        "hallucination_rate": ((1 - 0.6) + (1 - 0.7)) / 2,
        "kl_relation_prior": (0.5 * math.log(0.5 / 0.6) + 0.5 * math.log(0.5 / 0.4)
                              + 0.5 * math.log(0.5 / 0.3) + 0.5 * math.log(0.5 / 0.7)) / 2,
    }
    assert got == pytest.approx(expected, abs=1e-6)

def test_relation_prior_and_conditional_entropy():
    uniform = FactualRecallTask(16, 4, 8, 20, 32, facts="structured")
    assert conditional_entropy(uniform) == pytest.approx(math.log(8))
    # relation 0: both subjects answer 0 (entropy 0); relation 1: one each (log 2)
    skewed = FactualRecallTask(2, 2, 2, 3, 4, facts=[[0, 2], [0, 3]])
    assert relation_prior(skewed).tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]]
    assert conditional_entropy(skewed) == pytest.approx(math.log(2) / 2)


def _curves(kind: str):
    """Synthetic curves on log-spaced steps (4 per octave up to 4096) with a known phase."""
    steps = sorted({round(2 ** (i / 4)) for i in range(49)} | {0})
    level = math.log(8)
    rows = []
    for s in steps:
        if kind == "plateau":  # uniform until 64, the relation-only predictor 128..1024, then learned
            stage = 0 if s < 128 else 1 if s <= 1024 else 2
        elif kind == "no-plateau":  # straight from uniform to learned
            stage = 0 if s < 512 else 2
        elif kind == "blip":  # touches the level for two snapshots only
            stage = 0 if s < 512 else 1 if s <= 600 else 2
        else:  # "to-the-end": enters at 256 and never leaves
            stage = 0 if s < 256 else 1
        rows.append([(math.log(32), 1.4, 2.1), (level * 1.02, 0.01, 2.0), (0.01, 0.001, 0.009)][stage])
    loss, relation_only, subject_only = zip(*rows)
    return steps, list(loss), list(relation_only), list(subject_only), level


def test_phase_found_with_its_boundaries():
    phase = hallucination_phase(*_curves("plateau"))
    assert (phase.start_step, phase.end_step) == (128, 1024)
    assert phase.exit_step == 1218  # the next snapshot, round(2 ** 10.25)
    assert phase.plateau_loss == pytest.approx(math.log(8) * 1.02)
    assert phase.length_steps == 896 and phase.length_octaves == pytest.approx(math.log2(1025 / 129), abs=1e-3)


@pytest.mark.parametrize("kind", ["no-plateau", "blip"])
def test_no_phase_is_invented(kind):
    assert hallucination_phase(*_curves(kind)) is None


def test_phase_until_the_end_and_rule_thresholds():
    phase = hallucination_phase(*_curves("to-the-end"))
    assert phase.start_step == 256 and phase.end_step == 4096 and phase.exit_step is None
    # the same curves with a relation-only threshold below the plateau's 0.01: no phase
    assert hallucination_phase(*_curves("plateau"), rule=PhaseRule(relation_only_max=0.005)) is None
    with pytest.raises(ValueError, match="same length"):
        hallucination_phase([0, 1], [1.0], [1.0], [1.0], 1.0)


def test_fig5_linear_preset_is_the_papers_model():
    run = preset("fig5-linear")
    task = run.task.build()
    w = init_weights(run.model, task, 0)
    d = task.d_vocab + task.d_vocab_out
    assert w["embed.W_E"].shape == (task.d_vocab, d) and w["blocks.0.attn.W_K"].shape == (1, d, d)
    assert torch.equal(w["embed.W_E"] @ w["unembed.W_U"], torch.zeros(task.d_vocab, task.d_vocab_out))
    assert torch.equal(w["blocks.0.attn.W_V"][0], torch.eye(d))
    assert (w["blocks.0.attn.W_O"] == 1e-5).all()
    assert sorted(trainable_keys(w, run.model)) == ["blocks.0.attn.W_K", "blocks.0.attn.W_O"]


def test_fig5_softmax_gd_preset_is_the_official_right_panel():
    """Random unit-norm token embeddings, one softmax head whose output matrix [d, |A|]
    writes straight to the answer logits, merged weights at 1e-5, plain GD at lr 0.1."""
    run = preset("fig5-softmax-gd")
    assert (run.train.optimizer, run.train.lr, run.train.steps, run.train.batch_size) == ("sgd", (0.1,), 8192, 1024)
    task = run.task.build()
    assert (task.n_subjects, task.n_relations, task.answers_per_relation, task.seq_len) == (16, 4, 8, 32)
    w = init_weights(run.model, task, 0)
    d, O = 128, task.d_vocab_out
    assert w["embed.W_E"].shape == (task.d_vocab, d + O) and (w["embed.W_E"][:, d:] == 0).all()
    assert torch.allclose(w["embed.W_E"].norm(dim=-1), torch.ones(task.d_vocab))
    assert (w["embed.W_E"][:, :d] @ w["embed.W_E"][:, :d].T).fill_diagonal_(0).abs().max() < 0.5  # random, not one-hot
    assert (w["blocks.0.attn.W_K"] == 1e-5).all() and (w["blocks.0.attn.W_O"] == 1e-5).all()
    assert sorted(trainable_keys(w, run.model)) == ["blocks.0.attn.W_K", "blocks.0.attn.W_O"]
    # through the TransformerBridge: the logits are the head's output times W_O's answer columns
    w["blocks.0.attn.W_O"] = torch.randn(w["blocks.0.attn.W_O"].shape)
    w["blocks.0.attn.W_K"] = torch.randn(w["blocks.0.attn.W_K"].shape)
    model = build_bridge(run.model.checkpoint_section(task), w)
    tokens = task.sample(8, torch.Generator().manual_seed(0)).tokens
    logits, cache = model.run_with_cache(tokens)
    z = cache["blocks.0.attn.hook_z"][:, -1, 0]  # [batch, d_head]
    pattern = cache["blocks.0.attn.hook_pattern"][:, 0, -1]  # [batch, pos]
    assert torch.allclose(pattern.sum(-1), torch.ones(8))  # softmax
    assert torch.allclose(logits[:, -1], z @ w["blocks.0.attn.W_O"][0][:, d:], atol=1e-4)


def test_fig5_softmax_presets_are_renamed():
    assert preset("fig5-softmax-adam").train.optimizer == "adam"
    with pytest.raises(ValueError, match="unknown preset 'fig5-softmax'"):
        preset("fig5-softmax")


def test_direct_readout_needs_room_for_the_answers():
    run = preset("fig5-softmax-gd")
    task = run.task.build()
    with pytest.raises(ValueError, match="d_model must exceed"):
        replace(run.model, d_model=task.d_vocab_out).checkpoint_section(task)


def test_linear_bridge_pattern_is_the_scaled_scores():
    run = preset("fig5-linear")
    task = run.task.build()
    w = {k: v + 0.01 * torch.randn(v.shape) for k, v in init_weights(run.model, task, 0).items()}
    model = build_bridge(run.model.checkpoint_section(task), w)
    tokens = task.sample(3, torch.Generator().manual_seed(0)).tokens
    _, cache = model.run_with_cache(tokens)
    pattern = cache["blocks.0.attn.hook_pattern"]  # [batch, head, q, k]
    d_head = w["blocks.0.attn.W_Q"].shape[-1]
    q, k = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_k"]
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(d_head)
    assert torch.allclose(pattern[:, :, -1], scores[:, :, -1], atol=1e-6)
    assert (pattern.triu(1) == 0).all()
    assert not torch.allclose(pattern[:, :, -1].sum(-1), torch.ones(3, 1))  # no softmax


@pytest.fixture(scope="module")
def fig5_fast(tmp_path_factory):
    """fig5-linear with a large step size: the three stages within a few hundred steps."""
    run = quick(preset("fig5-linear"), lr=(1.0,), steps=768, batch_size=256, eval_size=256, eval_every=128,
                snapshots_per_octave=4)
    return train(run, progress=False).save(tmp_path_factory.mktemp("fig5") / "linear")


def test_cli_finds_the_phase_on_a_real_run(fig5_fast, tmp_path, capsys):
    out = tmp_path / "out"
    assert hallucination.main([str(fig5_fast), "--out", str(out), "--device", "cpu", "--quiet",
                               "--eval-size", "512", "--storage-points", "3"]) == 0
    metrics = pd.read_csv(out / "metrics.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(metrics) == len(list((fig5_fast / "snapshots").iterdir()))
    assert summary["log_D"] == pytest.approx(math.log(8))
    phase = summary["phase"]
    assert phase is not None and 0 < phase["start_step"] < phase["end_step"] < 768
    inside = metrics[(metrics.step >= phase["start_step"]) & (metrics.step <= phase["end_step"])]
    assert (inside.relation_only_loss <= 0.05).all() and (inside.subject_only_loss >= 0.5).all()
    assert (abs(inside.loss - math.log(8)) <= 0.1 * math.log(8)).all()
    assert metrics.loss.iloc[-1] < 0.05 and metrics.attention_recall_share.notna().sum() == 3
    assert metrics.mlp_recall_share.isna().all()  # attention-only model
    for figure in ("hallucination.png", "storage.png"):
        assert (out / figure).stat().st_size > 10_000
    said = capsys.readouterr().out
    assert "hallucination phase: steps" in said
    assert "by the MLP path alone: none (the model has no MLP)" in said and "never" not in said


def test_cli_on_a_model_with_an_mlp(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    assert hallucination.main([str(tiny_ckpt), "--out", str(out), "--device", "cpu", "--quiet",
                               "--eval-size", "256", "--storage-points", "2"]) == 0
    metrics = pd.read_csv(out / "metrics.csv")
    shares = metrics.dropna(subset=["mlp_recall_share"])
    assert len(shares) == 2 and shares.mlp_recall_share.iloc[-1] >= 0.9  # tiny stores its facts in the MLP
    final = json.loads((out / "summary.json").read_text())["final"]
    assert type(final["step"]) is int and final["step"] == metrics.step.iloc[-1]  # a step, not 100.0


def test_cli_records_the_snapshots_it_read_and_keeps_other_settings_apart(tiny_ckpt, tmp_path, capsys):
    from models.checkpoint import snapshots_sha256

    ckpt = shutil.copytree(tiny_ckpt, tmp_path / "ckpt", ignore=shutil.ignore_patterns("analysis"))
    flags = ["--device", "cpu", "--quiet", "--eval-size", "256", "--storage-points", "0"]
    assert hallucination.main([str(ckpt), *flags]) == 0
    own = ckpt / "analysis" / "hallucination" / "eval-size-256_storage-points-0"  # never the defaults' folder
    assert json.loads((own / "summary.json").read_text())["snapshots_sha256"] == snapshots_sha256(ckpt)
    assert sorted(p.name for p in own.parent.iterdir()) == [own.name]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: hallucination.main([str(ckpt), *flags[:5], "--out", str(own)]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"error: {own} holds other hallucination results "
                                                    "(settings.storage_points: recorded 0, now 12)"), err


@pytest.mark.slow
def test_cli_refuses_a_checkpoint_without_snapshots(tiny_result, tmp_path):
    ckpt = tmp_path / "no-snapshots"
    write_checkpoint(ckpt, tiny_result.section, tiny_result.task, tiny_result.training, tiny_result.weights, [], {})
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "analyses.hallucination", str(ckpt)], capture_output=True, text=True)
    assert done.returncode == 2 and "no snapshots/" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (ckpt / "analysis").exists()


@pytest.mark.parametrize("case, message", [
    ("no config.json", "config.json: missing"),
    ("attention-only task", "task kind 'association' is not a factual-recall task"),
    ("construction", "a construction (theorem3), built rather than trained"),
])
def test_cli_names_what_the_checkpoint_is(tiny_ckpt, tmp_path, case, message, capsys):
    """A folder the other tools refuse is refused with their words, not for its missing snapshots."""
    from models.recall.constructions import main as construct

    ckpt = tmp_path / "ckpt"
    if case == "construction":
        assert construct(["--kind", "attention", "--out", str(ckpt)]) == 0
    else:
        shutil.copytree(tiny_ckpt, ckpt, ignore=shutil.ignore_patterns("snapshots"))
        config = json.loads((ckpt / "config.json").read_text())
        if case == "no config.json":
            (ckpt / "config.json").unlink()
        else:
            (ckpt / "config.json").write_text(json.dumps({**config, "task": {**config["task"], "kind": "association"}}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: hallucination.main([str(ckpt), "--device", "cpu", "--quiet"]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "no snapshots/" not in err, err
    assert len(err.strip().splitlines()) == 1 and not (ckpt / "analysis").exists()


def test_load_reads_linear_checkpoints(fig5_fast):
    model, task = load(fig5_fast, "cpu")
    assert task.answers_per_relation == 8 and model.cfg.d_head == task.d_vocab + task.d_vocab_out


def test_a_damaged_snapshot_is_refused_before_any_is_measured(tiny_ckpt, tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    last = sorted((ckpt / "snapshots").iterdir())[-1]
    last.write_bytes(b"not a safetensors file")
    measured = []
    monkeypatch.setattr(hallucination, "recall_metrics", lambda *a: measured.append(a) or {})
    with pytest.raises(CheckpointError, match=f"{last}: not a valid safetensors file"):
        hallucination.main([str(ckpt), "--device", "cpu", "--quiet", "--eval-size", "64"])
    assert measured == [] and not (ckpt / "analysis").exists()
