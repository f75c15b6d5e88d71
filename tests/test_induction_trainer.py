"""The induction trainer: SGD with momentum and weight decay and AdamW equal torch.optim's, each
model of a stack trains as it would alone, frozen weights stay, a run resumes bit-identically, the
CPU preset learns the induction head, and the CLI refuses bad input in one line."""
import json
import math
import re
import subprocess
import sys
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch

from models.cli import run_cli
from models.induction import train as train_cli
from models.induction.config import InductionModelConfig, InductionTaskConfig, InductionTrainConfig
from models.induction.forward import sequence_logits
from models.induction.trainer import EVAL_SEED, Training, scores, train
from models.induction.weights import init_weights, trainable_keys
from models.training.optimizer import Optimizer
from models.training.progress import ENV
from models.training.result import DATA_SEED_OFFSET
from models.training.train_state import complete_steps
from tests.conftest import run_main

TASK = InductionTaskConfig(n_triggers=2, seq_len=16)
MODEL = InductionModelConfig(d_model=16)
TRAIN = InductionTrainConfig(lr=(0.1,), batch_size=8, steps=6, eval_every=3, eval_size=8, device="cpu")


@pytest.mark.parametrize("kind, reference", [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("adam", lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.01)),
])
def test_the_optimizer_is_torchs(kind, reference):
    torch.manual_seed(0)
    start = torch.randn(3, 4)
    ours = start.clone().requires_grad_()
    theirs = start.clone().requires_grad_()
    opt = Optimizer({"w": ours}, torch.tensor([0.1]), kind, 0.9 if kind == "sgd" else 0.0, 0.01)
    ref = reference([theirs])
    for step in range(5):
        target = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
        for w in (ours, theirs):
            ((w - target) ** 2 * (1 + w)).sum().backward()
        opt.step()
        ref.step()
        ref.zero_grad()
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_a_weight_joining_sgd_later_moves_as_in_torchs():
    """Optimizer.add: a weight that joins at step 2 with zero momentum, as torch.optim.SGD treats a
    parameter that had no gradient before."""
    torch.manual_seed(0)
    start = {"a": torch.randn(3, 4), "b": torch.randn(3, 4)}
    ours = {k: v.clone().requires_grad_(k == "a") for k, v in start.items()}
    theirs = {k: v.clone().requires_grad_(k == "a") for k, v in start.items()}
    opt = Optimizer({"a": ours["a"]}, torch.tensor([0.1]), "sgd", 0.9, 0.01)
    ref = torch.optim.SGD(list(theirs.values()), lr=0.1, momentum=0.9, weight_decay=0.01)
    for step in range(5):
        if step == 2:
            opt.add({"b": ours["b"].requires_grad_()})
            theirs["b"].requires_grad_()
        target = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
        for w in (ours, theirs):
            (((w["a"] * w["b"]) - target) ** 2).sum().backward()
        opt.step()
        ref.step()
        ref.zero_grad()
    for k in start:
        assert torch.allclose(ours[k], theirs[k], atol=1e-6), k
    assert not torch.equal(ours["b"], start["b"])
    with pytest.raises(ValueError, match="only SGD"):
        Optimizer({"a": ours["a"]}, torch.tensor([0.1]), "adam").add({"b": ours["b"]})


def test_frozen_until_keeps_weights_at_their_start_then_trains_them(tmp_path):
    """The authors' freeze_until: W_O^2 at its initial value for the first 4 steps, trained after; a run
    resumes bit-identically from a state saved before the join and from one saved after it."""
    cfg = replace(TRAIN, steps=8, eval_every=2, snapshot_every=2, frozen=("blocks.1.attn.W_O",), frozen_until=4)
    whole = train(TASK, MODEL, cfg, progress=False)[0]
    key = "blocks.1.attn.W_O"
    assert all(torch.equal(whole.snapshots[s][key], whole.snapshots[0][key]) for s in (2, 4))
    assert not torch.equal(whole.snapshots[6][key], whole.snapshots[4][key])
    stepwise = train(TASK, MODEL, replace(cfg, steps=5, snapshot_every=1), progress=False)[0]
    assert torch.equal(stepwise.snapshots[4][key], whole.snapshots[0][key])  # joins at step 4: moves by step 5
    assert not torch.equal(stepwise.snapshots[5][key], stepwise.snapshots[4][key])
    assert not torch.equal(whole.snapshots[2]["blocks.1.attn.W_K"], whole.snapshots[0]["blocks.1.attn.W_K"])
    for killed in (4, 6):  # the state at 4 is saved before the join, at 6 after it
        folder = tmp_path / str(killed)
        train(TASK, MODEL, replace(cfg, steps=killed), progress=False, state_folder=folder)
        resumed = train(TASK, MODEL, cfg, progress=False, state_folder=folder)[0]
        for k, value in whole.weights.items():
            assert torch.equal(resumed.weights[k], value), (killed, k)
        assert all(torch.equal(resumed.snapshots[s][key], whole.snapshots[s][key]) for s in (0, 2, 4, 6, 8))


@pytest.mark.parametrize("changes, message", [
    ({"frozen_until": 3}, "frozen_until needs frozen weights and SGD"),
    ({"frozen_until": 3, "frozen": ("blocks.1.attn.W_O",), "optimizer": "adam"}, "frozen_until needs frozen"),
    ({"frozen_until": -1}, "frozen_until must be >= 0"),
])
def test_frozen_until_is_refused_where_it_cannot_work(changes, message):
    with pytest.raises(ValueError, match=message):
        replace(TRAIN, **changes).validate()


def test_each_model_of_a_stack_trains_as_it_would_alone():
    together = train(TASK, MODEL, replace(TRAIN, lr=(0.1, 0.05), seed=(0, 1)), progress=False)
    alone = train(TASK, MODEL, replace(TRAIN, lr=(0.05,), seed=(1,)), progress=False)[0]
    assert [r.training["lr"] for r in together] == [0.1, 0.1, 0.05, 0.05]
    for key, value in alone.weights.items():
        assert torch.allclose(together[3].weights[key], value, atol=1e-6), key


def test_frozen_weights_stay_and_trained_ones_move():
    result = train(TASK, MODEL, replace(TRAIN, frozen=("blocks.0.attn.W_K",), snapshot_every=3), progress=False)[0]
    first, last = result.snapshots[0], result.weights
    assert sorted(result.snapshots) == [0, 3, 6]
    for key in ("blocks.0.attn.W_K", "blocks.0.attn.W_V", "blocks.0.attn.W_O", "embed.W_E", "unembed.W_U"):
        assert torch.equal(first[key], last[key]), key
    for key in ("blocks.1.attn.W_K", "blocks.1.attn.W_O"):
        assert not torch.equal(first[key], last[key]), key


def test_a_run_resumes_bit_identically(tmp_path):
    cfg = replace(TRAIN, steps=6, eval_every=2, snapshot_every=2)
    whole = train(TASK, MODEL, cfg, progress=False)[0]
    train(TASK, MODEL, replace(cfg, steps=4), progress=False, state_folder=tmp_path)  # killed after step 4
    resumed = train(TASK, MODEL, cfg, progress=False, state_folder=tmp_path)[0]
    for key, value in whole.weights.items():
        assert torch.equal(resumed.weights[key], value), key
    assert sorted(resumed.snapshots) == [0, 2, 4, 6]
    assert [r["step"] for r in resumed.metrics] == [0, 2, 4, 6]


def test_the_cpu_preset_learns_the_induction_head_with_two_layers():
    """A shortened `cpu` preset: in-context accuracy far above chance (1/65) within 150 steps (0.62 at seed 0)."""
    from models.induction.config import preset

    task, model, cfg = preset("cpu")
    result = train(task, model, replace(cfg, steps=150, eval_every=150, device="cpu"), progress=False)[0]
    assert result.training["final_in_context_accuracy"] > 0.4


@pytest.mark.parametrize("flags, message", [
    (["--n-triggers", "70"], "n_triggers must be an integer in 1..65"),
    (["--seq-len", "1"], "seq_len T must be an integer >= 2"),
    (["--text", "moby"], "unknown text 'moby'"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--architecture", "generic", "--n-layers", "3"], "n_layers must be 1 or 2"),
    (["--lr", "0"], "every lr must be > 0"),
])
def test_the_cli_refuses_bad_input_in_one_line(flags, message, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: train_cli.main(["--out", str(out), *flags]))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err
    assert err.count("\n") == 1 and not out.exists()


@pytest.mark.slow
def test_the_cli_refuses_in_one_line_as_a_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "models.induction.train", "--out", str(tmp_path / "o"),
                           "--seq-len", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == "error: seq_len T must be an integer >= 2, got 1.\n"


def test_the_cli_trains_writes_and_resumes(tmp_path, capsys, monkeypatch):
    every_update(monkeypatch)
    out = tmp_path / "run"
    flags = ["--n-triggers", "2", "--seq-len", "8", "--d-model", "8", "--batch-size", "4", "--steps", "4",
             "--eval-every", "2", "--eval-size", "4", "--device", "cpu", "--quiet", "--out", str(out)]
    assert train_cli.main(flags) == 0
    assert (out / "config.json").is_file() and not (out / "train_state").exists()  # finished: no state kept
    shown = capsys.readouterr()
    assert shown.out.startswith("task      InductionTask(shakespeare, N=65, K=2 fixed triggers, T=8")
    assert "in-context accuracy" in shown.out and shown.err == ""  # --quiet: no progress
    written = (out / "model.safetensors").read_bytes()
    assert train_cli.main(["--resume", str(out), "--quiet"]) == 0  # already finished: kept as it is
    assert capsys.readouterr().out == f"{out} holds the finished run's checkpoints; nothing to resume.\n"
    assert (out / "model.safetensors").read_bytes() == written
    with pytest.raises(ValueError, match="no run.json there"):
        train_cli.main(["--resume", str(tmp_path)])
    assert train_cli.main([*flags, "--force"]) == 0  # the checkpoint written over, as asked


def test_an_interrupted_run_names_its_own_resume_command(tmp_path):
    from models import load
    from models.checkpoint import CheckpointError

    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text('{"preset": "cpu", "task": {}, "model": {"architecture": "simplified"}}')
    with pytest.raises(CheckpointError, match="python -m models.induction.train --resume"):
        load(out)


@pytest.mark.parametrize("config, message", [
    (InductionModelConfig(d_model=0), "d_model must be an integer >= 1, got 0."),
    (InductionModelConfig(n_heads=True), "n_heads must be an integer >= 1, got True."),
    (InductionModelConfig(d_mlp=-1), "d_mlp must be an integer >= 0, got -1."),
    (InductionModelConfig(d_mlp=True), "d_mlp must be an integer >= 0, got True."),
    (InductionModelConfig(layer_norm=True), "the simplified model has two layers of one head and no layer norm "
                                            "(--architecture generic for other shapes)."),
    (replace(TRAIN, lr=()), "every lr must be > 0, got ()."),
    (replace(TRAIN, lr=(0.1, 0.0)), "every lr must be > 0, got (0.1, 0.0)."),
    (replace(TRAIN, seed=()), "give at least one seed."),
    (replace(TRAIN, eval_size=0), "eval_size must be >= 1, got 0."),
    (replace(TRAIN, snapshot_every=-1), "snapshot_every must be >= 0, got -1."),
    (replace(TRAIN, frozen_until=2), "frozen_until needs frozen weights and SGD (a weight joining Adam later would "
                                     "need its own step count)."),
    (replace(TRAIN, momentum=1.0), "momentum must be in [0, 1) and weight_decay >= 0, got 1.0, 0.0001."),
    (replace(TRAIN, weight_decay=-0.1), "momentum must be in [0, 1) and weight_decay >= 0, got 0.9, -0.1."),
])
def test_configs_are_refused_with_their_whole_message(config, message):
    import re

    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        config.section(TASK.build()) if isinstance(config, InductionModelConfig) else config.validate()


def test_the_edges_of_the_configs_are_accepted():
    for edge in (dict(batch_size=1, steps=1, eval_every=1, eval_size=1), dict(momentum=0.0, weight_decay=0.0)):
        replace(TRAIN, **edge).validate()
    assert InductionModelConfig("generic", 1, 16, 1, 32).section(TASK.build()).mlp_layers == "all"
    assert InductionModelConfig(d_mlp=32).section(TASK.build()).mlp_layers == "last"
    assert replace(TASK, held_out_outputs=True).build().held_out_outputs
    from models.induction.config import preset
    with pytest.raises(ValueError, match=r"^unknown preset 'huge'; the presets are cpu, paper\.$"):
        preset("huge")


def every_update(monkeypatch):
    """Progress as status lines (no tqdm: its lock does not survive mutmut's fork), one at every update."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    monkeypatch.setattr("models.training.progress.STATUS_SECONDS", 0.0)


def stacked_init(section, seeds):
    """The seeds' initial weights, stacked [K, ...]."""
    weights = [init_weights(section, s) for s in seeds]
    return {k: torch.stack([w[k] for w in weights]) for k in weights[0]}


@pytest.mark.parametrize("loss", ["in_context", "all"])
def test_two_steps_are_the_loss_written_out_and_torchs_sgd(loss):
    """Each model's mean cross-entropy over its positions (counter >= 2, or every one) on its seed's batch
    (seed + DATA_SEED_OFFSET), summed over the models; torch's SGD with momentum and weight decay."""
    task = TASK.build()
    section = MODEL.section(task)
    run = Training(task, MODEL, replace(TRAIN, lr=(0.1,), seed=(0, 1), weight_decay=0.05, loss=loss))
    w = stacked_init(section, (0, 1))
    sgd = torch.optim.SGD([w[k].requires_grad_() for k in run.trainable], lr=0.1, momentum=0.9, weight_decay=0.05)
    for step in range(2):
        batch = task.sample_counter(8, torch.tensor([DATA_SEED_OFFSET, 1 + DATA_SEED_OFFSET]), step)
        losses = -sequence_logits(w, batch.tokens, section).log_softmax(-1).gather(-1, batch.targets[..., None])[..., 0]
        mask = (batch.counts >= 2 if loss == "in_context" else torch.ones_like(batch.counts, dtype=torch.bool)).float()
        expected = ((losses * mask).sum((-1, -2)) / mask.sum((-1, -2))).sum()  # [K] -> summed
        expected.backward()
        sgd.step()
        sgd.zero_grad()
        assert run.train_step().item() == pytest.approx(expected.item(), rel=1e-5), step
    for k in run.trainable:
        assert torch.allclose(run.weights[k], w[k], atol=1e-5), k


def test_the_scores_read_each_kind_of_position_per_model():
    """in_context (counter >= 2), first_output (1) and bigram (0) positions, each model's own mean, on
    logits right at about half the positions (a forward given)."""
    task = InductionTaskConfig(n_triggers=2, seq_len=32).build()
    batch = task.eval_set(16, seed=4)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 16, 32, task.n_tokens, generator=g)  # [K, B, T, N]
    right = torch.rand(2, 16, 32, generator=g) < 0.5
    logits.scatter_add_(-1, batch.targets.expand(2, -1, -1)[..., None], 8.0 * right[..., None].float())
    found = scores({"w": torch.zeros(2)}, None, batch, "x_", forward=lambda w, tokens, section: logits)
    correct = logits.argmax(-1) == batch.targets  # [K, B, T]
    losses = -logits.log_softmax(-1).gather(-1, batch.targets.expand(2, -1, -1)[..., None])[..., 0]
    kinds = {"in_context": batch.counts >= 2, "first_output": batch.counts == 1, "bigram": batch.counts == 0}
    expected = {"x_in_context_accuracy": [correct[k][kinds["in_context"]].float().mean() for k in (0, 1)],
                "x_first_output_accuracy": [correct[k][kinds["first_output"]].float().mean() for k in (0, 1)],
                "x_in_context_loss": [losses[k][kinds["in_context"]].mean() for k in (0, 1)],
                "x_bigram_loss": [losses[k][kinds["bigram"]].mean() for k in (0, 1)]}
    assert found.keys() == expected.keys()
    for key, values in expected.items():
        assert torch.allclose(found[key], torch.stack(values), atol=1e-6), key
    assert (batch.counts >= 3).any() and found["x_in_context_accuracy"][0] != found["x_in_context_accuracy"][1]


def test_a_run_records_its_held_out_and_ood_scores_its_clock_and_its_settings(monkeypatch, capsys):
    """With held-out outputs every evaluation scores the held-out set and the OOD test (EVAL_SEED); the
    seconds are the clock's since the start, to 0.01 s; each result names its trainer, configs, device,
    trained weights, data seeds and final scores; the bar (shown by default) counts the steps."""
    import models.induction.trainer as trainer
    ticks = iter(range(1, 1000))
    monkeypatch.setattr(trainer, "time", SimpleNamespace(perf_counter=lambda: 1.23456 * next(ticks)))
    every_update(monkeypatch)
    task_cfg = replace(TASK, held_out_outputs=True)
    cfg = replace(TRAIN, lr=(0.1,), seed=(0, 1))
    results = train(task_cfg, MODEL, cfg)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # the status line as the bar closed
    assert last.startswith("training 2 models: 6/6 steps (100%)") and re.search(r"in_context=0\.\d{3}$", last), err
    task = task_cfg.build()
    section = MODEL.section(task)
    final = {k: torch.stack([r.weights[k] for r in results]) for k in results[0].weights}
    found = {**scores(final, section, task.eval_set(8, EVAL_SEED)),
             **scores(final, section, task.eval_set(8, EVAL_SEED, ood=True), "ood_")}
    seconds = [row["seconds"] for row in results[0].metrics]
    assert seconds == sorted(set(seconds)) and all(s == round(s, 2) != int(s) for s in seconds), seconds
    assert seconds[0] == 1.23  # the first evaluation, one tick after the start
    for i, (result, seed) in enumerate(zip(results, (0, 1))):
        last = result.metrics[-1]
        assert [row["step"] for row in result.metrics] == [0, 3, 6] and (last["lr"], last["seed"]) == (0.1, seed)
        for key, values in found.items():
            assert last[key] == pytest.approx(values[i].item(), abs=1e-6), key
        t = result.training
        assert (t["trainer"], t["model_config"], t["task_config"], t["device"]) == (
            "models.induction.trainer", asdict(MODEL), asdict(task_cfg), "cpu")
        assert t["trainable"] == ["blocks.0.attn.W_K", "blocks.1.attn.W_K", "blocks.1.attn.W_O"]
        assert (t["batch_seeds"], t["seconds"], t["lr"], t["seed"]) == ("seed + 1000000", seconds[-1], 0.1, seed)
        assert t["final_accuracy"] == last["in_context_accuracy"] and t["final_loss"] == last["in_context_loss"]
        assert t["final_ood_bigram_loss"] == last["ood_bigram_loss"] and "final_lr" not in t and "final_seed" not in t


def test_a_diverging_model_is_named_in_one_line():
    with pytest.raises(ValueError) as e:
        train(TASK, MODEL, replace(TRAIN, lr=(0.1, 1e20)), progress=False)
    assert str(e.value) == ("step 3: the model of lr 1e+20, seed 0 diverged (non-finite loss); lower the "
                            "learning rate.")


def test_a_resumed_run_trains_only_its_remaining_steps_and_its_clock_goes_on(tmp_path, monkeypatch):
    import models.induction.trainer as trainer
    ticks = iter(range(1, 1000))
    monkeypatch.setattr(trainer, "time", SimpleNamespace(perf_counter=lambda: 1.5 * next(ticks)))
    cfg = replace(TRAIN, steps=6, eval_every=2)
    train(TASK, MODEL, replace(cfg, steps=4), progress=False, state_folder=tmp_path)
    steps, step = [], Training.train_step
    monkeypatch.setattr(Training, "train_step", lambda self: steps.append(self.step) or step(self))
    resumed = train(TASK, MODEL, cfg, progress=False, state_folder=tmp_path)[0]
    assert steps == [4, 5]
    seconds = [row["seconds"] for row in resumed.metrics]
    assert seconds == sorted(set(seconds)) and seconds[-1] - seconds[-2] < 5, seconds


SMALL = ["--n-triggers", "2", "--seq-len", "8", "--d-model", "8", "--batch-size", "4", "--steps", "2", "--eval-every",
         "2", "--eval-size", "4", "--device", "cpu"]


def test_the_cli_writes_a_folder_per_model_at_its_default_out_with_a_bar(tmp_path, monkeypatch, capsys):
    """Two learning rates: ckpt/induction_PRESET/lr<LR>_seed<SEED>/ each, run.json with the preset and the
    settings (resumed with the learning rates as given), and the bar where bars are asked for."""
    monkeypatch.chdir(tmp_path)
    every_update(monkeypatch)
    assert train_cli.main([*SMALL, "--lr", "0.1,0.05"]) == 0
    assert "training 2 models" in capsys.readouterr().err
    out = tmp_path / "ckpt" / "induction_cpu"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["lr0.05_seed0", "lr0.1_seed0"]
    run = json.loads((out / "run.json").read_text())
    assert (run["preset"], run["training"]["lr"], run["training"]["steps"]) == ("cpu", [0.1, 0.05], 2)
    config = json.loads((out / "lr0.05_seed0" / "config.json").read_text())
    assert (config["training"]["lr"], config["training"]["steps_run"]) == (0.05, 2)
    assert train_cli.main(["--resume", str(out), "--quiet"]) == 0  # finished: nothing to resume
    assert json.loads((out / "lr0.1_seed0" / "config.json").read_text())["training"]["lr"] == 0.1


def test_the_cli_names_the_command_that_resumes_an_interrupted_run(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(train_cli, "train", interrupted)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt) as stop:
        train_cli.main([*SMALL, "--quiet", "--out", str(out)])
    assert str(stop.value) == ("interrupted; the training state is saved at every evaluation: "
                               f"python -m models.induction.train --resume {out}")


def test_given_initial_weights_every_model_starts_from_them(monkeypatch, capsys):
    """... from a built task without its configuration (recorded as None), and without progress: no line."""
    every_update(monkeypatch)
    task = TASK.build()
    start = {k: v + 0.5 for k, v in init_weights(MODEL.section(task), 7).items()}
    results = train(None, MODEL, replace(TRAIN, seed=(0, 1), snapshot_every=3), progress=False, task=task,
                    initial=start)
    assert capsys.readouterr().err == "" and results[0].training["task_config"] is None
    for result in results:
        assert all(torch.equal(result.snapshots[0][k], v) for k, v in start.items())


def test_the_cli_help_names_the_command_each_option_and_the_setting_groups():
    text = " ".join(train_cli.parser().format_help().split())  # argparse's line breaks undone
    for shown in ("usage: python -m models.induction.train", "train models of the induction family",
                  "--preset PRESET cpu | paper (default cpu: under two minutes on a 2-core CPU; paper: the authors' "
                  "d = 256, T = 256, batch 512)", "--out OUT checkpoint directory to write (default "
                  "ckpt/induction_PRESET)", "--resume OUT continue the interrupted run at OUT (its settings are read "
                  "from OUT/run.json)", "--quiet no progress bar", "task: --text TEXT", "model: --architecture",
                  "training: --optimizer"):
        assert shown in text, shown
    assert "--force " + " ".join(train_cli.FORCE_HELP.split()) in text
    assert train_cli.parser().parse_args(["--force"]).force is True


def test_a_run_keeps_only_the_states_resume_needs_and_a_finished_one_none(tmp_path):
    """Evaluations at 0, 2, 4, 6, snapshots at 0 and 4: killed after step 4 the folder holds the states of 0 and 4
    (the snapshots' weights) only; after 6, those and 6's. Resumed from there, the run is the whole run's."""
    cfg = replace(TRAIN, steps=6, eval_every=2, snapshot_every=4)
    whole = train(TASK, MODEL, cfg, progress=False)[0]
    train(TASK, MODEL, replace(cfg, steps=4), progress=False, state_folder=tmp_path)  # killed after step 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step_0000000{s}.{x}" for s in (0, 4)
                                                          for x in ("json", "safetensors")]
    resumed = train(TASK, MODEL, cfg, progress=False, state_folder=tmp_path)[0]
    assert complete_steps(tmp_path) == [0, 4, 6] and sorted(resumed.snapshots) == [0, 4, 6]
    for key, value in whole.weights.items():
        assert torch.equal(resumed.weights[key], value), key
    for step, snapshot in whole.snapshots.items():
        assert all(torch.equal(resumed.snapshots[step][k], v) for k, v in snapshot.items()), step
    assert train(TASK, MODEL, replace(cfg, snapshot_every=0), progress=False, state_folder=tmp_path / "b")
    assert complete_steps(tmp_path / "b") == [6]


def test_a_run_killed_while_writing_its_models_resumes_and_then_keeps_no_state(tmp_path, monkeypatch, capsys):
    from models.training.result import TrainResult

    out, save, saved = tmp_path / "run", TrainResult.save, []

    def killed_on_the_second(self, path):
        if saved:
            raise KeyboardInterrupt
        saved.append(path)
        return save(self, path)
    monkeypatch.setattr(TrainResult, "save", killed_on_the_second)
    code, _, err = run_main(train_cli.main, [*SMALL, "--lr", "0.1,0.05", "--quiet", "--out", out], capsys)
    assert code == 130 and f"--resume {out}" in err and complete_steps(out / "train_state") == [2]
    monkeypatch.setattr(TrainResult, "save", save)
    code, said, _ = run_main(train_cli.main, ["--resume", out, "--quiet"], capsys)
    assert code == 0 and "lr 0.05 seed 0: in-context accuracy" in said
    assert (out / "lr0.05_seed0" / "config.json").is_file() and not (out / "train_state").exists()


def test_rerunning_an_interrupted_command_names_resume_not_force(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    out, real = tmp_path / "run", train_cli.train
    monkeypatch.setattr(train_cli, "train", interrupted)
    assert run_main(train_cli.main, [*SMALL, "--quiet", "--out", out], capsys)[0] == 130
    monkeypatch.setattr(train_cli, "train", real)
    code, _, err = run_main(train_cli.main, [*SMALL, "--quiet", "--out", out], capsys)
    assert (code, err) == (2, f"error: --out {out} holds an interrupted run; continue it with `python -m "
                              f"models.induction.train --resume {out}`, or pass --force to start again.\n")
    assert sorted(p.name for p in out.iterdir()) == ["run.json"]
    assert run_main(train_cli.main, [*SMALL, "--quiet", "--out", out, "--force"], capsys)[0] == 0


@pytest.mark.parametrize("record, message", [
    ({"preset": "tiny", "task": {"n_subjects": 64}, "model": {"d_model": 64}, "train": {"lr": [0.01]}},
     "error: --resume {out}: a run of the factual-recall family, not an induction one; resume it with `python -m "
     "models.train --resume {out}`.\n"),
    ({"preset": "cpu", "task": {"n_subjects": 64}, "model": {}, "training": {}},
     "error: {out}/run.json: not a valid induction run description.\n"),
    ([1, 2], "error: {out}/run.json: not a valid induction run description.\n")])
def test_resume_refuses_another_familys_run_or_a_damaged_record_in_one_line(record, message, tmp_path, capsys):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "run.json").write_text(json.dumps(record))
    code, _, err = run_main(train_cli.main, ["--resume", out], capsys)
    assert (code, err) == (2, message.format(out=out)) and sorted(p.name for p in out.iterdir()) == ["run.json"]


def test_the_factual_recall_trainer_refuses_to_resume_an_induction_run(tmp_path, capsys):
    """A finished induction checkpoint, and an interrupted run of several models (run.json only), name the
    induction family's command instead of calling the run complete."""
    from models.recall import train as recall_cli

    out = tmp_path / "run"
    assert train_cli.main([*SMALL, "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    (interrupted / "run.json").write_text((out / "run.json").read_text())
    for ckpt in (out, interrupted):
        code, said, err = run_main(recall_cli.main, ["--resume", ckpt], capsys)
        assert (code, said, err) == (2, "", f"error: --resume {ckpt}: a run of the induction family, not a "
                                            f"factual-recall one; resume it with `python -m models.induction.train "
                                            f"--resume {ckpt}`.\n")


def test_a_run_that_cannot_fit_in_memory_is_refused_before_out_is_touched(tmp_path, capsys):
    """d = 100000: W_Q, W_K, W_V, W_O of two layers, 8 d^2 numbers, 298 GiB before training; one line."""
    out = tmp_path / "big"
    code, _, err = run_main(train_cli.main, ["--d-model", "100000", "--device", "cpu", "--out", out], capsys)
    assert code == 2 and re.fullmatch(r"error: this run needs an estimated \d+\.\d GiB of memory on cpu \(weights "
                                      r"\d+\.\d GiB\), more than the \d+\.\d GiB available; make it smaller "
                                      r"\(--d-model, --d-mlp, or fewer --lr/--seed values\)\.\n", err), err
    assert not out.exists()


def test_the_memory_estimate_is_refused_just_above_what_is_available():
    from models.induction.fits import check_fits, needed_bytes

    task, model, cfg = TASK.build(), replace(MODEL, d_mlp=32), replace(TRAIN, optimizer="adam", lr=(0.1, 0.2))
    parts = needed_bytes(task, model, cfg)
    need = parts["weights"] + parts["batches"] + max(parts["training step"], parts["evaluation"])
    check_fits(task, model, cfg, torch.device("cpu"), available=need)
    with pytest.raises(ValueError, match=r"needs an estimated 0\.0 GiB of memory on cpu \(training step 0\.0 GiB\), "
                                         r"more than the 0\.0 GiB available"):
        check_fits(task, model, cfg, torch.device("cpu"), available=need - 1)
    doubled = needed_bytes(task, model, replace(cfg, lr=(0.1, 0.2, 0.3, 0.4)))  # K = 4 models: twice each part
    assert {k: doubled[k] for k in ("weights", "training step", "evaluation")} == {
        k: 2 * parts[k] for k in ("weights", "training step", "evaluation")}
    sgd = needed_bytes(task, model, replace(cfg, optimizer="sgd"))  # one optimizer state fewer than Adam's
    trained = sum(math.prod(s) for k, s in model.section(task).weight_shapes().items() if k in
                  trainable_keys(model.section(task)))
    assert parts["weights"] - sgd["weights"] == 4 * 2 * trained


def test_the_cli_help_shows_the_values_a_run_without_flags_takes():
    """The default preset is cpu: its K 3, T 64, d 64, batch 64, 600 steps, lr 0.2 (not the paper's 5, 256, 256,
    512, 1000, 0.03, the configs' own defaults)."""
    text = " ".join(train_cli.parser().format_help().split())
    for shown in ("--n-triggers N_TRIGGERS K, trigger tokens (default, cpu preset: 3)",
                  "--seq-len SEQ_LEN T, inputs per sequence (= n_ctx) (default, cpu preset: 64)",
                  "--d-model D_MODEL d, embedding dimension (default, cpu preset: 64)",
                  "--batch-size BATCH_SIZE fresh sequences per step (default, cpu preset: 64)",
                  "--steps STEPS training steps (default, cpu preset: 600)",
                  "--lr A,B,... learning rates (one model per lr and seed) (default, cpu preset: 0.2)",
                  "--eval-every EVAL_EVERY score every model on the held-out set every this many steps (default, "
                  "cpu preset: 25)", "--frozen A,B,... weights kept at their initial value"):
        assert shown in text, shown
    assert "preset default here" not in text and train_cli.parser().parse_args([]).preset == "cpu"
    assert text.count("(default, cpu preset: ") == 26


def test_the_memory_estimate_is_the_documented_count_of_each_part():
    """Each part of the estimate is the count models/induction/fits.py documents, in bytes (float32
    numbers, int64 tokens), here at sizes where every term is distinct: the weights of K models
    (initial copy, live weights) plus gradient and Adam's two states of the trained ones; per
    position of a step L (2 H T + 4 d + 3 m) + 3 N numbers, of an evaluation 2 H T + 4 d + 2 m + 3 N."""
    from models.induction.fits import needed_bytes

    task = TASK.build()
    model, cfg = replace(MODEL, d_mlp=32), replace(TRAIN, optimizer="adam", lr=(0.1, 0.2, 0.3))
    section = model.section(task)
    weights = init_weights(section, 0)
    every = sum(w.numel() for w in weights.values())
    trained = sum(weights[k].numel() for k in trainable_keys(section))
    K, B, E, T = 3, cfg.batch_size, cfg.eval_size, task.seq_len
    d, H, m, L, N = section.d_model, section.n_heads, 32, section.n_layers, section.d_vocab_out
    assert needed_bytes(task, model, cfg) == {
        "weights": 4 * K * (2 * every + 3 * trained),
        "training step": 4 * K * B * T * (L * (2 * H * T + 4 * d + 3 * m) + 3 * N),
        "evaluation": 4 * K * E * T * (2 * H * T + 4 * d + 2 * m + 3 * N),
        "batches": 8 * T * (6 * K * B + 6 * E)}
    frozen = trainable_keys(section)[:1]  # a frozen weight has no gradient or optimizer state
    assert needed_bytes(task, model, replace(cfg, frozen=tuple(frozen)))["weights"] == \
        4 * K * (2 * every + 3 * (trained - weights[frozen[0]].numel()))
    heads = replace(MODEL, architecture="generic", n_heads=2, d_mlp=32)  # attention scores grow with the heads
    two = heads.section(task)
    assert needed_bytes(task, heads, cfg)["evaluation"] == \
        4 * K * E * T * (2 * 2 * T + 4 * two.d_model + 2 * 32 + 3 * two.d_vocab_out)
    assert needed_bytes(task, heads, cfg)["training step"] == \
        4 * K * B * T * (two.n_layers * (2 * 2 * T + 4 * two.d_model + 3 * 32) + 3 * two.d_vocab_out)
    no_mlp = needed_bytes(task, MODEL, cfg)  # without an MLP no hidden layer is counted
    assert MODEL.section(task).d_mlp is None and no_mlp["evaluation"] == 4 * K * E * T * (2 * H * T + 4 * d + 3 * N)
