"""The analysis model: a TransformerLens 4 TransformerBridge built from checkpoint weights
(`build_bridge`), or loaded from a checkpoint of any model family (`load`).

Analyses read activations through its hooks (`blocks.0.attn.hook_pattern`,
`blocks.0.hook_mlp_out`, ...) with run_with_cache / run_with_hooks. TransformerLens has
no linear attention: for `"attention": "linear"` checkpoints, permanent hooks replace the
softmax pattern with the scaled scores q.k/sqrt(d_head) (causally masked), so every hook
name and every instrument stays the same.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from models.answer_calls import attach_answer_calls
from models.checkpoint import load_checkpoint
from models.section import InductionSection, ModelSection
from models.text import count


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' -> CUDA when present, else CPU; a named device must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but this machine has no CUDA GPU.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} asked for, but this machine has "
                             f"{count(torch.cuda.device_count(), 'CUDA device')}.")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r} is not supported; use auto, cpu, cuda or cuda:N.")
    return dev


def bridge_config(section: ModelSection):
    """TransformerBridgeConfig from a model section (`attention` left out)."""
    from transformer_lens.config import TransformerBridgeConfig

    return TransformerBridgeConfig(
        n_layers=section.n_layers, d_model=section.d_model, n_heads=section.n_heads, d_head=section.d_head,
        d_mlp=None if section.attn_only else section.d_mlp, d_vocab=section.d_vocab,
        d_vocab_out=section.d_vocab_out, n_ctx=section.n_ctx, act_fn=section.act_fn,
        normalization_type=None, attn_only=section.attn_only,
        init_weights=False, positional_embedding_type="standard")


def build_bridge(section: ModelSection, weights: dict[str, torch.Tensor], device: str | torch.device = "cpu",
                 task=None):
    """A TransformerBridge holding `weights` (HookedTransformer-format keys), in eval mode,
    its parameters with gradients on as TransformerLens gives them (the toolkit's instruments
    run without gradients: under torch.inference_mode or torch.no_grad); with `task`, its
    vocabulary as the tokenizer (models.tokenizer: to_tokens, to_str_tokens), and
    return_type="loss" and `generate` in its answer vocabulary (models.answer_calls)."""
    import transformer_lens.model_bridge.sources.native  # noqa: F401  (registers boot_native)
    from transformer_lens.model_bridge import TransformerBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = section.bridge_config() if isinstance(section, InductionSection) else bridge_config(section)
        model = TransformerBridge.boot_native(config, device=torch.device(device))
    load_weights(model, weights)
    model.eval()
    if section.attention == "linear":
        _make_attention_linear(model)
    if task is not None:
        from models.tokenizer import attach_tokenizer  # imports transformers: only where a bridge is built

        attach_tokenizer(model, task)
        attach_answer_calls(model, task)
    return model


def load_weights(bridge, weights: dict[str, torch.Tensor]) -> None:
    """Put HookedTransformer-format `weights` (a snapshot, say) into an existing bridge."""
    from transformer_lens.utilities.tl_checkpoint_conversion import (
        convert_tl_checkpoint,
    )

    device = next(bridge.parameters()).device
    state = convert_tl_checkpoint(weights, bridge.cfg)
    with torch.no_grad():
        bridge.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=True)


def _make_attention_linear(bridge) -> None:
    """Permanent hooks: every layer's hook_pattern returns the scaled scores q.k/sqrt(d_head),
    zero above the diagonal (the checkpoint format's linear attention), in place of the softmax."""
    scale = bridge.cfg.d_head ** -0.5
    for layer in range(bridge.cfg.n_layers):
        stash = {}

        def keep(name, stash=stash):
            def hook(x, hook):
                stash[name] = x  # [batch, pos, head, d_head]
            return hook

        def linear_pattern(pattern, hook, stash=stash):
            scores = torch.einsum("bqhe,bkhe->bhqk", stash["q"], stash["k"]) * scale  # [batch, head, q, k]
            causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
            return scores.masked_fill(~causal, 0.0)

        bridge.add_hook(f"blocks.{layer}.attn.hook_q", keep("q"), is_permanent=True)
        bridge.add_hook(f"blocks.{layer}.attn.hook_k", keep("k"), is_permanent=True)
        bridge.add_hook(f"blocks.{layer}.attn.hook_pattern", linear_pattern, is_permanent=True)


def load(ckpt: str | Path, device: str = "auto", step: int | None = None, kind: str | None = None):
    """(TransformerBridge, task) for a checkpoint directory of any task kind (final weights,
    or snapshot `step`), ready for run_with_cache / run_with_hooks. With `kind` (a tool that
    reads one kind only), a checkpoint of another kind is refused with a CheckpointError.
    The model carries the task's tokenizer: `model.to_str_tokens(tokens)` names S3, R1, n17, EOS."""
    checkpoint = load_checkpoint(ckpt, step, kind)
    task = checkpoint.task
    return build_bridge(checkpoint.section, checkpoint.weights, resolve_device(device), task), task
