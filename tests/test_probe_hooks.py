"""The instruments' one-position reruns give the logits of full-sequence runs with the same hooks."""
import pytest
import torch
from transformer_lens import patching

from models import build_bridge
from models.section import ATTN, MLP
from probe.ablation import ablation_hooks
from probe.hooks import HOOK_Z, clean_run, hooked_last_logits, rerun_last_position
from probe.patching import activation_patching, corrupted_prompts
from probe.prompts import fact_batch


def _perturbed(tiny_result) -> dict:
    """A random positional embedding and random biases for the tiny model."""
    g = torch.Generator().manual_seed(0)
    keys = ("pos_embed.W_pos", ATTN + "b_Q", ATTN + "b_K", ATTN + "b_V", ATTN + "b_O", MLP + "b_in", MLP + "b_out")
    return {key: 0.3 * torch.randn(tiny_result.weights[key].shape, generator=g) for key in keys}


@pytest.fixture(scope="module")
def model_and_task(tiny_result):
    """The trained tiny model with a random positional embedding and biases: every input
    of the last position's computation is non-trivial."""
    return build_bridge(tiny_result.section, {**tiny_result.weights, **_perturbed(tiny_result)}), tiny_result.task


def test_rerun_equals_the_full_run_under_every_ablation(model_and_task):
    model, task = model_and_task
    batch = fact_batch(task, 2, seed=0)
    run = clean_run(model, batch.tokens)
    assert torch.allclose(rerun_last_position(model, run), run.logits, atol=1e-5)
    hooks = ablation_hooks(model, task, contexts=2, seed=0)
    for name in ("mean_ablate_head1", "zero_ablate_heads", "mean_ablate_mlp", "mlp_path"):
        full = hooked_last_logits(model, batch.tokens, hooks[name])
        assert (rerun_last_position(model, run, hooks[name]) - full).abs().max() < 1e-4, name
        assert (full - run.logits).abs().max() > 1e-2, name  # the ablation does change the logits


def test_patching_matches_transformer_lens_generic_activation_patch(model_and_task):
    model, task = model_and_task
    contexts = 2
    ours = activation_patching(model, task, "subject", contexts, seed=0)
    batch = fact_batch(task, contexts, seed=0)
    tokens, rival = corrupted_prompts(task, batch, "subject", torch.Generator().manual_seed(1))

    def logit_diff(logits):
        last = logits[:, -1]
        return last.gather(-1, batch.answers[:, None])[:, 0] - last.gather(-1, rival.clamp(min=0)[:, None])[:, 0]

    with torch.inference_mode():
        clean_logits, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n == HOOK_Z)
        result = patching.generic_activation_patch(model, tokens, cache, logit_diff,
                                                   patching.layer_head_vector_patch_setter, "z",
                                                   index_axis_names=["layer", "head"], reduce="none", baseline=True)
    # [head, fact, context]
    theirs = result.normalized(logit_diff(clean_logits)).reshape(model.cfg.n_heads, -1, contexts)
    for h in range(model.cfg.n_heads):
        expected = torch.nanmean(torch.where(rival.reshape(-1, contexts) >= 0, theirs[h], float("nan")), -1)
        measured = torch.tensor(ours[f"patch_subject_head{h}"].to_numpy())
        both = ~expected.isnan() & ~measured.isnan()
        assert both.sum() > 0.9 * len(measured)
        assert torch.allclose(measured[both], expected[both].float(), atol=1e-3)


@pytest.mark.parametrize("shape", [(1024, 8), (13,), (3, 5, 2)])
def test_bootstrap_interval_is_transformer_lens_bootstrap_ci(shape):
    from transformer_lens.utilities.statistics import bootstrap_ci, derive_generator

    from probe.stats import N_RESAMPLES
    from probe.stats import bootstrap_ci as ours
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    expected = bootstrap_ci(x, dim=-1, n_resamples=N_RESAMPLES, generator=derive_generator(0, "t"))
    measured = ours(x, N_RESAMPLES, derive_generator(0, "t"))
    for a, b in zip(expected, measured):
        assert torch.allclose(a, b, atol=1e-5)


def test_memory_probe_residual_is_the_mean_residual_the_mlp_reads(model_and_task, tiny_result):
    """With uniform attention (W_Q = b_Q = 0) the idealised residual of the MLP probe is the
    expectation of the real one over contexts: positions, b_V and b_O included."""
    from probe.contexts import per_fact
    from probe.hooks import HOOK_RESID_MID
    from probe.memory import fact_attention, idealised_residual

    task = tiny_result.task
    weights = {**tiny_result.weights, **_perturbed(tiny_result)}
    weights[ATTN + "W_Q"] = torch.zeros_like(weights[ATTN + "W_Q"])
    weights[ATTN + "b_Q"] = torch.zeros_like(weights[ATTN + "b_Q"])
    uniform = build_bridge(tiny_result.section, weights)
    contexts = 64
    batch = fact_batch(task, contexts, seed=0)
    with torch.inference_mode():
        _, cache = uniform.run_with_cache(batch.tokens, names_filter=lambda n: n == HOOK_RESID_MID)
    measured = per_fact(cache[HOOK_RESID_MID][:, -1], contexts).mean(1)  # [F, d]
    ideal = idealised_residual(uniform, task, fact_attention(uniform, task, contexts))
    scale = measured.norm(dim=-1).mean()
    assert (ideal - measured).norm(dim=-1).max() < 0.05 * scale


def test_a_loaded_model_takes_a_backward_through_a_hook(tiny_ckpt):
    """models.load gives gradients as TransformerLens does: a loss through a hooked
    activation back-propagates to that activation and to the weights."""
    from models import load

    model, task = load(tiny_ckpt, device="cpu")
    batch = fact_batch(task, 1, seed=0)
    kept = {}

    def keep(z, hook):  # [batch, pos, head, d_head]
        z.retain_grad()
        kept["z"] = z
        return z

    logits = model.run_with_hooks(batch.tokens, fwd_hooks=[(HOOK_Z, keep)])[:, -1]  # [batch, answer]
    loss = torch.nn.functional.cross_entropy(logits, batch.answers)
    loss.backward()
    assert kept["z"].grad is not None and kept["z"].grad.abs().sum() > 0
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads and all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
