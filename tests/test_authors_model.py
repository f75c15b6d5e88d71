"""The authors' parameterisation is the official code's model (`model.py` `TF_one_layer`).

An independent transcription of its equations, with its own names and its own init, is the
reference: from the same weights the TransformerLens model and the trainer's forward give its
logits, and our initialisation matches its distributions.
"""
import math

import pytest
import torch

from models.bridge import build_bridge
from models.cores.forward import last_position_logits
from models.recall.config import ModelConfig, shape_model
from models.recall.weights import init_weights, stack, trainable_keys
from models.section import ATTN, MLP
from tasks.factual_recall import FactualRecallTask


def tf_one_layer(p: dict, tokens: torch.Tensor) -> torch.Tensor:
    """The official TF_one_layer's logits (before its final softmax) [B, O], in its names:
    Q, K, V [H, d, d_h], O [H d_h, d], wte [V, d], unembed [O, d], layer1 (kernel [d, m],
    bias [m]), layer2 (kernel [m, d], no bias). The query is the last token's embedding."""
    x = p["wte"][tokens]  # [B, T, d]
    d_h = p["Q"].shape[-1]
    heads = []
    for Q, K, V in zip(p["Q"], p["K"], p["V"]):
        scores = torch.einsum("bij,jk,bk->bi", x, K @ Q.T, x[:, -1])  # [B, T]
        attn = torch.softmax(scores / math.sqrt(d_h), -1)
        heads.append(torch.einsum("bij,bi->bj", x @ V, attn))  # [B, d_h]
    x = torch.cat(heads, -1) @ p["O"]  # [B, d]: the MLP reads the attention output alone
    if "layer1.kernel" in p:
        z = torch.relu(x @ p["layer1.kernel"] + p["layer1.bias"]) @ p["layer2.kernel"]
        x = z + x
    return x @ p["unembed"].T


def authors_init(task: FactualRecallTask, d: int, H: int, d_h: int, m: int, g: torch.Generator) -> dict:
    """TF_one_layer's initial parameters, drawn as flax draws them."""
    def lecun(n_in, n_out):  # variance_scaling(1, fan_in, truncated_normal)
        std = 1 / math.sqrt(n_in) / 0.87962566103423978
        return torch.nn.init.trunc_normal_(torch.empty(n_in, n_out), std=std, a=-2 * std, b=2 * std, generator=g)
    return {"Q": torch.randn(H, d, d_h, generator=g) / math.sqrt(d_h),
            "K": torch.randn(H, d, d_h, generator=g) / math.sqrt(d_h),
            "V": torch.randn(H, d, d_h, generator=g) / math.sqrt(d_h),
            "O": torch.randn(H * d_h, d, generator=g) / math.sqrt(d),
            "wte": torch.randn(task.d_vocab, d, generator=g) / math.sqrt(d),
            "unembed": torch.randn(task.d_vocab_out, d, generator=g) / math.sqrt(d),
            "layer1.kernel": lecun(d, m), "layer1.bias": torch.zeros(m), "layer2.kernel": lecun(m, d)}


def as_authors(w: dict) -> dict:
    """Our checkpoint weights in TF_one_layer's names."""
    H, _, d_h = w[ATTN + "W_Q"].shape
    p = {"Q": w[ATTN + "W_Q"], "K": w[ATTN + "W_K"], "V": w[ATTN + "W_V"],
         "O": w[ATTN + "W_O"].reshape(H * d_h, -1), "wte": w["embed.W_E"], "unembed": w["unembed.W_U"].T}
    if MLP + "W_in" in w:
        p.update({"layer1.kernel": w[MLP + "W_in"], "layer1.bias": w[MLP + "b_in"], "layer2.kernel": w[MLP + "W_out"]})
    return p


def trained_like(model: ModelConfig, task: FactualRecallTask, seed: int) -> dict:
    """Our initial weights with every trainable tensor moved (as training would), the frozen
    ones (embeddings, b_O) left as they are."""
    w = init_weights(model, task, seed)
    g = torch.Generator().manual_seed(seed + 100)
    for key in trainable_keys(w, model):
        w[key] = w[key] + 0.3 * torch.randn(w[key].shape, generator=g)
    return w


@pytest.mark.parametrize("attn_only", [False, True], ids=["mlp", "attn-only"])
def test_same_logits_as_the_official_equations(attn_only):
    task = FactualRecallTask(12, 4, 3, 10, 9)
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, attn_only=attn_only, parameterisation="authors")
    tokens = task.sample(256, torch.Generator().manual_seed(2)).tokens
    weights = [trained_like(model, task, seed) for seed in (0, 1)]
    fast = last_position_logits(stack(weights), tokens.expand(2, -1, -1))  # [2, B, O]
    for k, w in enumerate(weights):
        reference = tf_one_layer(as_authors(w), tokens)  # [B, O]
        with torch.no_grad():
            bridge = build_bridge(model.checkpoint_section(task), w)(tokens)[:, -1]
        scale = max(1.0, reference.abs().max().item())
        assert (bridge - reference).abs().max().item() <= 1e-5 * scale
        assert (fast[k] - reference).abs().max().item() <= 1e-5 * scale


def test_the_standard_model_is_another_model():
    """The same trainable weights under the standard parameterisation (EOS embedding in the
    residual, b_O = 0) do not give the official logits: the test above can fail."""
    task = FactualRecallTask(12, 4, 3, 10, 9)
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, parameterisation="authors")
    w = trained_like(model, task, 0)
    tokens = task.sample(64, torch.Generator().manual_seed(2)).tokens
    standard = {**w, ATTN + "b_O": torch.zeros_like(w[ATTN + "b_O"])}
    gap = (last_position_logits(stack([standard]), tokens[None])[0] - tf_one_layer(as_authors(w), tokens)).abs()
    assert gap.max().item() > 0.1


def test_what_is_trained_and_what_is_frozen():
    task = FactualRecallTask(12, 4, 3, 10, 9)
    authors = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, parameterisation="authors")
    w = init_weights(authors, task, 0)
    assert set(trainable_keys(w, authors)) == {ATTN + k for k in ("W_Q", "W_K", "W_V", "W_O")} | {
        MLP + "W_in", MLP + "b_in", MLP + "W_out"}
    assert torch.equal(w[ATTN + "b_O"], -w["embed.W_E"][task.eos])
    assert not w[MLP + "b_in"].any() and not w[MLP + "b_out"].any()
    standard = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40)
    assert MLP + "b_in" not in trainable_keys(init_weights(standard, task, 0), standard)


def initial_statistics(p: dict, tokens: torch.Tensor) -> tuple[float, float]:
    """(std of the EOS query's pre-softmax scores, fraction of MLP units dead on every prompt)."""
    x = p["wte"][tokens]  # [B, T, d]
    d_h = p["Q"].shape[-1]
    scores = torch.einsum("bij,hjk,bk->bhi", x, p["K"] @ p["Q"].transpose(1, 2), x[:, -1]) / math.sqrt(d_h)
    heads = torch.einsum("bij,hjk,bhi->bhk", x, p["V"], torch.softmax(scores, -1)).flatten(1)  # [B, H d_h]
    pre = (heads @ p["O"]) @ p["layer1.kernel"] + p["layer1.bias"]  # [B, m]
    return scores.std().item(), (pre <= 0).all(0).float().mean().item()


def test_initial_statistics_match_the_official_init():
    """At (alpha, beta, H) = (1, 1, 8), d = 32 on the paper's task: our init and the official
    one give the same scale of attention scores and no dead MLP unit, in distribution over
    seeds; the standard parameterisation gives ~9x smaller scores and many dead units."""
    model = shape_model(1, 1, 8, 32)
    task = FactualRecallTask(24, 24, 8, 48, 32)
    tokens = task.sample(1024, torch.Generator().manual_seed(5)).tokens
    seeds = range(6)
    ours = torch.tensor([initial_statistics(as_authors(init_weights(model, task, s)), tokens) for s in seeds])
    theirs = torch.tensor([initial_statistics(authors_init(task, 32, 8, 4, 32, torch.Generator().manual_seed(s)),
                                              tokens) for s in seeds])
    assert abs(ours[:, 0].mean() / theirs[:, 0].mean() - 1) < 0.15
    assert ours[:, 1].max() <= 0.05 and theirs[:, 1].max() <= 0.05
    standard = shape_model(1, 1, 8, 32, parameterisation="standard")
    w = init_weights(standard, task, 0)
    x = w["embed.W_E"][tokens[:, -1]]
    scores_std = initial_statistics(as_authors(w), tokens)[0]
    assert scores_std < theirs[:, 0].mean() / 4
    resid = x + attention_output(w, tokens)  # the standard MLP's input: e_EOS + attention output
    dead = ((resid @ w[MLP + "W_in"]) <= 0).all(0).float().mean().item()
    assert dead > 0.2


def attention_output(w: dict, tokens: torch.Tensor) -> torch.Tensor:
    """The attention output at EOS [B, d] of our weights `w` (b_O left out): TF_one_layer with
    no MLP read through the identity."""
    p = {k: v for k, v in as_authors(w).items() if not k.startswith("layer")}
    return tf_one_layer({**p, "unembed": torch.eye(p["O"].shape[1])}, tokens)


def test_instruments_read_the_attention_output_alone():
    """On an authors' model the residual the MLP reads at EOS is the heads' writes alone
    (b_O cancels the EOS embedding); so the direct path of the logit attribution is zero, and
    zero-ablating every head leaves the MLP reading zero, as in the official model."""
    from probe.ablation import ablation_hooks
    from probe.attribution import direct_logit_attribution
    from probe.hooks import HOOK_RESID_MID

    task = FactualRecallTask(8, 4, 3, 8, 9)
    model = ModelConfig(d_model=24, n_heads=3, d_head=5, d_mlp=40, parameterisation="authors")
    bridge = build_bridge(model.checkpoint_section(task), trained_like(model, task, 0))
    tokens = task.sample(64, torch.Generator().manual_seed(2)).tokens
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens)
    heads = cache.stack_head_results(layer=-1, pos_slice=-1).sum(0)  # [B, d]
    assert torch.allclose(cache[HOOK_RESID_MID][:, -1], heads, atol=1e-5)
    dla = direct_logit_attribution(bridge, task, contexts=2)
    assert dla["direct_margin"].abs().max() < 1e-4
    assert dla["margin"].abs().max() > 0.1
    ablated = {}
    hooks = ablation_hooks(bridge, task, contexts=2)["zero_ablate_heads"]
    bridge.run_with_hooks(tokens, fwd_hooks=hooks + [(HOOK_RESID_MID, lambda x, hook: ablated.setdefault("x", x))])
    assert ablated["x"][:, -1].abs().max() < 1e-6
