"""Associative-memory recall probes read from the weights (Bietti's memory recall probe
R(W_hat, W*), candidates restricted to A_r), with each head's measured attention.

OV probe: does u_a^T W_OV^h (alpha_s^h e_s + alpha_r^h e_r) rank a* first in A_r, per head
and summed over heads, alpha being the head's mean attention to the subject and relation?
MLP probe: does the MLP, applied to the residual this idealised attention gives
(`idealised_residual`: EOS embedding and position, noise at its mean, biases), rank a* first?
"""
from __future__ import annotations

import pandas as pd
import torch

from probe import columns
from probe.contexts import ranks_first_in_block
from probe.denoising import attention_masses
from probe.hooks import has_mlp, model_device
from probe.prompts import FactPrompts, given_or_built
from tasks.factual_recall import FactualRecallTask


def fact_attention(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                   prompts: FactPrompts | None = None) -> dict[str, torch.Tensor]:
    """Mean attention of each head's EOS query, per fact [F, H]: on the subject, the
    relation, EOS and noise (probability mass), from the clean run of `prompts` (built here
    when not given)."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    return {k: prompts.per_fact(v).mean(1) for k, v in attention_masses(model, task, prompts=prompts).items()}


@torch.no_grad()  # reads the weights; no gradient to keep
def idealised_residual(model, task: FactualRecallTask, alpha: dict[str, torch.Tensor],
                       facts: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The residual the MLP reads at EOS [F, d] when each head h puts attention alpha[k]
    [F, H] on the subject, the relation, EOS and the noise: the EOS embedding and position,
    plus each head's OV write of what it attends to (the subject, relation and noise sit
    anywhere in the first T-1 positions: their mean positional embedding; noise tokens their
    mean embedding), plus b_V W_O and b_O (each head's attention sums to 1). `facts`:
    the (subjects, relations) [F] alpha is of (default: every fact, task.all_facts())."""
    subjects, relations = (t.to(model_device(model)) for t in (facts or task.all_facts()[:2]))
    E, OV = model.W_E, model.OV.AB[0]  # [V, d], [H, d, d]
    W_pos = model.W_pos  # [T, d]
    position, eos_position = W_pos[:-1].mean(0), W_pos[-1]  # [d], [d]
    noise = E[list(task.noise_tokens)].mean(0) if task.n_noise else 0.0
    e_eos = E[task.eos] + eos_position
    attended = {"subject": E[subjects] + position, "relation": E[task.n_subjects + relations] + position,  # [F, d]
                "eos": e_eos.expand(len(subjects), -1), "noise": (noise + position).expand(len(subjects), -1)}
    write = sum(torch.einsum("fh,fd,hde->fe", alpha[k], x, OV) for k, x in attended.items())  # [F, d]
    bias = torch.einsum("hv,hvd->d", model.b_V[0], model.W_O[0]) + model.b_O[0]  # [d]
    return e_eos + write + bias


@torch.no_grad()  # reads the weights; no gradient to keep
def recall_probes(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                  prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Per fact (indexed by the fact): `ov_probe_head<h>` and `ov_probe` (heads summed),
    `mlp_probe`: 1.0 where the probe ranks a* first within A_r (NaN for mlp_probe without
    an MLP). `prompts`: those whose attention the probes use, built here when not given."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    alpha = fact_attention(model, task, prompts=prompts)
    subjects, relations, answers = prompts.fact_tensors()  # [F] the facts measured
    E, OV, W_U = model.W_E, model.OV.AB[0], model.W_U  # [V, d], [H, d, d], [d, O]
    S, D = task.n_subjects, task.answers_per_relation
    e_s, e_r = E[subjects], E[S + relations]  # [F, d]
    # each head's write for the fact: W_OV^h applied to its attended subject and relation
    write = torch.einsum("fh,fd,hde->fhe", alpha["subject"], e_s, OV) \
        + torch.einsum("fh,fd,hde->fhe", alpha["relation"], e_r, OV)  # [F, H, d]
    cols = {}
    for h in range(write.shape[1]):
        cols[columns.ov_probe(h)] = ranks_first_in_block(write[:, h] @ W_U, relations, answers, D)[0]
    cols[columns.ov_probe()] = ranks_first_in_block(write.sum(1) @ W_U, relations, answers, D)[0]
    if has_mlp(model):
        mid = idealised_residual(model, task, alpha, (subjects, relations))  # [F, d]
        with torch.inference_mode():
            mlp_out = model.blocks[0].mlp(mid[:, None])[:, 0]  # the model's own MLP module
        cols[columns.MLP_PROBE] = ranks_first_in_block(mlp_out @ W_U, relations, answers, D)[0]
    else:
        cols[columns.MLP_PROBE] = torch.full((len(prompts.facts),), float("nan"))
    return prompts.frame(cols)
