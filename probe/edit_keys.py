"""The pieces of a rank-one write to an associative memory (ROME, MEMIT): the keys a store
reads at the last position, their second moment C, the residual change each edited fact
needs (closed form through the unembedding) and the write that maps keys to values.

Stores, in TransformerLens's layouts (one layer):
- `mlp`: W_out [d_mlp, d_model]; key = the hidden units after the ReLU (hook_post) [d_mlp].
- `ov`, head h: W_O[h] [d_head, d_model]; key = the head's mix of values at EOS (hook_z)
  [d_head]: its value input at the token it attends to, weighted by its attention.
"""
from __future__ import annotations

import torch

from probe.contexts import per_fact
from probe.hooks import HOOK_MLP_POST, HOOK_Z, PROMPTS_PER_RUN

RIDGE = 1e-4  # C += RIDGE * mean eigenvalue * I: keys the task never sets (a unit that never fires) stay invertible


def store_keys(model, tokens: torch.Tensor, store: str, head: int | None = None) -> torch.Tensor:
    """The key a store reads at the last position of each prompt [n, d_key] (module docstring)."""
    name = HOOK_MLP_POST if store == "mlp" else HOOK_Z
    out = []
    with torch.inference_mode():
        for start in range(0, len(tokens), PROMPTS_PER_RUN):
            _, cache = model.run_with_cache(tokens[start:start + PROMPTS_PER_RUN], names_filter=lambda n: n == name)
            last = cache[name][:, -1]  # [chunk, d_mlp] or [chunk, head, d_head]
            out.append(last if store == "mlp" else last[:, head])
    return torch.cat(out).float()


def second_moment(keys: torch.Tensor, ridge: float = RIDGE) -> torch.Tensor:
    """C = E[k k^T] over the prompts [d_key, d_key], plus a ridge of `ridge` times its mean eigenvalue."""
    C = keys.T @ keys / len(keys)  # [d_key, d_key]
    scale = C.diagonal().mean().clamp(min=1e-12)
    C.diagonal().add_(ridge * scale)
    return C


def fact_keys(keys: torch.Tensor, contexts: int) -> torch.Tensor:
    """k* per fact: the keys of a fact's prompts averaged over its noise contexts [F, d_key]
    from keys of fact-major prompts [F * contexts, d_key]."""
    return per_fact(keys, contexts).mean(1)


def logit_change(logits: torch.Tensor, old: torch.Tensor, new: torch.Tensor, margin: float) -> torch.Tensor:
    """The change of the answer logits [F, O] each edit asks for: t (e_new - e_old), t the
    least that puts the new answer `margin` above every other answer in every context of
    its prompts (logits [F, contexts, O]): t >= (l_old - l_new + margin) / 2 and
    t >= l_b - l_new + margin for every other answer b."""
    F = len(logits)
    rows = torch.arange(F, device=logits.device)
    l_new, l_old = logits[rows, :, new], logits[rows, :, old]  # [F, contexts]
    others = logits.clone()
    others[rows, :, new] = -torch.inf
    others[rows, :, old] = -torch.inf
    t = torch.maximum((l_old - l_new + margin) / 2, others.amax(-1) - l_new + margin)  # [F, contexts]
    t = t.amax(1).clamp(min=0.0)  # [F]
    change = torch.zeros_like(logits[:, 0])  # [F, O]
    change[rows, new] = t
    change[rows, old] = -t
    return change


def residual_change(W_U: torch.Tensor, change: torch.Tensor) -> torch.Tensor:
    """The least-norm residual change delta [F, d_model] with delta @ W_U = change [F, O]:
    the dual basis of the answer directions (W_U [d_model, O] pseudo-inverted). Exact when
    d_model >= O (the frozen unembedding has full column rank), least squares otherwise."""
    return change @ torch.linalg.pinv(W_U)


def write(C: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, form: str = "exact") -> torch.Tensor:
    """The change of a store's matrix [d_key, d_model] (TransformerLens layout: key @ W) that
    maps each key k_i [n, d_key] to k_i @ W + values_i [n, d_model].

    exact: ROME's write, n keys at once: the least change in C's norm with K dW = V,
    dW = C^-1 K^T (K C^-1 K^T)^-1 V; for one key W' = W + C^-1 k* Lambda^T with
    Lambda = (v* - W k*) / (k*^T C^-1 k*). Keys that cannot be told apart get the least-squares compromise.
    memit: MEMIT's batched form dW = (C + K^T K)^-1 K^T V, which trades each write against
    the keys C holds (reaches k_i only in part)."""
    if form == "memit":
        return torch.linalg.solve(C + keys.T @ keys, keys.T @ values)
    if form != "exact":
        raise ValueError(f"form must be 'exact' or 'memit', got {form!r}.")
    A = torch.linalg.solve(C, keys.T)  # [d_key, n] C^-1 K^T
    return A @ torch.linalg.pinv(keys @ A) @ values
