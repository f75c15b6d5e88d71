"""Hook names of the one-layer TransformerBridge, the clean run the instruments read, and
chunked last-position runners.

Every instrument reads or edits activations through these hooks; only the last position
(EOS) is read, because the task is scored there.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

HOOK_RESID_PRE = "blocks.0.hook_resid_pre"  # [batch, pos, d_model] embedding (+ position)
HOOK_Z = "blocks.0.attn.hook_z"  # [batch, pos, head, d_head] per-head mix of values
HOOK_PATTERN = "blocks.0.attn.hook_pattern"  # [batch, head, query, key]
HOOK_ATTN_OUT = "blocks.0.hook_attn_out"  # [batch, pos, d_model] all heads + b_O
HOOK_MLP_OUT = "blocks.0.hook_mlp_out"  # [batch, pos, d_model]
HOOK_MLP_POST = "blocks.0.mlp.hook_post"  # [batch, pos, d_mlp] the MLP's hidden units after the nonlinearity
HOOK_RESID_MID = "blocks.0.hook_resid_mid"  # [batch, pos, d_model] embedding + attention
HOOK_RESID_POST = "blocks.0.hook_resid_post"  # [batch, pos, d_model] what the unembedding reads

Hook = tuple[str, Callable]
PROMPTS_PER_RUN = 256  # prompts per forward: the bridge's [batch, head, T, T] tensors stay in cache


def has_mlp(model) -> bool:
    return not model.cfg.attn_only


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def hooked_last_logits(model, tokens: torch.Tensor, fwd_hooks: Sequence[Hook] = (),
                       chunk: int = PROMPTS_PER_RUN) -> torch.Tensor:
    """Logits at the last position [n, d_vocab_out] of `model` run with `fwd_hooks`, in chunks."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(tokens), chunk):
            out.append(model.run_with_hooks(tokens[start:start + chunk], fwd_hooks=list(fwd_hooks))[:, -1])
    return torch.cat(out)


def set_last(value: torch.Tensor | float, head: int | None = None) -> Callable:
    """A hook that overwrites the last position (of one head, on hook_z) with `value`: 0
    for zero-ablation, a mean for mean-ablation, one value per prompt for patching."""
    target = (slice(None), -1) if head is None else (slice(None), -1, head)

    def hook(x, hook):
        x = x.clone()
        x[target] = value
        return x
    return hook


@dataclass(frozen=True, eq=False)
class CleanRun:
    """One run of a model on `tokens` without hooks, read at the last position. Built by
    `clean_run` once per (model, prompts) and passed to the instruments that read it (for
    the fact prompts, inside probe.prompts.FactPrompts); it
    holds tensors, not the model, so after the weights change it is stale: build a new one."""
    tokens: torch.Tensor  # [n, T] the prompts it was computed on
    logits: torch.Tensor  # [n, O]
    head_results: torch.Tensor  # [n, head, d] each head's write (ActivationCache.stack_head_results)
    mlp_out: torch.Tensor  # [n, d] zeros without an MLP
    attn_out: torch.Tensor  # [n, d] all heads + b_O
    z: torch.Tensor  # [n, head, d_head]
    pattern: torch.Tensor  # [n, head, key] the EOS query's attention
    resid_pre: torch.Tensor  # [n, d] the residual input (embedding + position)


def clean_run(model, tokens: torch.Tensor, chunk: int = PROMPTS_PER_RUN) -> CleanRun:
    """The CleanRun of `model` on `tokens` [n, T], computed in chunks of `chunk` prompts."""
    # every block's z: stack_head_results reads them all (at depth: [n, L * head, d], block 0's first)
    names = {HOOK_Z, HOOK_PATTERN, HOOK_ATTN_OUT, HOOK_MLP_OUT, HOOK_RESID_PRE,
             *(f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers))}
    parts: dict[str, list] = {k: [] for k in ("logits", "head_results", "mlp_out", "attn_out", "z", "pattern",
                                              "resid_pre")}
    with torch.inference_mode():
        for start in range(0, len(tokens), chunk):
            logits, cache = model.run_with_cache(tokens[start:start + chunk], names_filter=lambda n: n in names)
            parts["logits"].append(logits[:, -1])
            parts["head_results"].append(cache.stack_head_results(layer=-1, pos_slice=-1).transpose(0, 1))
            attn_out = cache[HOOK_ATTN_OUT][:, -1]
            parts["attn_out"].append(attn_out)
            parts["mlp_out"].append(cache[HOOK_MLP_OUT][:, -1] if has_mlp(model) else torch.zeros_like(attn_out))
            parts["z"].append(cache[HOOK_Z][:, -1])
            parts["pattern"].append(cache[HOOK_PATTERN][:, :, -1])
            parts["resid_pre"].append(cache[HOOK_RESID_PRE][:, -1])
    return CleanRun(tokens, **{k: torch.cat(v) for k, v in parts.items()})


def rerun_last_position(model, run: CleanRun, fwd_hooks: Sequence[Hook] = ()) -> torch.Tensor:
    """Logits [n, d_vocab_out] of `model` at the last position of the prompts of `run`,
    run again with `fwd_hooks`, which may edit the last position only (ablations,
    patching, path swaps).

    In one layer nothing at the last position reads another position except the heads'
    z, so the model runs on one position: its residual input and every head's z are set to
    the cached values through hook_resid_pre and hook_z, then `fwd_hooks` run, and the
    model computes the rest (W_O, MLP, unembedding) itself. T times less work than
    hooked_last_logits on the full prompts, and the same logits (tests/test_probe_hooks.py)."""
    restore = [(HOOK_RESID_PRE, lambda x, hook: run.resid_pre[:, None].to(x.dtype)),
               (HOOK_Z, lambda x, hook: run.z[:, None].to(x.dtype))]
    with torch.inference_mode():
        eos = run.tokens[:, -1:]  # [n, 1]
        return model.run_with_hooks(eos, fwd_hooks=restore + list(fwd_hooks))[:, -1]
