"""Metrics of sequential learning and hallucination (paper section 5), read from the
last-position logits over the R*D answers. Losses are in nats, rates are shares of prompts.

- relation-only loss  -log sum_{a in A_r} p(a): mass on any valid answer for the relation;
- subject-only loss   -log sum_{a in A_s} p(a), A_s = {a*(s, r') : r'}: mass on any answer
  the subject has, whatever the relation;
- hallucination rate: the share of answers, sampled from the model, that are valid for the
  relation but are not the subject's: p(A_r) - p(a*) (sampling, not the argmax, so that the
  near-ties of a near-uniform model at initialisation count as what they are);
- KL(p(. | r) || model): how far the model is from the relation-only predictor p(a | r),
  which is what it outputs during the hallucination phase.
"""
from __future__ import annotations

import torch

from probe.contexts import answer_block
from tasks.factual_recall import Batch, FactualRecallTask

METRICS = ("loss", "accuracy", "relation_only_loss", "subject_only_loss", "hallucination_rate", "kl_relation_prior")


def relation_prior(task: FactualRecallTask) -> torch.Tensor:
    """p(a | r) [R, R*D]: the answer distribution of relation r over the subject
    frequencies (each relation's row lives in its own block A_r)."""
    prior = torch.zeros(task.n_relations, task.d_vocab_out)
    return prior.scatter_add(1, task.facts.T, task.subject_probs.expand(task.n_relations, -1).contiguous())


def conditional_entropy(task: FactualRecallTask) -> float:
    """H(a | r) in nats, averaged over the relation frequencies: the loss of the best
    predictor that ignores the subject (log D when every answer has as many subjects)."""
    prior = relation_prior(task)  # [R, O]
    entropy = -(prior * prior.clamp_min(1e-30).log()).sum(-1)  # [R]
    return float((task.relation_probs * entropy).sum())


def recall_metrics(logits: torch.Tensor, batch: Batch, task: FactualRecallTask) -> dict[str, float]:
    """Every metric of METRICS, averaged over the prompts of `batch`; logits [n, R*D]."""
    log_p = logits.float().log_softmax(-1)  # [n, O]
    D = task.answers_per_relation
    facts = task.facts.to(logits.device)
    subject_block = facts[batch.subjects]  # [n, R]: A_s
    relation_mass = answer_block(log_p, batch.relations, D).logsumexp(-1)  # [n] log p(A_r)
    answer_log_p = log_p.gather(-1, batch.answers[:, None])[:, 0]  # [n]
    prior = relation_prior(task).to(logits.device)[batch.relations]  # [n, O]
    kl = (prior * (prior.clamp_min(1e-30).log() - log_p)).where(prior > 0, 0.0).sum(-1)  # [n]
    values = {
        "loss": -answer_log_p,
        "accuracy": (logits.argmax(-1) == batch.answers).float(),
        "relation_only_loss": -relation_mass,
        "subject_only_loss": -log_p.gather(-1, subject_block).logsumexp(-1),
        "hallucination_rate": (relation_mass.exp() - answer_log_p.exp()).clamp_min(0.0),
        "kl_relation_prior": kl,
    }
    return {name: float(values[name].mean()) for name in METRICS}
