"""Attention-only memorisation (Dana et al.): checkpoints, head roles and kind refusal, the
aot_capacity tables and CLI."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from models import CheckpointError, load
from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.aot.trainer import train_aot
from probe.head_roles import head_roles
from probe.kl_floor import rank_d_kl_floor
from tasks.association import AssociationTask, DistributionTask
from tests.conftest import run_main

CPU = {"device": "cpu"}


# --------------------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def association_ckpt(tmp_path_factory):
    task = AssociationTask(n_tokens=8, context=2)
    cfg = AoTTrainConfig(lr=1e-2, batch_size=128, batches=50, epochs=4, eval_every=50, **CPU)
    trained = train_aot(task, [(AoTModelConfig(8, 4, 4), 0)], cfg, progress=False)[0]
    return trained.save(tmp_path_factory.mktemp("aot") / "assoc"), trained, task


def test_checkpoint_round_trip_and_head_roles(association_ckpt):
    ckpt, trained, task = association_ckpt
    config = json.loads((ckpt / "config.json").read_text())
    assert config["task"]["kind"] == "association" and config["model"]["n_ctx"] == 2
    assert config["training"]["trainer"] == "models.aot.trainer" and config["training"]["seed"] == 0
    assert config["training"]["batch_accuracy"] == trained.training["batch_accuracy"]
    model, loaded = load(ckpt, device="cpu")
    with torch.no_grad():
        accuracy = task.scores(model(loaded.sequences())[:, -1])["accuracy"].item()
    assert accuracy == pytest.approx(trained.accuracy) and accuracy > 0.5  # it memorised most of the 64
    roles = head_roles(model, loaded)
    assert len(roles) == 4 and set(roles.role) <= {"position", "token"}
    assert np.allclose(roles.mass_pos0 + roles.mass_pos1, 1, atol=1e-5)
    assert ((roles.var_key_token + roles.var_query_token + roles.var_interaction) <= 1 + 1e-5).all()
    assert np.allclose(roles.clean_accuracy, accuracy)


def test_head_roles_ablations_rerun_one_position_with_the_full_sequence_accuracy(association_ckpt):
    """head_roles mean-ablates each head on the last position alone (rerun_last_position);
    its accuracies are those of the full sequences run with the same hook."""
    from probe.hooks import HOOK_Z, clean_run, hooked_last_logits, set_last

    model, task = load(association_ckpt[0], device="cpu")
    roles = head_roles(model, task)
    tokens = task.sequences()
    z_mean = clean_run(model, tokens).z.mean(0)  # [H, d_head]
    full = [task.scores(hooked_last_logits(model, tokens, [(HOOK_Z, set_last(z_mean[h], h))]))["accuracy"].item()
            for h in range(model.cfg.n_heads)]
    assert roles.mean_ablation_accuracy.tolist() == full
    assert (roles.accuracy_drop > 0).any()  # the ablations do change the answers


def test_factual_recall_readers_refuse_other_kinds(association_ckpt, tmp_path, capsys):
    from analyses.locate_facts import main

    ckpt = association_ckpt[0]
    with pytest.raises(CheckpointError) as err:
        load(ckpt, device="cpu", kind="factual_recall")
    assert "task kind 'association' is not a factual-recall task" in str(err.value) and "\n" not in str(err.value)
    code, _, stderr = run_main(main, [ckpt, "--quiet", "--out", tmp_path / "o"], capsys)
    assert code == 2 and "task kind 'association'" in stderr
    assert len(stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_distribution_checkpoint_kind(tmp_path):
    task = DistributionTask(n_tokens=5, context=2, concentration=2.0)
    cfg = AoTTrainConfig(lr=1e-2, batch_size=64, batches=10, epochs=2, eval_every=10, **CPU)
    trained = train_aot(task, [(AoTModelConfig(2, 2, 2), 0)], cfg, progress=False)[0]
    ckpt = trained.save(tmp_path / "dist")
    _, loaded = load(ckpt, device="cpu")
    assert isinstance(loaded, DistributionTask) and loaded.log_targets.equal(task.log_targets)
    assert trained.loss >= rank_d_kl_floor(task.log_targets, 2) - 1e-6  # no rank-2 model beats the floor
    with pytest.raises(CheckpointError, match="task kind 'distribution' is not a factual-recall task"):
        load(ckpt, device="cpu", kind="factual_recall")


# --------------------------------------------------------------------------- CLI
def test_tables_fit_each_seed_alone_beside_the_mean():
    """With two seeds the summary carries each seed's own fits: here seed 0 gains 0.02 per head
    and 0.05 per unit of d below d_h, seed 1 0.04 and 0.03, and the mean's fits sit between."""
    from dataclasses import replace

    from analyses.aot_capacity import AotSweep, Trained, tables
    sweep = AotSweep(d_model=4, d_head=4, fixed_heads=2, heads=(1, 2, 3, 4), d_heads=(4,), d_models=(2, 3, 4),
                     seeds=(0, 1), skip_mlp=True)
    per_head, per_dim = {0: 0.02, 1: 0.04}, {0: 0.05, 1: 0.03}
    results = {}
    for models in sweep.sweep_models().values():
        for m in models:
            for seed in sweep.seeds:
                accuracy = 0.1 + per_head[seed] * m.n_heads + per_dim[seed] * m.d_model
                results[(m, seed)] = {"accuracy": accuracy, "loss": 1.0, "checkpoint": "-"}
    fits = tables(Trained(results, None), sweep).summary["layouts"]["standard"]
    assert fits["by_seed"]["0"]["slope_H"] == pytest.approx(0.02)
    assert fits["by_seed"]["1"]["slope_H"] == pytest.approx(0.04)
    assert fits["fit_H"]["slope"] == pytest.approx(0.03)
    assert fits["by_seed"]["0"]["slope_d_below_dh"] == pytest.approx(0.05)
    assert fits["by_seed"]["1"]["slope_d_below_dh"] == pytest.approx(0.03)
    assert "fit_dh_exponent" not in fits["by_seed"]["0"]  # one d_h value: no d_h fit, alone or pooled
    one_seed = tables(Trained({k: v for k, v in results.items() if k[1] == 0}, None),
                      replace(sweep, seeds=(0,))).summary["layouts"]["standard"]
    assert "by_seed" not in one_seed and one_seed["fit_H"]["slope"] == pytest.approx(0.02)


@pytest.mark.slow
def test_aot_capacity_cli_tiny_run(tmp_path, capsys):
    out = tmp_path / "cap"
    args = [sys.executable, "-m", "analyses.aot_capacity", "--out", str(out), "--quiet", "--device", "cpu",
            "--n-tokens", "6", "--d-model", "3", "--d-head", "2", "--fixed-heads", "2", "--heads", "1,2,3",
            "--d-heads", "1,2,3", "--d-models", "2,3", "--seeds", "0", "--batch-size", "64", "--batches", "10",
            "--epochs", "2", "--eval-every", "10", "--lr", "1e-2", "--distribution-heads", "1,2",
            "--head-layout", "standard,dana"]
    proc = subprocess.run(args, check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in ("runs.csv", "capacity.csv", "heads.csv", "summary.json", "capacity.png", "head_roles.png",
                 "distribution.csv", "settings.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    for layout in ("standard", "dana"):  # three d_h values fit a + b d_h^k exactly: no exponent to report
        fits = summary["layouts"][layout]
        assert {"fit_H_r2", "above_lower_bound_everywhere"} <= set(fits) and "fit_dh_exponent" not in fits
        assert fits["fit_dh"] == {"undetermined": True, "points": 3, "parameters": 3}
        assert fits["fit_H"]["points"] == 3 and fits["fit_H"]["ci95"]["slope"][0] < fits["fit_H"]["slope"]
    assert proc.stdout.count("fit       accuracy = a + b d_h^k: k = undetermined (3 points, 3 parameters)\n") == 2
    assert summary["cells_computed"] == len(list((out / "cells").iterdir())) > 0
    capacity = __import__("pandas").read_csv(out / "capacity.csv")
    assert set(capacity.sweep) == {"heads", "d_head", "d_model", "mlp"}
    assert set(capacity.head_layout) == {"standard", "dana"}
    dana = capacity[capacity.head_layout == "dana"]  # the authors' parameter count, and its own checkpoints
    assert (dana.parameters == [AoTModelConfig(r.d_model, r.n_heads, r.d_head, r.d_mlp, head_layout="dana").parameters(
        AssociationTask(6, 2)) for r in dana.itertuples()]).all()
    runs = __import__("pandas").read_csv(out / "runs.csv")
    ckpt = runs[runs.head_layout == "dana"].checkpoint.iloc[0]
    assert json.loads((out / ckpt / "config.json").read_text())["model"]["head_layout"] == "dana"
    assert set(json.loads((out / "summary.json").read_text())["distribution"]["kl_by_model"]) == {
        "standard H=1", "standard H=2", "dana H=1", "dana H=2"}
    bound = 1 / 6 + (1 - 1 / 6) * (capacity.n_heads * capacity.d_head + capacity.d_model) / 36
    assert np.allclose(capacity.lower_bound, bound.clip(upper=1))
    # a rerun finds every stack of models recorded (cells/) and trains nothing (the command's main in
    # this process from here on: the run above went through its entry point)
    from analyses.aot_capacity.cli import main

    before = (out / "runs.csv").read_text()
    assert run_main(main, args[3:], capsys)[0] == 0 and (out / "runs.csv").read_text() == before
    assert json.loads((out / "summary.json").read_text())["cells_computed"] == 0
    # another task or training into the same --out is refused, naming what differs, nothing written
    files = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
    other = [a for a in args[3:-1]] + ["standard"]
    other[other.index("--n-tokens") + 1], other[other.index("--epochs") + 1] = "7", "3"
    code, _, err = run_main(main, other, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "n_tokens: recorded 6, now 7" in err and "train.epochs: recorded 2, now 3" in err
    assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == files
    code, _, err = run_main(main, ["--out", tmp_path / "x", "--lr", "0"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "lr must be > 0" in err
    code, _, err = run_main(main, ["--out", tmp_path / "x", "--head-layout", "dana,paper"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "head_layout must be one of" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flags, message", [
    (["--n-tokens", "1"], "n_tokens must be an integer >= 2"),
    (["--n-tokens", "50", "--context", "6"], "sequences is more than"),
])
def test_aot_capacity_refuses_a_bad_task_before_creating_out(tmp_path, flags, message):
    from analyses.aot_capacity.cli import main

    with pytest.raises(ValueError, match=message):
        main(["--out", str(tmp_path / "x"), "--quiet", *flags])
    assert not (tmp_path / "x").exists()
