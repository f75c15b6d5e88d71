"""Attribution patching: the linear approximation of activation patching (probe.patching).
One forward and one backward pass on the corrupted prompts give the gradient of the logit
difference logit(a*) - logit(a_corrupt) at EOS with respect to every component's
activation; restoring component c is then estimated as (clean_c - corrupted_c) . gradient,
in the same units as activation patching: the share of the clean logit difference restored.

Exact wherever the logit difference is linear in c: the MLP output (the unembedding reads it
directly, no layer norm) and, in an attention-only model, each head's z at EOS. Elsewhere
(a head feeding the ReLU MLP, the residual input through the softmax) it is a first-order
estimate; `agreement` measures how close it comes."""
from __future__ import annotations

import pandas as pd
import torch

from probe import columns
from probe.hooks import HOOK_MLP_OUT, HOOK_RESID_PRE, HOOK_Z, PROMPTS_PER_RUN, has_mlp
from probe.metrics import answer_logit_diff
from probe.patching import corrupted_prompts
from probe.prompts import FactPrompts, given_or_built
from probe.stats import with_interval


def activations_and_gradients(model, tokens: torch.Tensor, answers: torch.Tensor, rivals: torch.Tensor,
                              names: list[str]) -> tuple[dict, dict, torch.Tensor]:
    """The activations at hooks `names` on `tokens` [n, T], the gradient of each prompt's
    logit difference logit(answer) - logit(rival) at EOS with respect to them (same shapes),
    and those logit differences [n].
    The residual input is made a leaf that requires grad, so this works whether or not the
    model's parameters do; the parameters' .grad is left untouched."""
    stash = {}

    def keep(name):
        def hook(x, hook):
            if name == HOOK_RESID_PRE:
                x = x.detach().requires_grad_(True)
            stash[name] = x
            return x
        return hook

    names = list(dict.fromkeys([HOOK_RESID_PRE, *names]))
    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(name, keep(name)) for name in names])
        diff = answer_logit_diff(logits[:, -1], answers, rivals)  # [n]
        grads = torch.autograd.grad(diff.sum(), [stash[name] for name in names])  # prompts are independent
    return {k: v.detach() for k, v in stash.items()}, dict(zip(names, grads)), diff.detach()


def attribution_patching(model, task, corrupt: str = "subject", contexts: int = 2, seed: int = 0,
                         prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Per fact (indexed by the fact), attribution patching's estimate of the share of the
    clean logit difference restored by each head's z and the MLP output at EOS (as
    probe.patching.activation_patching measures them, on the same corrupted prompts), and by
    the residual input at the corrupted token's position, with 95% intervals over contexts.
    Columns `attrib_<corrupt>_head<h>`, `attrib_<corrupt>_mlp`, `attrib_<corrupt>_resid`."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    batch, seed = prompts.batch, prompts.seed
    device = batch.tokens.device
    generator = torch.Generator(device=device).manual_seed(seed + 1)  # activation_patching's corruption
    tokens, corrupt_answer = corrupted_prompts(task, batch, corrupt, generator)
    position = batch.subject_pos if corrupt == "subject" else batch.relation_pos  # [n]
    rival = corrupt_answer.clamp(min=0)
    names = [HOOK_RESID_PRE, HOOK_Z] + ([HOOK_MLP_OUT] if has_mlp(model) else [])
    parts: dict[str, list] = {}
    diffs: dict[str, list] = {"clean": [], "corrupted": []}
    for start in range(0, len(tokens), PROMPTS_PER_RUN):
        chunk = slice(start, start + PROMPTS_PER_RUN)
        corrupted, grads, corrupted_diff = activations_and_gradients(model, tokens[chunk], batch.answers[chunk],
                                                                     rival[chunk], names)
        with torch.inference_mode():
            logits, cache = model.run_with_cache(batch.tokens[chunk], names_filter=lambda n: n in names)
        diffs["clean"].append(answer_logit_diff(logits[:, -1], batch.answers[chunk], rival[chunk]))
        diffs["corrupted"].append(corrupted_diff)
        delta = {name: cache[name] - corrupted[name] for name in names}
        rows = torch.arange(len(delta[HOOK_Z]), device=device)
        estimates = {columns.head(h): (delta[HOOK_Z][:, -1, h] * grads[HOOK_Z][:, -1, h]).sum(-1)
                     for h in range(model.cfg.n_heads)}  # [n] each
        if has_mlp(model):
            estimates["mlp"] = (delta[HOOK_MLP_OUT][:, -1] * grads[HOOK_MLP_OUT][:, -1]).sum(-1)
        at = position[chunk]
        estimates["resid"] = (delta[HOOK_RESID_PRE][rows, at] * grads[HOOK_RESID_PRE][rows, at]).sum(-1)
        for name, value in estimates.items():
            parts.setdefault(name, []).append(value)
    clean_diff, corrupted_diff = (torch.cat(diffs[k]) for k in ("clean", "corrupted"))
    no_scale = (corrupt_answer < 0) | ((clean_diff - corrupted_diff).abs() < 1e-6)
    cols = {}
    for name, values in parts.items():
        restored = (torch.cat(values) / (clean_diff - corrupted_diff)).masked_fill(no_scale, float("nan"))
        cols.update(with_interval(columns.attribution(corrupt, name), prompts.per_fact(restored), seed))
    return prompts.frame(cols)


ZERO = 1e-4  # float32 noise on a share that is 0 by construction is ~1e-6


def _sign(x: pd.Series) -> pd.Series:
    """-1, 0 or 1, with 0 for every value within ZERO of 0 (its sign would be the last bit's)."""
    return x.gt(ZERO).astype(int) - x.lt(-ZERO).astype(int)


def agreement(patched: pd.DataFrame, attributed: pd.DataFrame, corrupt: str = "subject") -> pd.DataFrame:
    """Per component measured both ways (heads, MLP) over facts, and `all` of them pooled:
    the correlation of activation patching's and attribution patching's restored shares
    (NaN where either spreads less than 0.001: nothing to correlate), the share of facts
    where their signs agree (both within 0.05 of 0 counts as agreeing) and the largest
    absolute difference."""
    prefix = columns.patch(corrupt, "")
    components = [c.removeprefix(prefix) for c in patched.columns
                  if c.startswith(prefix) and not c.endswith(("_low", "_high"))]
    pairs = {c: (patched[columns.patch(corrupt, c)], attributed[columns.attribution(corrupt, c)]) for c in components}
    pairs["all"] = tuple(pd.concat([pair[i] for pair in pairs.values()], ignore_index=True) for i in (0, 1))
    rows = []
    for component, (a, b) in pairs.items():
        keep = a.notna() & b.notna()
        a, b = a[keep], b[keep]
        signs = ((a.abs() < 0.05) & (b.abs() < 0.05)) | (_sign(a) == _sign(b))
        spread = min(a.std(), b.std()) if len(a) > 1 else 0.0
        rows.append({"component": component, "facts": int(keep.sum()),
                     "correlation": float(a.corr(b)) if spread >= 1e-3 else float("nan"),
                     "sign_agreement": float(signs.mean()), "max_abs_difference": float((a - b).abs().max())})
    return pd.DataFrame(rows)
