"""Attention-denoising scores: which heads pick the subject and the relation out of the
noise at the EOS query, and which subjects and relations each head specialises in."""
from __future__ import annotations

import pandas as pd
import torch

from probe.prompts import FactPrompts, given_or_built
from probe.stats import with_interval
from tasks.factual_recall import FactualRecallTask


def attention_masses(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                     prompts: FactPrompts | None = None) -> dict[str, torch.Tensor]:
    """The EOS query's attention per prompt and head: {"subject", "relation", "eos",
    "noise"} -> [n, head] probability mass, from the hook_pattern of the clean run of
    `prompts` (built here when not given)."""
    return _masses(given_or_built(model, task, contexts, seed, prompts))


def _masses(prompts: FactPrompts) -> dict[str, torch.Tensor]:
    """attention_masses of given prompts."""
    batch, pattern = prompts.batch, prompts.run.pattern  # [n, H, T]
    rows = torch.arange(len(batch), device=pattern.device)
    subject, relation = pattern[rows, :, batch.subject_pos], pattern[rows, :, batch.relation_pos]  # [n, H]
    eos = pattern[:, :, -1]
    return {"subject": subject, "relation": relation, "eos": eos, "noise": 1 - subject - relation - eos}


def denoising_scores(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                     prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Per head: mean attention mass of the EOS query on the subject, the relation, EOS and
    the noise (with 95% intervals over prompts), the uniform baseline 1/T, and the scores
    (mass - 1/T) / (1 - 1/T): 1 = all attention on that token, 0 = no better than uniform.
    `prompts`: built here (`contexts` per fact, `seed`) when not given."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    masses, seed = _masses(prompts), prompts.seed
    T = task.seq_len
    rows = []
    for h in range(masses["subject"].shape[1]):
        row = {"head": h, "uniform_mass": 1 / T}
        for name, mass in masses.items():
            row.update({k: float(v) for k, v in with_interval(f"{name}_mass", mass[:, h], seed + h).items()})
        row["subject_score"] = (row["subject_mass"] - 1 / T) / (1 - 1 / T)
        row["relation_score"] = (row["relation_mass"] - 1 / T) / (1 - 1 / T)
        row["denoising_score"] = max(row["subject_score"], row["relation_score"])
        rows.append(row)
    return pd.DataFrame(rows)


def head_token_table(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                     prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Mean attention mass [head x token] each head puts on subject S<i> (resp. relation
    R<j>) in the prompts where it is the subject (resp. relation); columns S0.., R0...
    `prompts`: built here (`contexts` per fact, `seed`) when not given."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    batch, masses = prompts.batch, _masses(prompts)
    subject, relation = masses["subject"], masses["relation"]
    H = subject.shape[1]
    def by_token(mass, ids, count):  # [n, H] -> [H, count] mean over prompts holding each id
        total = mass.new_zeros(count, H).index_add_(0, ids, mass)
        return (total / torch.bincount(ids, minlength=count).clamp(min=1)[:, None]).T
    table = torch.cat([by_token(subject, batch.subjects, task.n_subjects),
                       by_token(relation, batch.relations, task.n_relations)], 1).cpu().numpy()
    labels = [task.token_label(z) for z in range(task.n_subjects + task.n_relations)]  # S0.., R0..
    return pd.DataFrame(table, columns=labels, index=pd.Index(range(H), name="head"))


def specialisation(table: pd.DataFrame, threshold: float = 0.5) -> pd.DataFrame:
    """Per head, the subjects and relations it gives at least `threshold` of its attention."""
    rows = []
    for head, masses in table.iterrows():
        picked = masses[masses >= threshold]
        rows.append({"head": head,
                     "subjects": " ".join(k for k in picked.index if k.startswith("S")),
                     "relations": " ".join(k for k in picked.index if k.startswith("R")),
                     "n_subjects": sum(k.startswith("S") for k in picked.index),
                     "n_relations": sum(k.startswith("R") for k in picked.index)})
    return pd.DataFrame(rows)
