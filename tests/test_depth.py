"""L-layer factual-recall models (L = 1 .. 4): the trainer's forward pinned to the TransformerBridge
model at every depth, its gradients to autograd's, the checkpoint's n_layers, one-layer runs
recorded as before, and the refusals (a depth out of range, a one-layer tool on a deeper model)."""
import json

import pytest
import torch

from analyses import hallucination, report, visualize
from models.bridge import build_bridge, load
from models.checkpoint import CheckpointError, load_checkpoint, write_checkpoint
from models.cores.deep import deep_last_position_logits
from models.cores.forward import last_position_logits
from models.recall import train as train_cli
from models.recall.config import ModelConfig, RunConfig, TrainConfig, resolved_record, run_record
from models.recall.shape_stack import check_stackable, stack_parts
from models.recall.weights import init_weights, stack, trainable_keys
from models.section import ModelSection, shapes
from tasks.factual_recall import FactualRecallTask
from tests.conftest import TEST_DEVICE, run_main
from tests.test_parity import fast_gradients_equal_autograd

TASK = FactualRecallTask(12, 4, 3, 10, 9)


def perturbed(model: ModelConfig, seed: int, scale: float, positional: bool) -> dict[str, torch.Tensor]:
    """Initial weights with every tensor perturbed (biases and W_pos too, so every term is tested)."""
    g = torch.Generator().manual_seed(100 + seed)
    w = {k: v + scale * torch.randn(v.shape, generator=g) for k, v in init_weights(model, TASK, seed).items()}
    if not positional:  # our models: W_pos zero, so the forward skips the position terms
        w["pos_embed.W_pos"].zero_()
    return w


@pytest.mark.parametrize("positional", [True, False], ids=["W_pos", "no-W_pos"])
@pytest.mark.parametrize("options", [{}, {"attn_only": True}, {"attention": "linear"}, {"parameterisation": "authors"}],
                         ids=["mlp", "attn-only", "linear", "authors"])
@pytest.mark.parametrize("n_layers", [1, 2, 3, 4])
def test_trainer_forward_matches_the_transformer_bridge_at_every_depth(n_layers, options, positional):
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, n_layers=n_layers, **options)
    scale = 0.02 if model.attention == "linear" else 0.1  # linear attention compounds its scores layer on layer
    models = [{k: v.to(TEST_DEVICE) for k, v in perturbed(model, seed, scale, positional).items()} for seed in (0, 1)]
    tokens = TASK.sample(128, torch.Generator().manual_seed(2)).tokens.to(TEST_DEVICE)
    ours = last_position_logits(stack(models), tokens.expand(2, -1, -1), model.attention, positional)  # [2, B, O]
    for k, w in enumerate(models):
        bridge = build_bridge(model.checkpoint_section(TASK), w, TEST_DEVICE)
        assert bridge.cfg.n_layers == n_layers
        with torch.no_grad():
            reference = bridge(tokens)[:, -1]  # [B, O]
        assert reference.shape == ours[k].shape
        # float32 rounding compounds layer on layer: 1.2e-5 of the largest logit measured at L = 4 (authors)
        assert (reference - ours[k]).abs().max().item() <= 1e-5 * n_layers * max(1.0, reference.abs().max().item())


def test_the_deep_forward_with_its_defaults_is_the_transformer_lens_model():
    """Called with no options, the L-layer forward is TransformerLens's model: softmax attention and
    W_pos read (a model whose W_pos is not zero)."""
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, n_layers=2)
    w = perturbed(model, 0, 0.1, positional=True)
    tokens = TASK.sample(64, torch.Generator().manual_seed(3)).tokens
    with torch.no_grad():
        reference = build_bridge(model.checkpoint_section(TASK), w)(tokens)[:, -1]  # [B, O]
    ours = deep_last_position_logits(stack([w]), tokens[None])[0]
    assert (reference - ours).abs().max().item() <= 2e-5 * max(1.0, reference.abs().max().item())


def _full_sequence_logits(w: dict, tokens: torch.Tensor, attention: str) -> torch.Tensor:
    """Plain autograd reference: TransformerLens math at every position and every layer, one model
    (no K axis): tokens [B, T] -> last-position logits [B, O]."""
    T = tokens.shape[1]
    resid = w["embed.W_E"][tokens] + w["pos_embed.W_pos"][:T]  # [B, T, d]
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    layer = 0
    while f"blocks.{layer}.attn.W_Q" in w:
        A, M = f"blocks.{layer}.attn.", f"blocks.{layer}.mlp."
        q, k, v = (torch.einsum("btd,hde->bthe", resid, w[A + "W_" + x]) + w[A + "b_" + x] for x in "QKV")
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / q.shape[-1] ** 0.5  # [B, H, T, T]
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1) if attention == "softmax" else \
            scores.masked_fill(~causal, 0.0)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)  # [B, T, H, e]
        resid = resid + torch.einsum("bqhe,hed->bqd", z, w[A + "W_O"]) + w[A + "b_O"]
        if M + "W_in" in w:
            resid = resid + torch.relu(resid @ w[M + "W_in"] + w[M + "b_in"]) @ w[M + "W_out"] + w[M + "b_out"]
        layer += 1
    return (resid @ w["unembed.W_U"] + w["unembed.b_U"])[:, -1]  # [B, O]


@pytest.mark.parametrize("positional", [True, False], ids=["W_pos", "no-W_pos"])
@pytest.mark.parametrize("attention", ["softmax", "linear"])
@pytest.mark.parametrize("n_layers", [2, 3])
def test_trainer_gradients_equal_autograd_of_the_full_model(n_layers, attention, positional):
    """Every weight's gradient through the L-layer forward (last layer at the last position only)
    equals autograd's through the plain full-sequence model, in float64."""
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, n_layers=n_layers, attention=attention)
    w = {k: v.double().to(TEST_DEVICE) for k, v in perturbed(model, 0, 0.05, positional).items()}
    batch = TASK.sample(64, torch.Generator().manual_seed(5))
    grads = fast_gradients_equal_autograd(model, TASK, w, batch, attention, positional, _full_sequence_logits)
    assert "blocks.1.mlp.W_in" in grads


def test_one_layer_runs_are_recorded_as_before_and_deeper_ones_name_their_depth():
    one, two = RunConfig(), RunConfig(model=ModelConfig(n_layers=2))
    assert "n_layers" not in run_record(one)["model"] and "n_layers" not in resolved_record(one.model)
    assert "n_layers" not in one.model.recorded()
    assert run_record(two)["model"]["n_layers"] == 2 and resolved_record(two.model)["n_layers"] == 2
    section = ModelConfig().checkpoint_section(TASK)
    assert list(section.to_json()) == ["n_layers", "d_model", "n_heads", "d_head", "d_mlp", "attn_only", "act_fn",
                                       "normalization_type", "n_ctx", "d_vocab", "d_vocab_out", "attention"]
    assert section.to_json()["n_layers"] == 1 and ModelSection.from_json(section.to_json()) == section
    deep = ModelConfig(n_layers=3).checkpoint_section(TASK)
    assert deep.to_json()["n_layers"] == 3 and ModelSection.from_json(deep.to_json()) == deep
    one_keys = list(shapes(section))  # the one-layer model's keys, in the order its checkpoints hold them
    assert one_keys == ["embed.W_E", "pos_embed.W_pos"] + [f"blocks.0.attn.{n}" for n in (
        "W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O", "b_O")] + ["unembed.W_U", "unembed.b_U"] + [
        f"blocks.0.mlp.{n}" for n in ("W_in", "b_in", "W_out", "b_out")]
    assert list(shapes(deep))[:len(one_keys)] == one_keys
    assert {k for k in shapes(deep) if k not in one_keys} == {k.replace("blocks.0", f"blocks.{layer}")
                                                             for k in one_keys if k.startswith("blocks.0")
                                                             for layer in (1, 2)}


@pytest.mark.parametrize("parameterisation", ["standard", "authors"])
def test_a_deeper_model_starts_from_the_one_layer_model_and_draws_new_blocks(parameterisation):
    one = init_weights(ModelConfig(parameterisation=parameterisation), TASK, 3)
    cfg = ModelConfig(n_layers=2, parameterisation=parameterisation)
    two = init_weights(cfg, TASK, 3)
    for key, t in one.items():
        assert torch.equal(two[key], t), key
    assert not torch.equal(two["blocks.1.attn.W_K"], two["blocks.0.attn.W_K"])
    assert not two["blocks.1.attn.b_O"].any()  # the authors' b_O cancels EOS in the first block only
    trainable = trainable_keys(two, cfg)
    assert {"blocks.1.attn.W_Q", "blocks.1.mlp.W_out"} <= set(trainable)
    assert ("blocks.1.mlp.b_in" in trainable) == (parameterisation == "authors")
    assert "blocks.1.attn.b_O" not in trainable
    assert set(trainable_keys(two, cfg, freeze_ov=True)) & {"blocks.1.attn.W_V", "blocks.1.attn.W_O"} == set()


@pytest.fixture(scope="module")
def deep_ckpt(tmp_path_factory):
    """A two-layer tiny model trained a few steps by `python -m models.train` (with snapshots)."""
    out = tmp_path_factory.mktemp("deep") / "tiny2"
    assert train_cli.main(["--preset", "tiny", "--n-layers", "2", "--steps", "16", "--eval-every", "8",
                           "--eval-size", "256", "--batch-size", "256", "--quiet", "--device", str(TEST_DEVICE),
                           "--out", str(out)]) == 0
    return out


def test_train_writes_an_l_layer_checkpoint_that_load_reads_with_l_blocks(deep_ckpt):
    config = json.loads((deep_ckpt / "config.json").read_text())
    assert config["model"]["n_layers"] == 2 and config["training"]["model_config"]["n_layers"] == 2
    assert json.loads((deep_ckpt / "run.json").read_text())["model"]["n_layers"] == 2
    model, task = load(deep_ckpt, str(TEST_DEVICE))
    assert model.cfg.n_layers == 2 and len(model.blocks) == 2
    checkpoint = load_checkpoint(deep_ckpt)
    tokens = task.sample(64, torch.Generator().manual_seed(0)).tokens.to(TEST_DEVICE)
    weights = stack([{k: v.to(TEST_DEVICE) for k, v in checkpoint.weights.items()}])
    with torch.no_grad():
        reference = model(tokens)[:, -1]
    ours = last_position_logits(weights, tokens[None])[0]
    assert (reference - ours).abs().max().item() <= 1e-5 * max(1.0, reference.abs().max().item())


@pytest.mark.parametrize("depth", ["0", "5", "two"])
def test_a_depth_out_of_range_is_refused_in_one_line(depth, tmp_path, capsys):
    out = tmp_path / "never"
    code, _, err = run_main(train_cli.main, ["--preset", "tiny", "--n-layers", depth, "--out", out], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and ("n-layers" in err or "n_layers" in err)
    assert not out.exists()


@pytest.mark.parametrize("value", [0, 5, "2", True])
def test_the_checkpoint_reader_refuses_a_bad_depth(value, tmp_path):
    section = ModelConfig().checkpoint_section(TASK)
    ckpt = write_checkpoint(tmp_path / "c", section, TASK, {}, init_weights(ModelConfig(), TASK, 0))
    config = json.loads((ckpt / "config.json").read_text())
    config["model"]["n_layers"] = value
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="n_layers must be an integer from 1 to 4"):
        load_checkpoint(ckpt)


def test_the_checkpoint_reader_wants_every_block(tmp_path):
    cfg = ModelConfig(n_layers=2)
    weights = init_weights(cfg, TASK, 0)
    del weights["blocks.1.mlp.W_out"]
    ckpt = write_checkpoint(tmp_path / "c", cfg.checkpoint_section(TASK), TASK, {}, weights)
    with pytest.raises(CheckpointError, match="lacks the tensor blocks.1.mlp.W_out"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("tool, extra", [(hallucination, []), (visualize, []), (report, [])],
                         ids=["hallucination", "visualize", "report"])
def test_one_layer_tools_refuse_a_deeper_model_in_one_line(tool, extra, deep_ckpt, capsys):
    code, _, err = run_main(tool.main, [deep_ckpt, *extra, "--quiet", "--device", str(TEST_DEVICE)], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: {deep_ckpt}: a model of 2 layers; {tool.__name__.split('.')[-1]} reads one-layer models only."]
    assert not (deep_ckpt / "analysis").exists()


def test_the_pruning_study_refuses_a_deeper_model(deep_ckpt, tmp_path, capsys):
    from analyses.tradeoff.cli import main as tradeoff

    code, _, err = run_main(tradeoff, ["shrink", "--ckpt", deep_ckpt, "--out", tmp_path / "shrink", "--quiet"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: {deep_ckpt}: a model of 2 layers; tradeoff shrink reads one-layer models only."]


def test_stacks_of_shapes_and_the_fused_core_refuse_deeper_models():
    deep = RunConfig(model=ModelConfig(n_layers=2), train=TrainConfig())
    with pytest.raises(ValueError, match="one-layer models"):
        check_stackable([deep, deep])
    w = stack([init_weights(deep.model, TASK, 0)])
    tokens = TASK.sample(4, torch.Generator().manual_seed(0)).tokens[None]
    with pytest.raises(ValueError, match="one-layer models only"):
        last_position_logits(w, tokens, attention_core="fused")
    with pytest.raises(ValueError, match="one-layer models only"):
        last_position_logits(w, tokens, query_scale=torch.ones(1))


def test_the_memory_estimate_counts_every_block():
    """models.recall.fits refuses a run that cannot fit: a deeper model's weights and every-position
    activations are counted."""
    one, two = stack_parts([RunConfig()]), stack_parts([RunConfig(model=ModelConfig(n_layers=2))])
    assert one["weights"] < two["weights"] < 2 * one["weights"]  # a second block; the embeddings are shared
    assert two["training step"] > 5 * one["training step"]  # the first block at every position
