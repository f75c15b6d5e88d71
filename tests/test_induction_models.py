"""The induction family's models: the fast forward equals the TransformerLens model on the same
weights (every architecture), a stack of K models computes each model's own function, the
simplified model's frozen weights are the authors', and a checkpoint opens as a TransformerBridge
whose strings are characters."""
from dataclasses import replace

import pytest
import torch

from models import load
from models.bridge import build_bridge
from models.checkpoint import CheckpointError, load_checkpoint
from models.induction.config import InductionModelConfig, InductionTaskConfig
from models.induction.forward import forward_for, sequence_logits, simplified_logits
from models.induction.weights import init_weights, trainable_keys
from models.training.result import TrainResult
from tests.conftest import TEST_DEVICE

TASK = InductionTaskConfig(n_triggers=3, seq_len=12).build()
MODELS = {
    "simplified": InductionModelConfig(d_model=16),
    "simplified_mlp": InductionModelConfig(d_model=16, d_mlp=24),
    "generic_one_layer": InductionModelConfig("generic", 1, 16, 2, 32, False),
    "generic_two_layers_ln": InductionModelConfig("generic", 2, 16, 4, 32, True),
}


def perturbed(section, seed):
    """Initial weights with every tensor nudged (biases, layer norms and W_Q included), so no term hides;
    a layer without MLP keeps its zero one (the section's definition)."""
    g = torch.Generator().manual_seed(seed + 100)
    w = init_weights(section, seed)
    absent = [f"blocks.{l}.mlp." for l in range(section.n_layers) if not section.mlp_in(l)]
    return {k: v if k.startswith(tuple(absent)) else v + 0.1 * torch.randn(v.shape, generator=g) for k, v in w.items()}


@pytest.mark.parametrize("name", MODELS)
def test_the_fast_forward_is_the_transformer_lens_model(name):
    section = MODELS[name].section(TASK)
    w = perturbed(section, 0)
    bridge = build_bridge(section, w, TEST_DEVICE)
    tokens = TASK.eval_set(6).tokens.to(TEST_DEVICE)
    with torch.no_grad():
        expected = bridge(tokens)  # [B, T, N]
        ours = sequence_logits({k: v[None].to(TEST_DEVICE) for k, v in w.items()}, tokens[None], section)[0]
    assert torch.allclose(ours, expected, atol=2e-5), (ours - expected).abs().max()


@pytest.mark.parametrize("name", ["simplified", "simplified_mlp"])
def test_the_simplified_training_forward_is_the_transformer_lens_model(name):
    """simplified_logits (no W_Q product, layer-1 tables, W_V W_O as one matrix) on weights in training form
    (W_Q = I, zero biases; every weight training moves nudged), a stack of two models; forward_for picks it
    there and the general forward for weights out of that form (a bias, a W_Q other than I)."""
    section = MODELS[name].section(TASK)
    ws = [init_weights(section, s) for s in (0, 1)]
    for s, w in enumerate(ws):
        g = torch.Generator().manual_seed(s + 7)
        for key in trainable_keys(section):
            w[key] = w[key] + 0.3 * torch.randn(w[key].shape, generator=g)
    stacked = {k: torch.stack([w[k] for w in ws]).to(TEST_DEVICE) for k in ws[0]}
    tokens = torch.stack([TASK.eval_set(5, seed=s).tokens for s in (0, 1)]).to(TEST_DEVICE)  # [K, B, T]
    assert forward_for(stacked, section) is simplified_logits
    with torch.no_grad():
        ours = simplified_logits(stacked, tokens, section)
        for k, w in enumerate(ws):
            expected = build_bridge(section, w, TEST_DEVICE)(tokens[k])
            assert torch.allclose(ours[k], expected, atol=2e-5), (ours[k] - expected).abs().max()
    for key, change in (("blocks.1.attn.b_V", 0.1), ("blocks.0.attn.W_Q", 0.01)):
        assert forward_for({**stacked, key: stacked[key] + change}, section) is sequence_logits, key
    assert forward_for(stacked, MODELS["generic_one_layer"].section(TASK)) is sequence_logits


@pytest.mark.parametrize("name", ["simplified_mlp", "generic_two_layers_ln"])
def test_the_fast_forwards_read_shorter_sequences_and_gelu_mlps(name):
    """T < n_ctx (the first positions' embeddings) and a GELU MLP: both forwards still equal the bridge."""
    section = replace(MODELS[name].section(TASK), act_fn="gelu")
    simplified = name.startswith("simplified")
    g = torch.Generator().manual_seed(1)  # the simplified model's MLP moved as training moves it (no biases)
    w = ({k: v + 0.3 * torch.randn(v.shape, generator=g) if k.startswith("blocks.1.mlp.W") else v
          for k, v in init_weights(section, 3).items()} if simplified else perturbed(section, 3))
    tokens = TASK.eval_set(4).tokens[:, :7].to(TEST_DEVICE)
    stacked = {k: v[None].to(TEST_DEVICE) for k, v in w.items()}
    with torch.no_grad():
        expected = build_bridge(section, w, TEST_DEVICE)(tokens)
        for forward in [sequence_logits, simplified_logits] if simplified else [sequence_logits]:
            ours = forward(stacked, tokens[None], section)[0]
            assert torch.allclose(ours, expected, atol=2e-5), (forward.__name__, (ours - expected).abs().max())


def test_a_stack_of_models_computes_each_models_own_function():
    section = MODELS["generic_two_layers_ln"].section(TASK)
    ws = [perturbed(section, s) for s in (0, 1, 2)]
    stacked = {k: torch.stack([w[k] for w in ws]) for k in ws[0]}
    tokens = torch.stack([TASK.eval_set(4, seed=s).tokens for s in (0, 1, 2)])  # [K, B, T]
    together = sequence_logits(stacked, tokens, section)
    for k, w in enumerate(ws):
        alone = sequence_logits({key: v[None] for key, v in w.items()}, tokens[k:k + 1], section)[0]
        assert torch.allclose(together[k], alone, atol=1e-6)


def test_the_simplified_model_is_the_authors():
    section = MODELS["simplified_mlp"].section(TASK)
    w = init_weights(section, 0)
    d = section.d_model
    assert torch.equal(w["blocks.0.attn.W_Q"][0], torch.eye(d)) and torch.equal(w["blocks.1.attn.W_Q"][0], torch.eye(d))
    assert not w["blocks.0.mlp.W_in"].any() and w["blocks.1.mlp.W_in"].any()  # no first MLP, a final one
    assert 0.8 < w["embed.W_E"].std() < 1.2 and w["blocks.0.attn.W_V"].abs().max() <= d ** -0.5  # N(0,1), U(+-1/sqrt d)
    assert trainable_keys(section) == ["blocks.0.attn.W_K", "blocks.1.attn.W_K", "blocks.1.attn.W_O",
                                       "blocks.1.mlp.W_in", "blocks.1.mlp.W_out"]
    assert trainable_keys(section, ("blocks.0.attn.W_K",))[0] == "blocks.1.attn.W_K"
    with pytest.raises(ValueError, match="cannot freeze 'W_K'"):
        trainable_keys(section, ("W_K",))


@pytest.mark.parametrize("kwargs, message", [
    ({"architecture": "simplified", "n_layers": 1}, "the simplified model has two layers"),
    ({"architecture": "generic", "n_layers": 3}, "n_layers must be 1 or 2"),
    ({"architecture": "generic", "d_model": 10, "n_heads": 3}, "not a multiple of n_heads"),
])
def test_bad_models_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        InductionModelConfig(**kwargs).section(TASK)


def test_a_checkpoint_loads_as_a_transformer_lens_model_with_characters(tmp_path):
    section = MODELS["generic_two_layers_ln"].section(TASK)
    w = perturbed(section, 3)
    TrainResult(TASK, section, w, {"seed": 3}, []).save(tmp_path / "ckpt")
    model, task = load(tmp_path / "ckpt", device="cpu")
    tokens = model.to_tokens("the cat sat", prepend_bos=False)
    assert model.to_str_tokens(tokens[0]) == list("the cat sat")
    logits, cache = model.run_with_cache(tokens)
    assert cache["blocks.1.attn.hook_pattern"].shape == (1, 4, 11, 11) and "blocks.1.ln2.hook_normalized" in cache
    ours = sequence_logits({k: v[None] for k, v in w.items()}, tokens[None], section)[0]
    assert torch.allclose(logits, ours, atol=2e-5) and task.to_config() == TASK.to_config()
    with pytest.raises(CheckpointError, match="this tool reads factual_recall checkpoints only"):
        load_checkpoint(tmp_path / "ckpt", kind="factual_recall")


def test_a_checkpoint_whose_model_does_not_fit_its_task_is_refused(tmp_path):
    section = MODELS["simplified"].section(InductionTaskConfig(n_triggers=3, seq_len=20).build())
    TrainResult(TASK, section, init_weights(section, 0), {}, []).save(tmp_path / "bad")
    with pytest.raises(CheckpointError, match="model.n_ctx is 20, expected 12"):
        load(tmp_path / "bad")


def test_transformer_lens_patching_runs_on_the_model():
    """TL's activation patching on the bridge: patching layer 0's resid_pre at a position is swapping that token."""
    from transformer_lens import patching

    section = MODELS["simplified"].section(TASK)
    model = build_bridge(section, perturbed(section, 5), "cpu", TASK)
    clean, corrupted = TASK.eval_set(2, seed=1).tokens, TASK.eval_set(2, seed=2).tokens
    _, cache = model.run_with_cache(clean)

    def metric(logits):
        return logits[:, -1].log_softmax(-1)[:, 0].mean()
    with torch.no_grad():
        table = patching.get_act_patch_resid_pre(model, corrupted, cache, metric)  # [layer, position]
        swapped = corrupted.clone()
        swapped[:, 3] = clean[:, 3]
        expected = metric(model(swapped))
    assert table.shape == (2, 12) and table[0, 3].item() == pytest.approx(expected.item(), abs=1e-5)


def test_the_initial_weights_are_pytorchs_defaults_and_the_generic_model_trains_all_but_biases():
    """Positions N(0, 1) like the embeddings; W_O's fan-in is all H d_h of its inputs (d), the others' d."""
    section = InductionModelConfig("generic", 2, 16, 2, 32, True).section(TASK)  # H = 2, d_h = 8
    w = init_weights(section, 0)
    assert 0.8 < w["pos_embed.W_pos"].std() < 1.2 and 0.8 < w["embed.W_E"].std() < 1.2
    for key in ("blocks.0.attn.W_O", "blocks.1.attn.W_Q", "blocks.0.mlp.W_in"):
        assert 0.2 < w[key].abs().max() <= 16 ** -0.5, key  # U(+-1/sqrt 16), not 1/sqrt 8 nor 1/sqrt 32
    assert 0.1 < w["blocks.0.mlp.W_out"].abs().max() <= 32 ** -0.5
    keys = trainable_keys(section)
    assert keys == [k for k in section.weight_shapes() if not k.split(".")[-1].startswith("b_")]
    assert "blocks.0.ln1.b" in keys and "embed.W_E" in keys and "blocks.0.attn.b_Q" not in keys
    with pytest.raises(ValueError, match=r"its weights: embed\.W_E, pos_embed\.W_pos, blocks\.0\.ln1\.w, "):
        trainable_keys(section, ("W_E",))
