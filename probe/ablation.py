"""Ablations through hooks: per-fact accuracy after zero- or mean-ablating the MLP output,
each head, or all heads' OV output at the last position, and the two storage paths."""
from __future__ import annotations

import pandas as pd
import torch

from probe.accuracy import facts_frame, per_fact_accuracy
from probe.contexts import fact_run
from probe.hooks import HOOK_ATTN_OUT, HOOK_MLP_OUT, HOOK_RESID_POST, HOOK_Z, CleanRun, has_mlp, set_last
from tasks.factual_recall import FactualRecallTask

KEYS = ["subject", "relation", "answer"]


def ablation_hooks(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                   run: CleanRun | None = None) -> dict[str, list]:
    """Named hook lists: `{zero,mean}_ablate_{mlp,heads,head<h>}`, and `mlp_path`
    (attention's own write to the logits mean-ablated, the MLP still reads it). Means are
    over the prompts of the clean run `run` (contexts.fact_run; computed here when not given)."""
    _, run = fact_run(model, task, contexts, seed, run=run)
    mean_z, mean_mlp, mean_attn = run.z.mean(0), run.mlp_out.mean(0), run.attn_out.mean(0)
    hooks = {}
    for kind, z_value in (("zero", torch.zeros_like(mean_z)), ("mean", mean_z)):
        hooks[f"{kind}_ablate_heads"] = [(HOOK_Z, set_last(z_value))]
        for h in range(model.cfg.n_heads):
            hooks[f"{kind}_ablate_head{h}"] = [(HOOK_Z, set_last(z_value[h], head=h))]
        if has_mlp(model):
            hooks[f"{kind}_ablate_mlp"] = [(HOOK_MLP_OUT, set_last(0.0 if kind == "zero" else mean_mlp))]
    hooks["mlp_path"] = _replace_attention_write(mean_attn)
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
              run: CleanRun | None = None) -> pd.DataFrame:
    """Per-fact accuracy (with 95% interval) under every ablation of ablation_hooks, as
    columns `<ablation>_accuracy`, and `attention_path_accuracy`: the accuracy with the MLP
    output mean-ablated (the plain accuracy without an MLP). `progress` is called per run;
    `run`: the clean run on these prompts (contexts.fact_run), computed here when not given."""
    _, run = fact_run(model, task, contexts, seed, run=run)
    frame = facts_frame(task)
    for name, hooks in ablation_hooks(model, task, contexts, seed, run=run).items():
        measured = per_fact_accuracy(model, task, contexts, seed, tuple(hooks), name=f"{name}_accuracy", run=run)
        frame = frame.merge(measured, on=KEYS)
        if progress:
            progress()
    source = "mean_ablate_mlp_accuracy" if has_mlp(model) else "accuracy"
    if not has_mlp(model):
        frame = frame.merge(per_fact_accuracy(model, task, contexts, seed, run=run), on=KEYS)
    for suffix in ("", "_low", "_high"):
        frame[f"attention_path_accuracy{suffix}"] = frame[source + suffix]
    return frame.drop(columns=[c for c in frame if c.startswith("accuracy")])


def n_ablation_runs(model) -> int:
    """How many forward runs `ablations` makes."""
    return 2 * (model.cfg.n_heads + 1 + has_mlp(model)) + 1
