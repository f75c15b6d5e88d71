"""The induction instruments against their definitions, on a model with every weight and bias nudged
(two layers of two heads, MLPs): each probe equals its formula written out here term by term (biases,
layers, the tokens it ranges over), each head score its sum over the attention pattern, and each
variant of knowledge_location the measures of a model whose weights carry that variant (the MLP's
output zero, W_out truncated by SVD, the head's W_O zero), so a term dropped, a sign turned or a
mask moved fails here."""
from dataclasses import replace

import pytest
import torch

from models.bridge import build_bridge
from models.induction.config import InductionModelConfig, InductionTaskConfig
from models.induction.construction import TARGETS
from models.induction.weights import init_weights
from probe.induction import clean_batch, head_scores, in_context_scores, knowledge_location, memory_recall

FIXED = InductionTaskConfig(n_triggers=3, seq_len=12).build()
RANDOM = InductionTaskConfig(n_triggers=3, seq_len=12, triggers="random").build()
HELD_OUT = InductionTaskConfig(n_triggers=3, seq_len=12, held_out_outputs=True).build()
SECTION = InductionModelConfig("generic", 2, 16, 2, 32, False).section(FIXED)


def nudged(section, seed=0) -> dict:
    """Initial weights with every tensor moved, the biases by N(0, 1): no term of a probe hides; the
    second layer's OV partly a copying memory sum_k e_k u_k^T (so wo1 is neither 0 nor 1)."""
    g = torch.Generator().manual_seed(seed + 50)
    w = init_weights(section, seed)
    w = {k: v + (1.0 if k.split(".")[-1].startswith("b") else 0.2) * torch.randn(v.shape, generator=g)
         for k, v in w.items()}
    copy = 0.5 * w["embed.W_E"].T @ w["unembed.W_U"].T  # [d, d]
    for h in range(section.n_heads):
        w["blocks.1.attn.W_O"][h] += torch.linalg.pinv(w["blocks.1.attn.W_V"][h]) @ copy
    return w


def recall(scores: torch.Tensor) -> float:
    """Share of rows i of scores [M, M'] whose largest entry is column i."""
    return sum(int(scores[i].argmax()) == i for i in range(len(scores))) / len(scores)


def expected_probes(w: dict, task, act) -> dict:
    """The authors' probes written out per head from the weights (HookedTransformer keys)."""
    E, P, U, b_U = w["embed.W_E"], w["pos_embed.W_pos"], w["unembed.W_U"], w["unembed.b_U"]
    a0, a1 = "blocks.0.attn.", "blocks.1.attn."
    keys = task.fixed_triggers if task.triggers == "fixed" else torch.arange(task.n_tokens)
    remapped = sum(E[keys] @ w[a0 + "W_V"][h] @ w[a0 + "W_O"][h] for h in range(2))
    found = {}
    for h in range(2):
        q = torch.stack([P[t] @ w[a0 + "W_Q"][h] + w[a0 + "b_Q"][h] for t in range(1, len(P))])
        k = torch.stack([P[t - 1] @ w[a0 + "W_K"][h] + w[a0 + "b_K"][h] for t in range(1, len(P))])
        found[("wk0", 0, h)] = recall(q @ k.T)
        q = E[keys] @ w[a1 + "W_Q"][h] + w[a1 + "b_Q"][h]
        found[("wk1", 1, h)] = recall(q @ (remapped @ w[a1 + "W_K"][h] + w[a1 + "b_K"][h]).T)
        logits = E @ w[a1 + "W_V"][h] @ w[a1 + "W_O"][h] @ U + b_U  # [N, N]: row k, the logits of u_j
        found[("wo1", 1, h)] = recall(logits[:task.n_train_outputs])
    used = [i for i in range(task.n_tokens) if i not in task.fixed_triggers.tolist()]
    m = "blocks.1.mlp."
    kl = []
    for i in used:
        out = act(E[i] @ w[m + "W_in"] + w[m + "b_in"]) @ w[m + "W_out"] + w[m + "b_out"]
        log_p = torch.log_softmax(out @ U + b_U, 0)
        pi = task.conditionals[i]
        seen = pi > 0
        kl.append(float((pi[seen] * (pi[seen].log() - log_p[seen])).sum()))
    found[("ff1", 1, None)] = sum(kl) / len(kl)
    return found


@pytest.mark.parametrize("task, act_fn", [(FIXED, "relu"), (RANDOM, "gelu")])
def test_memory_recall_is_the_authors_probes_written_out(task, act_fn):
    section = replace(SECTION, act_fn=act_fn)
    w = nudged(section)
    table = memory_recall(build_bridge(section, w, "cpu", task), task)
    assert list(table.columns) == ["probe", "layer", "head", "value", "measures"]
    found = {(r.probe, r.layer, None if r.probe == "ff1" else r.head): r.value for r in table.itertuples()}
    act = torch.relu if act_fn == "relu" else torch.nn.functional.gelu
    expected = expected_probes(w, task, act)
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert 0 < expected[("wk0", 0, 0)] < 1 and 0 < expected[("wo1", 1, 1)] < 1  # neither trivial
    assert dict(zip(table.probe, table.measures)) == {
        "wk0": "W_KQ^1: position t's query ranks position t-1 first",
        "wk1": "W_KQ^2: trigger k's query ranks its remapped key first",
        "wo1": "W_OV^2: u_k^T W_OV^2 e_k ranks k first",
        "ff1": "final MLP: KL(pi_b(.|k) || its prediction on e_k), nats"}


def test_the_early_positions_probe_needs_more_than_64_positions():
    task = InductionTaskConfig(n_triggers=3, seq_len=64).build()
    section = InductionModelConfig(d_model=16).section(task)
    assert "wk0_64" not in set(memory_recall(build_bridge(section, init_weights(section, 0), "cpu", task), task).probe)
    longer = InductionTaskConfig(n_triggers=3, seq_len=80).build()
    section = InductionModelConfig(d_model=16).section(longer)
    w = nudged(section)
    table = memory_recall(build_bridge(section, w, "cpu", longer), longer).set_index("probe")
    P, W_Q, W_K = w["pos_embed.W_pos"], w["blocks.0.attn.W_Q"][0], w["blocks.0.attn.W_K"][0]
    q = torch.stack([P[t] @ W_Q + w["blocks.0.attn.b_Q"][0] for t in range(1, 64)])
    k = torch.stack([P[t - 1] @ W_K + w["blocks.0.attn.b_K"][0] for t in range(1, 64)])
    assert table.loc["wk0_64", "value"] == pytest.approx(recall(q @ k.T)) and table.loc["wk0_64", "layer"] == 0


def expected_head_scores(pattern: torch.Tensor, batch) -> list[tuple[float, float]]:
    """Per head of one layer's pattern [B, H, T, T]: (mean of pattern[t, t-1] over t >= 1, mean over
    in-context queries of the attention on keys s >= 1 whose previous token is the query's token)."""
    B, H, T, _ = pattern.shape
    out = []
    for h in range(H):
        previous = [float(pattern[b, h, t, t - 1]) for b in range(B) for t in range(1, T)]
        induction = [sum(float(pattern[b, h, t, s]) for s in range(1, T)
                         if batch.tokens[b, s - 1] == batch.tokens[b, t])
                     for b in range(B) for t in range(T) if batch.counts[b, t] >= 2]
        out.append((sum(previous) / len(previous), sum(induction) / len(induction)))
    return out


def test_head_scores_are_their_sums_over_the_pattern_of_the_batch_given():
    model = build_bridge(SECTION, nudged(SECTION), "cpu", FIXED)
    batch = FIXED.eval_set(5, seed=7)
    table = head_scores(model, FIXED, batch)
    with torch.inference_mode():
        _, cache = model.run_with_cache(batch.tokens)
    for layer in (0, 1):
        for h, (previous, induction) in enumerate(expected_head_scores(cache[f"blocks.{layer}.attn.hook_pattern"],
                                                                       batch)):
            row = table[(table.layer == layer) & (table["head"] == h)].iloc[0]
            assert row.previous_token == pytest.approx(previous, abs=1e-5), (layer, h)
            assert row.induction == pytest.approx(induction, abs=1e-5), (layer, h)


def measures(logits: torch.Tensor, batch, pi_b: torch.Tensor) -> dict:
    """knowledge_location's columns from a model's logits [B, T, N], written out."""
    in_context, bigram = batch.counts >= 2, batch.counts == 0
    top = pi_b.argmax(-1)[batch.tokens]
    differ = in_context & (top != batch.targets)
    pred, log_p = logits.argmax(-1), logits.log_softmax(-1)
    pi = pi_b[batch.tokens[bigram]]  # [P, N]
    kl = torch.where(pi > 0, pi * (pi.log() - log_p[bigram]), torch.zeros(())).sum(-1).mean()
    return {"in_context_accuracy": (pred == batch.targets)[in_context].float().mean().item(),
            "in_context": (pred == batch.targets)[differ].float().mean().item(),
            "global": (pred == top)[differ].float().mean().item(),
            "bigram_loss": -log_p.gather(-1, batch.targets[..., None])[..., 0][bigram].mean().item(),
            "bigram_kl": kl.item()}


def test_each_variant_of_knowledge_location_is_a_model_with_those_weights():
    w = nudged(SECTION)
    model = build_bridge(SECTION, w, "cpu", FIXED)
    batch = FIXED.eval_set(40, seed=3)
    table = knowledge_location(model, FIXED, batch, ranks=(2,), induction_head=(1, 1))
    assert table.index.tolist() == ["clean", "mlp_ablated", "mlp_rank_2", "head_1.1_ablated"]
    assert list(table.columns) == ["in_context_accuracy", "in_context", "global", "bigram_loss", "bigram_kl"]
    U, S, Vh = torch.linalg.svd(w["blocks.1.mlp.W_out"], full_matrices=False)
    head = w["blocks.1.attn.W_O"].clone()
    head[1] = 0.0  # the head writes nothing: its z zero
    variants = {"clean": w,
                "mlp_ablated": {**w, "blocks.1.mlp.W_out": torch.zeros_like(U @ torch.diag(S) @ Vh),
                                "blocks.1.mlp.b_out": torch.zeros(16)},
                "mlp_rank_2": {**w, "blocks.1.mlp.W_out": (U[:, :2] * S[:2]) @ Vh[:2]},
                "head_1.1_ablated": {**w, "blocks.1.attn.W_O": head}}
    for name, weights in variants.items():
        with torch.inference_mode():
            logits = build_bridge(SECTION, weights, "cpu", FIXED)(batch.tokens)
        for column, value in measures(logits, batch, FIXED.conditionals).items():
            assert table.loc[name, column] == pytest.approx(value, abs=1e-4), (name, column)
    assert table.loc["clean", "bigram_kl"] != pytest.approx(table.loc["mlp_ablated", "bigram_kl"], abs=1e-2)


def test_in_context_scores_count_the_positions_of_the_sequences_asked_for():
    model = build_bridge(SECTION, nudged(SECTION, 1), "cpu", HELD_OUT)
    table = in_context_scores(model, HELD_OUT, n=6)
    assert table.index.tolist() == ["in_context", "first_output", "bigram",
                                    "ood_in_context", "ood_first_output", "ood_bigram"]
    assert table.n.iloc[:3].sum() == 6 * 12 and table.n.iloc[3:].sum() == 6 * 12
    given = clean_batch(model, HELD_OUT, 4, seed=11)
    assert in_context_scores(model, HELD_OUT, given, ood=True).n.iloc[3:].sum() == 4 * 12


def test_the_instruments_measure_the_batch_given_or_draw_their_default_one(monkeypatch):
    """Each instrument draws its held-out sequences once (256; head_scores 64, or n when asked) and none
    when a batch is given: knowledge_location finds its induction head on the batch it measures."""
    import probe.induction as instruments
    model = build_bridge(SECTION, nudged(SECTION, 2), "cpu", FIXED)
    assert len(clean_batch(model, FIXED)) == 256
    drawn, draw = [], instruments.clean_batch

    def spy(model, task, n, *args, **kwargs):
        drawn.append(n)
        return draw(model, task, n, *args, **kwargs)
    monkeypatch.setattr(instruments, "clean_batch", spy)
    for instrument, kwargs, sizes in ((in_context_scores, {}, [256]), (head_scores, {}, [64]),
                                      (knowledge_location, {}, [256]), (knowledge_location, {"n": 8}, [8]),
                                      (knowledge_location, {"batch": FIXED.eval_set(8, seed=5)}, [])):
        drawn.clear()
        instrument(model, FIXED, **kwargs)
        assert drawn == sizes, (instrument.__name__, kwargs, drawn)


def test_the_early_positions_probe_ranks_the_keys_of_the_first_64_positions_only():
    """With orthonormal positions and a previous-token memory, wk0_64 is 1 although the key of position 63
    outscores position t-1's for the queries t = 1..5: position 63 is no key of the first 64 queries."""
    task = InductionTaskConfig(n_triggers=3, seq_len=96).build()
    section = InductionModelConfig(d_model=128).section(task)
    w = init_weights(section, 0)
    P = torch.linalg.qr(torch.randn(128, 128, generator=torch.Generator().manual_seed(0)))[0][:96]  # [T, d]
    W_KQ = 80.0 * P[:95].T @ P[1:] + 200.0 * P[63][:, None] @ P[1:6].sum(0)[None]  # [d, d] keys t-1; 63 for t <= 5
    model = build_bridge(section, {**w, "pos_embed.W_pos": P, TARGETS[0]: W_KQ[None]}, "cpu", task)
    found = memory_recall(model, task).set_index("probe").value
    assert found["wk0_64"] == 1.0 and found["wk0"] == pytest.approx(90 / 95)
