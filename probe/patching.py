"""Activation patching, ROME-style: corrupt the subject (or the relation) by swapping in
another one, restore one component's output from the clean run, and measure the share of
the clean logit difference it restores (TransformerLens's patching.generic_activation_patch)."""
from __future__ import annotations

from unittest import mock

import pandas as pd
import torch
from transformer_lens import patching

from probe.accuracy import columns, facts_frame, model_device
from probe.contexts import fact_batch, per_fact
from probe.stats import with_interval
from probe.task import FactualRecallTask


def corrupted_prompts(task: FactualRecallTask, batch, corrupt: str, generator: torch.Generator):
    """The batch's tokens with the subject (or relation) swapped for a random other one
    whose answer differs, and that other answer [n] (-1 where no such swap exists)."""
    n, device = len(batch), batch.tokens.device
    facts = task.facts.to(device)
    if corrupt == "subject":
        count, own, position = task.n_subjects, batch.subjects, batch.subject_pos
    elif corrupt == "relation":
        count, own, position = task.n_relations, batch.relations, batch.relation_pos
    else:
        raise ValueError(f"corrupt must be 'subject' or 'relation', got {corrupt!r}.")
    # candidates [n, count]: other ids whose swap changes the answer, chosen uniformly
    ids = torch.arange(count, device=device)
    if corrupt == "subject":
        other_answers = facts[:, batch.relations].T  # [n, S]
    else:
        other_answers = facts[batch.subjects]  # [n, R]
    allowed = (ids[None] != own[:, None]) & (other_answers != batch.answers[:, None])
    scores = torch.rand(n, count, generator=generator, device=device).masked_fill(~allowed, -1)
    other = scores.argmax(-1)  # [n]
    valid = allowed.any(-1)
    tokens = batch.tokens.clone()
    tokens[torch.arange(n, device=device), position] = other + (task.n_subjects if corrupt == "relation" else 0)
    corrupt_answer = torch.where(valid, other_answers.gather(-1, other[:, None])[:, 0], -1)
    return tokens, corrupt_answer


def activation_patching(model, task: FactualRecallTask, corrupt: str = "subject",
                        contexts: int = 2, seed: int = 0) -> pd.DataFrame:
    """Per fact, the share of the clean logit difference logit(a*) - logit(a_corrupt)
    restored by patching each head's output (hook_z) and the MLP output from the clean
    run into the corrupted one (0: nothing, 1: all), with 95% intervals over contexts.
    Columns `patch_<corrupt>_head<h>`, `patch_<corrupt>_mlp`."""
    device = model_device(model)
    batch = fact_batch(task, contexts, seed, device)
    tokens, corrupt_answer = corrupted_prompts(task, batch, corrupt, torch.Generator(device=device).manual_seed(seed + 1))
    valid = corrupt_answer >= 0
    rival = corrupt_answer.clamp(min=0)

    def logit_diff(logits):  # [batch, pos, O] -> [batch]
        last = logits[:, -1]
        return last.gather(-1, batch.answers[:, None])[:, 0] - last.gather(-1, rival[:, None])[:, 0]

    with torch.inference_mode():
        clean_logits, clean_cache = model.run_with_cache(
            batch.tokens, names_filter=lambda n: n.endswith(("hook_z", "hook_mlp_out")))
    clean = logit_diff(clean_logits)  # the one clean run gives both the cache and the baseline
    sweeps = {"head": ("z", patching.layer_head_vector_patch_setter, ["layer", "head"])}
    if not model.cfg.attn_only:
        sweeps["mlp"] = ("mlp_out", lambda corrupted, index, clean_act: clean_act, ["layer"])
    cols = {}
    with mock.patch.object(patching, "tqdm", lambda iterable, **_: iterable), torch.inference_mode():
        for component, (act, setter, axes) in sweeps.items():
            result = patching.generic_activation_patch(
                model, tokens, clean_cache, logit_diff, setter, act, index_axis_names=axes,
                reduce="none", baseline=True)
            restored = result.normalized(clean)  # [layer, (head,) batch]
            restored = restored.reshape(-1, len(batch))  # [component, batch]
            restored[:, ~valid | ((clean - result.baseline).abs() < 1e-6)] = float("nan")
            for i, row in enumerate(restored):
                name = f"patch_{corrupt}_{component}{i if component == 'head' else ''}"
                cols.update(with_interval(name, per_fact(row, contexts), seed))
    return columns(facts_frame(task), cols)
