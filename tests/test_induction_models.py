"""The induction family's models: the fast forward equals the TransformerLens model on the same
weights (every architecture), a stack of K models computes each model's own function, the
simplified model's frozen weights are the authors', and a checkpoint opens as a TransformerBridge
whose strings are characters."""
import pytest
import torch

from models import load
from models.bridge import build_bridge
from models.checkpoint import CheckpointError, load_checkpoint
from models.induction.config import InductionModelConfig, InductionTaskConfig
from models.induction.forward import sequence_logits
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
