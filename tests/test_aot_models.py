"""Attention-only memorisation (Dana et al.): tasks, KL floor, the padded trainer forward
against the TransformerBridge model, the dana head layout."""
import itertools
import json
import math
import re
from dataclasses import fields

import pytest
import torch
import torch.nn.functional as F

from models import load
from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.aot.forward import population_logits
from models.aot.trainer import train_aot
from models.aot.weights import init_aot_weights, stack_models, to_transformer_lens
from models.bridge import build_bridge
from probe.kl_floor import rank_d_kl_floor
from tasks import task_from_config
from tasks.association import AssociationTask, DistributionTask

CPU = {"device": "cpu"}


# --------------------------------------------------------------------------- tasks
def test_association_sequences_labels_and_sampling():
    task = AssociationTask(n_tokens=5, context=3, table_seed=3)
    seqs = task.sequences()  # [125, 3]
    assert seqs.shape == (125, 3) and len({tuple(s) for s in seqs.tolist()}) == 125
    assert torch.equal(seqs[:, 0] * 25 + seqs[:, 1] * 5 + seqs[:, 2], torch.arange(125))  # base N, first token first
    assert torch.equal(task.next_tokens, AssociationTask(5, 3, table_seed=3).next_tokens)  # deterministic table
    assert not torch.equal(task.next_tokens, AssociationTask(5, 3, table_seed=4).next_tokens)
    assert set(task.next_tokens.tolist()) <= set(range(5))
    index = task.sample_index(50_000, torch.Generator().manual_seed(0))
    counts = torch.bincount(index, minlength=125).float()
    assert counts.min() > 0 and (counts / counts.mean() - 1).abs().max() < 0.25  # uniform over all N^S
    # scores: logits putting the next token first get accuracy 1; loss is the cross-entropy
    logits = torch.randn(125, 5)
    assert task.scores(F.one_hot(task.next_tokens, 5).float() * 10)["accuracy"] == 1.0
    expected = F.cross_entropy(logits, task.next_tokens)
    assert torch.allclose(task.scores(logits)["loss"], expected)
    assert torch.equal(task_from_config(task.to_config()).next_tokens, task.next_tokens)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_tokens": 1}, "n_tokens must be an integer >= 2"),
    ({"context": 0}, "context must be an integer >= 1"),
    ({"n_tokens": 50, "context": 6}, "sequences is more than"),
    ({"n_tokens": 3, "context": 1, "next_tokens": [0, 1, 7]}, "next_tokens must lie in 0..2"),
    ({"n_tokens": 3, "context": 1, "next_tokens": [0, 1]}, "must list 3 integer token ids"),
])
def test_bad_association_task(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AssociationTask(**kwargs)


def test_distribution_task_full_support_and_kl():
    task = DistributionTask(n_tokens=6, context=2, target_seed=1, concentration=2.0)
    pi = task.log_targets.exp()
    assert pi.shape == (36, 6) and (pi > 0).all() and torch.allclose(pi.sum(-1), torch.ones(36))
    assert task.scores(task.log_targets)["loss"].abs() < 1e-6  # the targets themselves: KL 0
    uniform = task.scores(torch.zeros(36, 6))["loss"]
    assert torch.allclose(uniform, (pi * (task.log_targets + math.log(6))).sum(-1).mean())
    assert task_from_config(task.to_config()).log_targets.equal(task.log_targets)
    assert DistributionTask(6, 2, concentration=0).log_targets.exp().sub(1 / 6).abs().max() < 1e-6


# --------------------------------------------------------------------------- KL floor
def test_kl_floor_zero_cases():
    task = DistributionTask(n_tokens=5, context=2, concentration=3.0)
    assert rank_d_kl_floor(task.log_targets, 4) == 0.0  # d >= N - 1 (Proposition 2)
    g = torch.Generator().manual_seed(0)
    low_rank = (torch.randn(40, 2, generator=g) @ torch.randn(2, 7, generator=g)).log_softmax(-1)
    assert rank_d_kl_floor(low_rank, 2, restarts=0) < 1e-8  # targets that a rank-2 encoder reaches exactly
    full = (3 * torch.randn(40, 7, generator=g)).log_softmax(-1)
    floors = [rank_d_kl_floor(full, d, restarts=1) for d in (1, 2, 3, 5)]
    assert all(a > b > 0 for a, b in itertools.pairwise(floors))  # positive, falling with d


def test_kl_floor_matches_brute_force_on_a_hand_example():
    """N = 3 tokens, d = 1, two sequences: a rank-1 encoder gives both sequences logits along
    one direction b (a unit vector of the plane orthogonal to (1,1,1), angle theta) times a
    scalar each. Brute force: theta on a grid, each scalar by a coarse then a fine grid."""
    log_pi = (2 * torch.tensor([[3.0, -3.0, 0.0], [1.0, 1.0, -2.0]], dtype=torch.float64)).log_softmax(-1)
    u = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64) / math.sqrt(2)
    v = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64) / math.sqrt(6)
    theta = torch.linspace(0, math.pi, 721, dtype=torch.float64)  # b and -b are the same encoder
    b = torch.cos(theta)[:, None] * u + torch.sin(theta)[:, None] * v  # [theta, 3]

    def kl(i, scale):  # sequence i's KL for logits scale [theta, n] * b -> [theta, n]
        logits = scale[..., None] * b[:, None, :]
        return (log_pi[i].exp() * (log_pi[i] - logits.log_softmax(-1))).sum(-1)

    best = torch.zeros(len(theta), dtype=torch.float64)
    for i in range(2):
        coarse = torch.linspace(-60, 60, 2401, dtype=torch.float64).expand(len(theta), -1)
        centre = coarse.gather(1, kl(i, coarse).argmin(1, keepdim=True))  # [theta, 1]
        fine = centre + torch.linspace(-0.05, 0.05, 201, dtype=torch.float64)
        best += kl(i, fine).amin(1) / 2
    brute = best.min().item()
    floor = rank_d_kl_floor(log_pi.float(), 1)
    assert brute > 0.05 and abs(floor - brute) < 1e-4, (floor, brute)


# --------------------------------------------------------------------------- models
MODELS = [AoTModelConfig(d_model=4, n_heads=2, d_head=3), AoTModelConfig(d_model=6, n_heads=3, d_head=2),
          AoTModelConfig(d_model=4, n_heads=1, d_head=4, d_mlp=8)]


@pytest.mark.parametrize("context", [2, 3])
def test_padded_stack_matches_transformer_bridge(context):
    task = AssociationTask(n_tokens=5, context=context)
    g = torch.Generator().manual_seed(1)
    models, sections = [], [m.checkpoint_section(task) for m in MODELS]
    for k, m in enumerate(MODELS):  # perturb every tensor, biases included, so every term is tested
        models.append({key: v + 0.3 * torch.randn(v.shape, generator=g)
                       for key, v in init_aot_weights(m, task, k).items()})
    stack = stack_models(models, sections)
    ours = population_logits(stack.effective(), context, stack.score_scale, stack.act_fn)  # [3, T_0, N]
    for k, (w, section) in enumerate(zip(models, sections)):
        assert {key: t.shape for key, t in stack.model(k).items()} == {key: t.shape for key, t in w.items()}
        with torch.no_grad():
            reference = build_bridge(section, w)(task.sequences())[:, -1]  # [T_0, N]
        assert (reference - ours[k]).abs().max().item() <= 1e-5


def test_stacked_training_equals_separate_runs_and_batch_loss():
    task = AssociationTask(n_tokens=6, context=2)
    cfg = AoTTrainConfig(lr=1e-2, batch_size=64, batches=5, epochs=2, eval_every=5, **CPU)
    together = train_aot(task, [(MODELS[0], 0), (MODELS[2], 1), (MODELS[1], 0)], cfg, progress=False)
    alone = train_aot(task, [(MODELS[2], 1)], cfg, progress=False)[0]
    for key, value in alone.weights.items():
        assert torch.allclose(together[1].weights[key], value, atol=1e-5), key
    assert abs(together[1].accuracy - alone.accuracy) < 1e-6
    # biases stay zero; the curve is recorded every eval_every steps and at the end
    assert all(not t.any() for k, t in alone.weights.items() if ".b_" in k)
    assert [m["step"] for m in alone.metrics] == [0, 5, 10]


def test_count_weighted_population_loss_equals_the_batch_loss():
    """The trainer's loss (population logits weighted by batch counts) is the batch's mean loss."""
    task = AssociationTask(n_tokens=6, context=2)
    model = MODELS[2]
    w = init_aot_weights(model, task, 0)
    index = task.sample_index(100, torch.Generator().manual_seed(5))
    stack = stack_models([w], [model.checkpoint_section(task)])
    losses = task.sequence_losses(population_logits(stack.effective(), 2, stack.score_scale, stack.act_fn))[0]
    weighted = (losses * torch.bincount(index, minlength=task.n_sequences)).sum() / 100
    with torch.no_grad():
        logits = build_bridge(model.checkpoint_section(task), w)(task.sequences(index))[:, -1]
    assert torch.allclose(weighted, F.cross_entropy(logits, task.next_tokens[index]), atol=1e-5)


def test_parameter_count_matches_the_paper():
    task = AssociationTask(50, 2)
    aot, mlp = AoTModelConfig(10, 20, 10), AoTModelConfig(10, 1, 10, d_mlp=2 * 19 * 10)
    assert aot.parameters(task) == 10 * (2 + 2 * 50 + 4 * 10 * 20) == mlp.parameters(task)
    weights = init_aot_weights(aot, task, 0)
    trainable = sum(t.numel() for k, t in weights.items() if ".b_" not in k and not k.endswith("b_U"))
    assert trainable == aot.parameters(task)


# --------------------------------------------------------------------------- the dana head layout
DANA = [AoTModelConfig(d_model=3, n_heads=2, d_head=4, head_layout="dana"),  # d < d_h
        AoTModelConfig(d_model=5, n_heads=3, d_head=2, head_layout="dana"),
        AoTModelConfig(d_model=4, n_heads=1, d_head=4, d_mlp=6, head_layout="dana")]


def dana_reference(w: dict, tokens: torch.Tensor) -> torch.Tensor:
    """The authors' layout written with torch.nn modules, independently of models.aot.weights: a
    shared nn.Linear compression, d_h-dimensional positions, one nn.MultiheadAttention(d_h, 1)
    per head (causal), heads summed, a shared decompression added to the token embedding,
    GELU MLP, unembedding. Logits [batch, S, N] at every position, in w's dtype."""
    nn = torch.nn
    d, dh = w["dana.W_C"].shape
    S = tokens.shape[1]
    compress = nn.Linear(d, dh, bias=False).to(w["dana.W_C"].dtype)
    heads = [nn.MultiheadAttention(dh, 1, batch_first=True).to(w["dana.W_C"].dtype)
             for _ in range(w["dana.W_Q"].shape[0])]
    with torch.no_grad():
        compress.weight.copy_(w["dana.W_C"].T)
        for h, mha in enumerate(heads):  # torch stores out x in: the transposes of our x @ W maps
            mha.in_proj_weight.copy_(torch.cat([w[f"dana.W_{n}"][h].T for n in "QKV"]))
            mha.in_proj_bias.copy_(torch.cat([w[f"dana.b_{n}"][h] for n in "QKV"]))
            mha.out_proj.weight.copy_(w["dana.W_O"][h].T)
            mha.out_proj.bias.copy_(w["dana.b_O"][h])
        x = compress(w["dana.W_E"][tokens]) + w["dana.W_pos"][:S]  # [batch, S, dh]
        mask = torch.ones(S, S, dtype=torch.bool).triu(1)  # True: not attended
        heads_out = sum(mha(x, x, x, attn_mask=mask, need_weights=False)[0] for mha in heads)  # [batch, S, dh]
        resid = w["dana.W_E"][tokens] + heads_out @ w["dana.W_D"]  # [batch, S, d]
        if "dana.W_in" in w:
            resid = resid + F.gelu(resid @ w["dana.W_in"]) @ w["dana.W_out"]
        return resid @ w["dana.W_U"]


def perturbed(model: AoTModelConfig, task, seed: int, dtype=torch.float32) -> dict:
    """Initial weights + noise on every tensor (biases included), so every term is tested."""
    g = torch.Generator().manual_seed(100 + seed)
    return {k: (v + 0.3 * torch.randn(v.shape, generator=g)).to(dtype)
            for k, v in init_aot_weights(model, task, seed).items()}


@pytest.mark.parametrize("context", [2, 3])
def test_dana_layout_equals_its_transformer_lens_form(context):
    """The dana layout's own forward (torch.nn modules) equals its TransformerLens form:
    the TransformerBridge at every position (float32), and the trainer's padded stack
    forward at the last position (float64)."""
    task = AssociationTask(n_tokens=5, context=context)
    tokens = task.sequences()  # [T_0, S]
    models = [perturbed(m, task, k) for k, m in enumerate(DANA)]
    for model, w in zip(DANA, models):
        section = model.checkpoint_section(task)
        tl = to_transformer_lens(w)
        assert section.d_model == model.d_model + model.d_head and tl["embed.W_E"].shape[-1] == section.d_model
        with torch.no_grad():
            bridge = build_bridge(section, tl)(tokens)  # [T_0, S, N]
        assert (bridge - dana_reference(w, tokens)).abs().max().item() <= 1e-5
    models64 = [{k: v.double() for k, v in w.items()} for w in models]
    stack = stack_models(models64, [m.checkpoint_section(task) for m in DANA])
    ours = population_logits(stack.transformer_lens(), context, stack.score_scale, stack.act_fn)
    for k, w in enumerate(models64):
        assert (ours[k] - dana_reference(w, tokens)[:, -1]).abs().max().item() <= 1e-10


def test_dana_layout_trains_and_saves_its_transformer_lens_form(tmp_path):
    """The trainer trains every dana parameter (biases included), reports the authors'
    batch accuracy, and the saved checkpoint reloads as a bridge with the trained accuracy."""
    task = AssociationTask(n_tokens=6, context=2)
    cfg = AoTTrainConfig(lr=1e-2, batch_size=64, batches=10, epochs=3, eval_every=10, **CPU)
    model = DANA[0]
    trained = train_aot(task, [(model, 0), (DANA[2], 1)], cfg, progress=False)[0]
    assert trained.weights[ATTN_B_Q].abs().sum() > 0 and 0 < trained.training["batch_accuracy"] <= 1
    assert model.parameters(task) == sum(t.numel() for t in init_aot_weights(model, task, 0).values())
    ckpt = trained.save(tmp_path / "dana")
    config = json.loads((ckpt / "config.json").read_text())
    assert config["model"]["head_layout"] == "dana" and config["model"]["d_embed"] == model.d_model
    bridge, loaded = load(ckpt, device="cpu")
    with torch.no_grad():
        accuracy = loaded.scores(bridge(loaded.sequences())[:, -1])["accuracy"].item()
    assert accuracy == pytest.approx(trained.accuracy)


ATTN_B_Q = "blocks.0.attn.b_Q"


def test_one_attention_only_model_from_the_command_line(tmp_path, capsys):
    """`python -m models.aot.train association ...` writes a checkpoint that models.load reads;
    its model, run on the task's held-out prompts, answers as the recorded accuracy says."""
    from models.aot.train import main
    from models.cli import run_cli

    out = tmp_path / "aot"
    assert main(["association", "--n-tokens", "6", "--context", "2", "--batches", "20", "--epochs", "5",
                 "--batch-size", "64", "--lr", "0.02", "--d-head", "6", "--device", "cpu", "--out", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    model, task = load(out, device="cpu")
    training = json.loads((out / "config.json").read_text())["training"]
    recorded = training["final_accuracy"]
    assert (training["batches"], training["epochs"], training["batch_size"], training["lr"]) == (20, 5, 64, 0.02)
    assert isinstance(task, AssociationTask) and task.n_tokens == 6 and model.cfg.attn_only and model.cfg.d_head == 6
    every = task.prompts(torch.arange(task.n_sequences))
    with torch.inference_mode():
        answered = (model(every.tokens)[:, -1].argmax(-1) == every.answers).float().mean().item()
    assert answered == pytest.approx(recorded, abs=1e-6) and f"accuracy {recorded:.4f}" in printed
    held = task.eval_set(16, seed=3)
    assert model.to_str_tokens(held.answers, answers=True) == [f"t{int(a)}" for a in held.answers]
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: main(["association", "--concentration", "2", "--out", str(tmp_path / "bad")]))
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        "error: --concentration is a setting of the distribution task, not of association.\n")
    assert not (tmp_path / "bad").exists()



@pytest.mark.parametrize("kind, task_class, seed_field", [("association", AssociationTask, "table_seed"),
                                                          ("distribution", DistributionTask, "target_seed")])
def test_the_task_seed_draws_the_task_whatever_the_seed(tmp_path, capsys, kind, task_class, seed_field):
    """--task-seed draws the association table (or the target distributions), --seed only the
    weights and the data set: the checkpoint's task is the task seed's."""
    from models.aot.train import main

    out = tmp_path / kind
    concentration = ["--concentration", "2"] if kind == "distribution" else []
    assert main([kind, "--n-tokens", "6", "--context", "2", "--batches", "1", "--epochs", "1", "--batch-size", "8",
                 "--device", "cpu", "--out", str(out), "--quiet", "--task-seed", "3", "--seed", "5",
                 *concentration]) == 0
    loss = "cross-entropy" if kind == "association" else "KL"
    assert re.search(rf"^final +accuracy [\d.]+ on all 36 sequences, loss [\d.]+ nats \({loss}\)$",
                     capsys.readouterr().out, re.M)
    task = task_from_config(json.loads((out / "config.json").read_text())["task"])
    if kind == "distribution":
        assert task.concentration == 2.0
    extra = (2.0,) if kind == "distribution" else ()
    drawn, other = task_class(6, 2, 3, *extra), task_class(6, 2, 5, *extra)
    assert getattr(task, seed_field) == 3
    field = "next_tokens" if kind == "association" else "log_targets"
    assert torch.equal(getattr(task, field), getattr(drawn, field))
    assert not torch.equal(getattr(drawn, field), getattr(other, field))  # the two seeds' tasks differ


def test_the_command_line_s_defaults_out_force_and_progress(tmp_path, monkeypatch, capsys):
    """Without flags: the defaults its --help states (N = 50, S = 2, seeds 0, a distribution's
    concentration 1), written to ckpt/aot_TASK; --force replaces a checkpoint there; a progress
    bar unless --quiet."""
    import models.aot.train as cli_module

    args = cli_module.parser().parse_args(["distribution"])
    assert (args.n_tokens, args.context, args.task_seed, args.seed, args.out, args.force, args.quiet) == (
        50, 2, 0, 0, None, False, False)
    assert cli_module.build_task(args).concentration == 1.0
    with pytest.raises(SystemExit) as exit_:
        cli_module.main(["--help"])
    shown = capsys.readouterr().out
    assert exit_.value.code == 0 and shown.startswith("usage: python -m models.aot.train [-h] [--out OUT]")
    assert cli_module.__doc__.strip().split("\n\n")[0] in shown
    for title, config in (("model", cli_module.MODEL), ("training", cli_module.TRAINING)):  # every field a flag
        group = re.split(rf"\n{title}( \([^\n]*\))?:\n", shown)[2].split("\n\n")[0]
        for f in fields(config):
            flag = "--" + f.name.replace("_", "-")
            help_text = " ".join(group.split(flag, 1)[1].split("\n  --")[0].split())
            assert help_text.endswith(f"(default: {getattr(config, f.name)})"), (flag, help_text)
    with pytest.raises(SystemExit) as exit_:
        cli_module.parser().parse_args(["bogus"])
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        "error: argument task: invalid choice: 'bogus' (choose from 'association', 'distribution')\n")

    progress = []
    real = cli_module.train_aot
    monkeypatch.setattr(cli_module, "train_aot", lambda *a, **kw: progress.append(kw["progress"]) or real(*a, **kw))
    monkeypatch.chdir(tmp_path)
    small = ["--n-tokens", "4", "--batches", "1", "--epochs", "1", "--batch-size", "4", "--device", "cpu"]
    assert cli_module.main(["association", *small]) == 0
    assert (tmp_path / "ckpt" / "aot_association" / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="already holds files; pass --force"):
        cli_module.main(["association", *small])
    assert cli_module.main(["association", *small, "--force", "--quiet"]) == 0
    assert progress == [True, False]
def test_the_default_model_memorises_the_paper_s_bigrams_in_a_few_hundred_steps(tmp_path, capsys):
    """`python -m models.aot.train association` with its defaults learns: the default model
    stores every one of the 2500 bigrams of N = 50 within its first 400 steps (two fifths of
    its 1000), where the paper's d = d_h = 10, H = 1 model stores a few per cent."""
    from models.aot.train import main

    assert main(["association", "--epochs", "2", "--device", "cpu", "--out", str(tmp_path / "aot"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "AssociationTask(N=50, S=2, T_0=2500)" in printed and "400 steps (200 batches x 2 epochs)" in printed
    config = json.loads((tmp_path / "aot" / "config.json").read_text())
    assert config["training"]["final_accuracy"] >= 0.95
