"""What an edit did, measured on held-out noise contexts: efficacy (the new answer wins on
the edited fact's prompts), the old answer's rank, the leak (how much of the new answer's
logit gain reaches the same subject's other facts' prompts) and specificity (every other
fact's answer unchanged), grouped: the same subject's other relations, the same relation's
other subjects, the rest. Shares with Wilson 95% intervals (probe/stats.py)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch

from probe.contexts import per_fact
from probe.hooks import hooked_last_logits, model_device
from probe.prompts import fact_batch
from probe.stats import share_with_interval
from tasks.factual_recall import FactualRecallTask

GROUPS = ("same_subject", "same_relation", "other")
HELD_OUT = 7919  # added to the edit's seed: the contexts measured are not those the keys came from


def fact_groups(task: FactualRecallTask, edited: Sequence[tuple[int, int]]) -> list[str | None]:
    """Per fact of task.all_facts() (subject-major): None for an edited fact, else its group:
    same_subject (its subject is edited), same_relation (its relation is), other."""
    subjects, relations = {s for s, _ in edited}, {r for _, r in edited}
    groups = []
    for s in range(task.n_subjects):
        for r in range(task.n_relations):
            groups.append(None if (s, r) in edited else GROUPS[0] if s in subjects
                          else GROUPS[1] if r in relations else GROUPS[2])
    return groups


def edit_effects(original, edited, task: FactualRecallTask, edits: Sequence[tuple[int, int, int, int]],
                 contexts: int = 8, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Per edit (subject, relation, old answer, new answer) a row: efficacy (share of
    contexts whose top answer over all R*D is the new one) with its interval, old_rank (1 =
    top, mean over contexts), new_margin (new answer's logit over the best other, mean) and
    leak; and the specificity dict: per group (and `all`) the share of the other facts'
    prompts whose top answer is the one the original model gave, with its interval over
    facts, and how many facts. Measured on `contexts` prompts per fact of seed + HELD_OUT."""
    tokens = fact_batch(task, contexts, seed + HELD_OUT, model_device(original)).tokens
    before = per_fact(hooked_last_logits(original, tokens).float(), contexts).cpu()  # [F, contexts, O]
    after = per_fact(hooked_last_logits(edited, tokens).float(), contexts).cpu()
    R = task.n_relations
    rows = []
    for s, r, old, new in edits:
        logits = after[s * R + r]  # [contexts, O]
        others = logits.clone()
        others[:, new] = -torch.inf
        gain = after[:, :, new] - before[:, :, new]  # [F, contexts] the new answer's logit change
        siblings = [s * R + q for q in range(R) if q != r]
        leak = (gain[siblings].mean() / gain[s * R + r].mean()).item() if siblings else math.nan
        rows.append({"subject": s, "relation": r, "old_answer": old, "new_answer": new,
                     **{k: v.item() for k, v in share_with_interval(
                         "efficacy", (logits.argmax(-1) == new).float()).items()},
                     "old_rank": (1 + (logits > logits[:, old:old + 1]).sum(-1).float()).mean().item(),
                     "new_margin": (logits[:, new] - others.amax(-1)).mean().item(),
                     "leak": leak})
    same = (after.argmax(-1) == before.argmax(-1)).float().mean(1)  # [F] per fact, over contexts
    groups = fact_groups(task, [(s, r) for s, r, _, _ in edits])
    specificity = {}
    for group in (*GROUPS, "all"):
        chosen = [i for i, g in enumerate(groups) if g is not None and group in (g, "all")]
        if chosen:
            values = {k: v.item() for k, v in share_with_interval("share", same[chosen]).items()}
        else:
            values = {"share": None, "share_low": None, "share_high": None}
        specificity[group] = {"share": values["share"], "low": values["share_low"], "high": values["share_high"],
                              "facts": len(chosen)}
    return pd.DataFrame(rows), specificity
