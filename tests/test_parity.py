"""The trainer's fast forward equals the TransformerBridge model on the same weights."""
import pytest
import torch
import torch.nn.functional as F

from models.bridge import build_bridge
from models.cores.forward import VocabAttention, last_position_logits
from models.recall.config import ModelConfig
from models.recall.weights import init_weights, stack
from tasks.factual_recall import FactualRecallTask
from tests.conftest import TEST_DEVICE


@pytest.mark.parametrize("positional", [True, False], ids=["W_pos", "no-W_pos"])
@pytest.mark.parametrize("attn_only, options", [
    (False, {}), (True, {}),
    # linear attention: the bridge's pattern hook is replaced by the scaled scores
    (False, {"attention": "linear"}),
    (True, {"attention": "linear", "embedding": "onehot", "attention_weights": "merged", "init": "constant"}),
    # random tokens, answers on their own axes (fig5-softmax-gd)
    (True, {"readout": "direct", "attention_weights": "merged", "init": "constant"}),
    # the official code's model: b_O cancels the EOS embedding, a trained MLP input bias
    (False, {"parameterisation": "authors"}),
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
        models.append({k: v.to(TEST_DEVICE) for k, v in perturbed.items()})
    tokens = task.sample(256, torch.Generator().manual_seed(2)).tokens.to(TEST_DEVICE)
    ours = last_position_logits(stack(models), tokens.expand(2, -1, -1), attention, positional)  # [2, B, O]
    for k, w in enumerate(models):
        bridge = build_bridge(model.checkpoint_section(task), w, TEST_DEVICE)
        with torch.no_grad():
            reference = bridge(tokens)[:, -1]  # [B, O]
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
        F.cross_entropy(logits[0], batch.answers).backward()
        grads.append({k: p.grad for k, p in params.items() if k != "pos_embed.W_pos"})
    for key, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][key], atol=1e-6), key


def _full_sequence_logits(w: dict, tokens: torch.Tensor, attention: str) -> torch.Tensor:
    """Plain autograd reference, TransformerLens math on every position: one model (no K
    axis), tokens [B, T] -> last-position logits [B, O]."""
    A, M = "blocks.0.attn.", "blocks.0.mlp."
    T = tokens.shape[1]
    x = w["embed.W_E"][tokens] + w["pos_embed.W_pos"][:T]  # [B, T, d]
    q = torch.einsum("btd,hde->bthe", x, w[A + "W_Q"]) + w[A + "b_Q"]  # [B, T, H, e]
    k = torch.einsum("btd,hde->bthe", x, w[A + "W_K"]) + w[A + "b_K"]
    v = torch.einsum("btd,hde->bthe", x, w[A + "W_V"]) + w[A + "b_V"]
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / q.shape[-1] ** 0.5  # [B, H, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    if attention == "softmax":
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    else:
        pattern = scores.masked_fill(~causal, 0.0)
    z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)  # [B, T, H, e]
    resid = x + torch.einsum("bqhe,hed->bqd", z, w[A + "W_O"]) + w[A + "b_O"]  # [B, T, d]
    if M + "W_in" in w:
        resid = resid + torch.relu(resid @ w[M + "W_in"] + w[M + "b_in"]) @ w[M + "W_out"] + w[M + "b_out"]
    return (resid @ w["unembed.W_U"] + w["unembed.b_U"])[:, -1]  # [B, O]


@pytest.mark.parametrize("positional", [True, False], ids=["W_pos", "no-W_pos"])
@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_trainer_gradients_equal_autograd_of_the_full_model(attention, positional):
    """The hand-written attention backward (models.cores.forward.VocabAttention) gives every weight
    the gradient that autograd gives the plain full-sequence model (itself pinned to the
    TransformerBridge's logits here), biases and W_pos included."""
    task = FactualRecallTask(12, 4, 3, 10, 9)
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, attention=attention)
    g = torch.Generator().manual_seed(4)
    w = {k: (v + 0.3 * torch.randn(v.shape, generator=g)).double().to(TEST_DEVICE)
         for k, v in init_weights(model, task, 0).items()}
    if not positional:
        w["pos_embed.W_pos"].zero_()
    batch = task.sample(128, torch.Generator().manual_seed(5))
    fast_gradients_equal_autograd(model, task, w, batch, attention, positional)


def fast_gradients_equal_autograd(model, task, w, batch, attention, positional, reference=None) -> dict:
    """Check that the plain full-sequence model of weights `w` (float64; `reference(w, tokens, attention)`,
    default this file's one-layer form) gives the TransformerBridge's last-position logits, and that the
    trainer's fast forward gives every weight autograd's gradient of it (the W_pos tables skipped where
    they are zero); return those gradients."""
    full = reference or _full_sequence_logits
    tokens, answers = batch.tokens.to(TEST_DEVICE), batch.answers.to(TEST_DEVICE)
    with torch.no_grad():
        bridge = build_bridge(model.checkpoint_section(task), {k: v.float() for k, v in w.items()}, TEST_DEVICE)
        torch.testing.assert_close(full(w, tokens, attention).float(), bridge(tokens)[:, -1], rtol=1e-4, atol=1e-4)
    grads = []
    for logits_of in (lambda p: last_position_logits({k: t[None] for k, t in p.items()}, tokens[None],
                                                     attention, positional)[0],
                      lambda p: full(p, tokens, attention)):
        params = {k: t.clone().requires_grad_() for k, t in w.items()}
        F.cross_entropy(logits_of(params), answers).backward()
        grads.append({k: p.grad for k, p in params.items()})
    for key, reference in grads[1].items():
        ours = grads[0][key]
        if not positional and key == "pos_embed.W_pos":
            continue  # the fast forward skips the zero position tables: no gradient for them
        assert ours is not None, key
        torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-11, msg=key)
    return grads[1]


def _reference_attention(q, key, value, tokens, score_pos, linear):
    """VocabAttention by one-hot gathers and autograd: q [K, H, e, B], tables [K, H, e, V]."""
    onehot = F.one_hot(tokens, key.shape[-1]).to(q.dtype)  # [K, B, T, V]
    key_at = torch.einsum("khev,kbtv->khbte", key, onehot)  # [K, H, B, T, e]
    value_at = torch.einsum("khev,kbtv->khbte", value, onehot)
    scores = torch.einsum("kheb,khbte->khbt", q, key_at)
    if score_pos is not None:
        scores = scores + score_pos
    pattern = scores if linear else scores.softmax(-1)
    return torch.einsum("khbt,khbte->kheb", pattern, value_at), pattern


@pytest.mark.parametrize("linear", [False, True], ids=["softmax", "linear"])
@pytest.mark.parametrize("positional", [False, True], ids=["no-positions", "positions"])
@pytest.mark.parametrize("outputs", ["z", "pattern", "both"])
def test_vocab_attention_backward_equals_autograd(linear, positional, outputs):
    K, H, e, B, V, T = 2, 3, 4, 6, 7, 5
    g = torch.Generator().manual_seed(6)
    q, key, value = (torch.randn(shape, generator=g, dtype=torch.double).to(TEST_DEVICE)
                     for shape in ((K, H, e, B), (K, H, e, V), (K, H, e, V)))
    score_pos = torch.randn(K, H, B, T, generator=g, dtype=torch.double).to(TEST_DEVICE) if positional else None
    tokens = torch.randint(0, V, (K, B, T), generator=g).to(TEST_DEVICE)  # repeats: the scatter must add them up
    d_z = torch.randn(K, H, e, B, generator=g, dtype=torch.double).to(TEST_DEVICE)
    d_pattern = torch.randn(K, H, B, T, generator=g, dtype=torch.double).to(TEST_DEVICE)
    grads = []
    for attend in (lambda *a: VocabAttention.apply(*a[:3], tokens[:, None].expand(K, H, B, T), a[3], linear),
                   lambda *a: _reference_attention(*a[:3], tokens, a[3], linear)):
        inputs = [t.clone().requires_grad_() for t in (q, key, value)] + [
            None if score_pos is None else score_pos.clone().requires_grad_()]
        z, pattern = attend(*inputs)
        loss = ((z * d_z).sum() if outputs != "pattern" else 0) + ((pattern * d_pattern).sum() if outputs != "z" else 0)
        loss.backward()
        grads.append([None if t is None else t.grad for t in inputs])
    for name, ours, reference in zip(("q", "key", "value", "score_pos"), *grads):
        if reference is None:  # score_pos absent, or the value table when only the pattern is used
            assert ours is None or not ours.abs().any(), name
            continue
        torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12, msg=name)


def test_vocab_attention_backward_runs_once():
    """Its backward reuses the forward's [B, V] buffer, so a second one must refuse loudly."""
    q, key, value = torch.randn(1, 2, 3, 4, requires_grad=True), torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 5)
    index = torch.randint(0, 5, (1, 1, 4, 6)).expand(1, 2, 4, 6)
    z, _ = VocabAttention.apply(q, key, value, index, None, False)
    z.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once per forward"):
        z.sum().backward()
