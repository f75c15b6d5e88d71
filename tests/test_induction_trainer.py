"""The induction trainer: SGD with momentum and weight decay and AdamW equal torch.optim's, each
model of a stack trains as it would alone, frozen weights stay, a run resumes bit-identically, the
CPU preset learns the induction head, and the CLI refuses bad input in one line."""
import json
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
from models.induction.weights import init_weights
from models.training.optimizer import Optimizer
from models.training.progress import ENV
from models.training.result import DATA_SEED_OFFSET

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
    assert (out / "config.json").is_file() and (out / "train_state").is_dir()
    shown = capsys.readouterr()
    assert shown.out.startswith("task      InductionTask(shakespeare, N=65, K=2 fixed triggers, T=8")
    assert "in-context accuracy" in shown.out and shown.err == ""  # --quiet: no progress
    assert train_cli.main(["--resume", str(out), "--quiet"]) == 0  # already finished: written again, same
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
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["lr0.05_seed0", "lr0.1_seed0", "train_state"]
    run = json.loads((out / "run.json").read_text())
    assert (run["preset"], run["training"]["lr"], run["training"]["steps"]) == ("cpu", [0.1, 0.05], 2)
    config = json.loads((out / "lr0.05_seed0" / "config.json").read_text())
    assert (config["training"]["lr"], config["training"]["steps_run"]) == (0.05, 2)
    assert train_cli.main(["--resume", str(out), "--quiet"]) == 0
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
