"""Ablations through hooks: per-fact accuracy after zero- or mean-ablating the MLP output,
each head, or all heads' OV output at the last position, and the two storage paths."""
from __future__ import annotations

import pandas as pd
import torch

from probe import columns
from probe.accuracy import per_fact_accuracy
from probe.hooks import HOOK_ATTN_OUT, HOOK_MLP_OUT, HOOK_RESID_POST, HOOK_Z, has_mlp, set_last
from probe.prompts import FactPrompts, given_or_built
from tasks.factual_recall import FactualRecallTask


def ablation_hooks(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                   prompts: FactPrompts | None = None) -> dict[str, list]:
    """Named hook lists: `{zero,mean}_ablate_{heads,head<h>,mlp}` (columns.ablation), and
    `mlp_path` (columns.path: attention's own write to the logits mean-ablated, the MLP
    still reads it). Means are over the clean run of every fact's prompts (`prompts`, built
    here when not given, or their population when they hold some facts only)."""
    run = given_or_built(model, task, contexts, seed, prompts).every_fact.run
    mean_z, mean_mlp, mean_attn = run.z.mean(0), run.mlp_out.mean(0), run.attn_out.mean(0)
    hooks = {}
    for kind, z_value in (("zero", torch.zeros_like(mean_z)), ("mean", mean_z)):
        hooks[columns.ablation(kind, "heads")] = [(HOOK_Z, set_last(z_value))]
        for h in range(model.cfg.n_heads):
            hooks[columns.ablation(kind, columns.head(h))] = [(HOOK_Z, set_last(z_value[h], head=h))]
        if has_mlp(model):
            hooks[columns.ablation(kind, "mlp")] = [(HOOK_MLP_OUT, set_last(0.0 if kind == "zero" else mean_mlp))]
    hooks[columns.path("mlp")] = _replace_attention_write(mean_attn)
    return hooks


def _replace_attention_write(mean_attn: torch.Tensor) -> list:
    """Hooks that swap attention's contribution to the final residual for its mean while
    the MLP keeps reading the real attention output."""
    stash = {}

    def keep(x, hook):
        stash["attn"] = x[:, -1].clone()

    def swap(x, hook):
        x = x.clone()
        x[:, -1] += mean_attn - stash["attn"]
        return x
    return [(HOOK_ATTN_OUT, keep), (HOOK_RESID_POST, swap)]


def ablations(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0, progress=None,
              prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Per-fact accuracy (with 95% interval), indexed by the fact, under every ablation of
    ablation_hooks, as columns `<ablation>_accuracy`, and `attention_path_accuracy`: the
    accuracy with the MLP output mean-ablated (the plain accuracy without an MLP).
    `progress` is called per run; `prompts`: built here (`contexts` per fact, `seed`) when
    not given."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    frames = {}
    for name, hooks in ablation_hooks(model, task, prompts=prompts).items():
        frames[name] = per_fact_accuracy(model, task, fwd_hooks=tuple(hooks), name=columns.accuracy_under(name),
                                         prompts=prompts)
        if progress:
            progress()
    attention_path = (frames[columns.ablation("mean", "mlp")] if has_mlp(model)
                      else per_fact_accuracy(model, task, prompts=prompts))
    attention_path = attention_path.set_axis(columns.interval(columns.path_accuracy("attention")), axis=1)
    return pd.concat([*frames.values(), attention_path], axis=1)


def n_ablation_runs(model) -> int:
    """How many forward runs `ablations` makes."""
    return 2 * (model.cfg.n_heads + 1 + has_mlp(model)) + 1
