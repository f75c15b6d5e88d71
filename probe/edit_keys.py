"""The pieces of a rank-one write to an associative memory (ROME, MEMIT): the keys a store
reads, their second moment C, the residual change each edited fact needs (closed form
through the unembedding, or through the later blocks' first-order map) and the write that
maps keys to values.

Stores, in TransformerLens's layouts (block `layer` of the model):
- `mlp`: W_out [d_mlp, d_model]; key = the hidden units after the ReLU (hook_post) [d_mlp],
  at the last position, or at the subject's position (ROME's key at the subject's last token).
- `ov`, head h: W_O[h] [d_head, d_model]; key = the head's mix of values at the last position
  (hook_z) [d_head]: its value input at the token it attends to, weighted by its attention.
"""
from __future__ import annotations

import torch

from probe.contexts import per_fact
from probe.hooks import PROMPTS_PER_RUN

RIDGE = 1e-4  # C += RIDGE * mean eigenvalue * I: keys the task never sets (a unit that never fires) stay invertible
KEY_FLOOR = 1e-3  # a fact's key under this share of the keys' typical norm carries nothing: no write is keyed on it


class EmptyKey(ValueError):
    """A fact's key at a store carries nothing (KEY_FLOOR): the store does not read the fact."""


def hook_name(store: str, layer: int = 0) -> str:
    """The hook of a store's key in block `layer`."""
    return f"blocks.{layer}.mlp.hook_post" if store == "mlp" else f"blocks.{layer}.attn.hook_z"


def store_keys(model, tokens: torch.Tensor, store: str, head: int | None = None, layer: int = 0,
               positions: torch.Tensor | str | None = None) -> torch.Tensor:
    """The key a store of block `layer` reads [n, d_key] (module docstring): at the last
    position of each prompt, at positions[i] of prompt i ([n] long), or at every position
    ('all': [n * T, d_key])."""
    name = hook_name(store, layer)
    out = []
    with torch.inference_mode():
        for start in range(0, len(tokens), PROMPTS_PER_RUN):
            chunk = tokens[start:start + PROMPTS_PER_RUN]
            _, cache = model.run_with_cache(chunk, names_filter=lambda n: n == name)
            acts = cache[name] if store == "mlp" else cache[name][:, :, head]  # [chunk, T, d_key]
            if positions is None:
                acts = acts[:, -1]
            elif isinstance(positions, str):
                acts = acts.reshape(-1, acts.shape[-1])
            else:
                acts = acts[torch.arange(len(chunk)), positions[start:start + len(chunk)]]
            out.append(acts)
    return torch.cat(out).float()


def head_key_norms(model, tokens: torch.Tensor, contexts: int, layer: int = 0) -> torch.Tensor:
    """The norm of each fact's key k* at each head of block `layer` [F, H], from fact-major prompts."""
    return torch.stack([fact_keys(store_keys(model, tokens, "ov", h, layer), contexts).norm(dim=-1)
                        for h in range(model.cfg.n_heads)], 1)


def empty_keys(k_star: torch.Tensor, keys: torch.Tensor, floor: float = KEY_FLOOR):
    """Which facts' keys k* [n, d_key] carry nothing: norm <= floor x the keys' typical norm
    (the root mean square of the norms of `keys` [N, d_key], the task's prompts). Returns the
    mask [n], the norms [n] and the typical norm. A store that never fires has typical norm 0:
    every key is empty."""
    typical = keys.pow(2).sum(-1).mean().sqrt()
    norms = k_star.norm(dim=-1)
    return norms <= floor * typical, norms, float(typical)


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
    d_model >= O (the frozen unembedding has full column rank), least squares otherwise.
    Any map J [d_model, O] from a write to the logits takes W_U's place."""
    return change @ torch.linalg.pinv(W_U)


def output_map(model, tokens: torch.Tensor, layer: int, positions: torch.Tensor, store: str = "mlp") -> torch.Tensor:
    """J [d_model, O]: how the last position's logits move, to first order, with block
    `layer`'s MLP output (or its heads' output, store `ov`) at positions[i] of prompt i (mean
    over the prompts): the later blocks that read it there or carry it to the last position."""
    rows = torch.arange(len(tokens), device=tokens.device)
    nudge = torch.zeros(len(tokens), model.cfg.d_model, device=tokens.device, requires_grad=True)  # [n, d]

    def hook(x, hook):
        x = x.clone()
        x[rows, positions] = x[rows, positions] + nudge.to(x.dtype)
        return x
    with torch.enable_grad():
        name = f"blocks.{layer}.hook_{'mlp' if store == 'mlp' else 'attn'}_out"
        logits = model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])[:, -1]  # [n, O]
        J = [torch.autograd.grad(logits[:, o].sum(), nudge, retain_graph=True)[0].mean(0)
             for o in range(logits.shape[-1])]
    return torch.stack(J, 1).float()  # [d, O]


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
