"""Activation patching, ROME-style: corrupt the subject (or the relation) by swapping in
another one, restore one component's output at the last position from the clean run, and
measure the share of the clean logit difference it restores (the normalisation of
TransformerLens's patching results: (patched - corrupted) / (clean - corrupted))."""
from __future__ import annotations

import pandas as pd
import torch

from probe import columns
from probe.hooks import HOOK_MLP_OUT, HOOK_Z, clean_run, has_mlp, rerun_last_position, set_last
from probe.metrics import answer_logit_diff
from probe.prompts import FactPrompts, given_or_built
from probe.stats import with_interval
from tasks.factual_recall import FactualRecallTask


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
                        contexts: int = 2, seed: int = 0, prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Per fact (indexed by the fact), the share of the clean logit difference
    logit(a*) - logit(a_corrupt) restored by patching each head's output (hook_z) and the
    MLP output at the last position from the clean run into the corrupted one (0: nothing,
    1: all), with 95% intervals over contexts. Columns `patch_<corrupt>_head<h>`,
    `patch_<corrupt>_mlp`. `prompts`: built here (`contexts` per fact, `seed`) when not given."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    batch, clean, seed = prompts.batch, prompts.run, prompts.seed
    device = batch.tokens.device
    # the swaps are drawn for every fact's prompts, so a fact's swaps do not depend on which facts are measured
    tokens, corrupt_answer = corrupted_prompts(task, prompts.population_batch(task), corrupt,
                                               torch.Generator(device=device).manual_seed(seed + 1))
    if prompts.rows is not None:
        tokens, corrupt_answer = tokens[prompts.rows], corrupt_answer[prompts.rows]
    corrupted = clean_run(model, tokens)  # no hooks, on the corrupted prompts
    valid = corrupt_answer >= 0
    rival = corrupt_answer.clamp(min=0)

    def logit_diff(logits):  # [n, O] -> [n]
        return answer_logit_diff(logits, batch.answers, rival)

    restores = {columns.head(h): [(HOOK_Z, set_last(clean.z[:, h], head=h))] for h in range(model.cfg.n_heads)}
    if has_mlp(model):
        restores["mlp"] = [(HOOK_MLP_OUT, set_last(clean.mlp_out))]
    clean_diff, corrupted_diff = logit_diff(clean.logits), logit_diff(corrupted.logits)  # [n]
    no_scale = ~valid | ((clean_diff - corrupted_diff).abs() < 1e-6)  # nothing to restore
    cols = {}
    for name, hooks in restores.items():
        patched = logit_diff(rerun_last_position(model, corrupted, hooks))
        restored = ((patched - corrupted_diff) / (clean_diff - corrupted_diff)).masked_fill(no_scale, float("nan"))
        cols.update(with_interval(columns.patch(corrupt, name), prompts.per_fact(restored), seed))
    return prompts.frame(cols)
