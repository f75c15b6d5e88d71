"""The trainer's fast forward equals the TransformerBridge model on the same weights."""
import pytest
import torch

from models.bridge import build_bridge
from models.config import ModelConfig
from models.forward import last_position_logits
from models.weights import init_weights, stack
from probe.task import FactualRecallTask


@pytest.mark.parametrize("positional", [True, False], ids=["W_pos", "no-W_pos"])
@pytest.mark.parametrize("attn_only, options", [
    (False, {}), (True, {}),
    # linear attention: the bridge's pattern hook is replaced by the scaled scores
    (False, {"attention": "linear"}),
    (True, {"attention": "linear", "embedding": "onehot", "attention_weights": "merged", "init": "constant"}),
])
def test_last_position_logits_match_transformer_bridge(attn_only, options, positional):
    task = FactualRecallTask(12, 4, 3, 10, 9)
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, attn_only=attn_only, **options)
    attention = model.attention
    g = torch.Generator().manual_seed(1)
    models = []
    for seed in (0, 1):
        w = init_weights(model, task, seed)
        # perturb everything, biases and positional embedding included, so every term is tested
        perturbed = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in w.items()}
        if not positional:  # our models: W_pos zero, so the forward skips the position tables
            perturbed["pos_embed.W_pos"].zero_()
        models.append(perturbed)
    batch = task.sample(256, torch.Generator().manual_seed(2))
    ours = last_position_logits(stack(models), batch.tokens.expand(2, -1, -1), attention, positional)  # [2, B, O]
    for k, w in enumerate(models):
        bridge = build_bridge(model.checkpoint_section(task), w)
        with torch.no_grad():
            reference = bridge(batch.tokens)[:, -1]  # [B, O]
        assert reference.shape == ours[k].shape
        assert (reference - ours[k]).abs().max().item() <= 1e-5 * max(1.0, reference.abs().max().item())


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_gradients_without_position_tables_equal_those_with_them(attention):
    """With W_pos zero, skipping the position tables changes no gradient."""
    task = FactualRecallTask(12, 4, 3, 10, 9)
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, attention=attention)
    w = stack([init_weights(model, task, 0)])
    batch = task.sample(64, torch.Generator().manual_seed(3))
    grads = []
    for positional in (False, True):
        params = {k: v.clone().requires_grad_() for k, v in w.items()}
        logits = last_position_logits(params, batch.tokens[None], attention, positional)
        torch.nn.functional.cross_entropy(logits[0], batch.answers).backward()
        grads.append({k: p.grad for k, p in params.items() if k != "pos_embed.W_pos"})
    for key, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][key], atol=1e-6), key
