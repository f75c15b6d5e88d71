"""The induction head built by hand from associative memories (Bietti et al. 2023; the talk's
"Induction head with associative memories"), on the simplified model's frozen random weights:

    W_KQ^1 = sum_t p_t p_{t-1}^T,   W_KQ^2 = sum_{k in Q} e_k e~_k^T (e~_k = W_OV^1 e_k),
    W_OV^2 = sum_k u_k e_k^T

written in TransformerLens's row-vector form (a key row x_s, a query row x_t, score x_s W_K x_t^T
with W_Q = I; the head writes x W_V W_O, read by W_U), the remapped keys e~_k taken orthogonal to
the embeddings of the tokens they serve (see memory_targets). Each memory stores normalised pairs
(a / |a|^2) so a stored association scores about 1 before the `strength` factor; the attention
scores are then about strength * sqrt(d) / sqrt(d_head) = strength.

It is the target the probes and the trained models are held against, and the "others frozen at
their target" start of the joint-learning experiment (analyses.induction). Computed from the
weights directly, as the constructions of the other families are; tests/test_induction_probes.py
checks its in-context accuracy through the TransformerLens model.
"""
from __future__ import annotations

import math

import torch

from models.section import InductionSection
from tasks.induction import InductionTask

TARGETS = ("blocks.0.attn.W_K", "blocks.1.attn.W_K", "blocks.1.attn.W_O")  # W_KQ^1, W_KQ^2, W_OV^2 (with W_V^2)


def _normalised(rows: torch.Tensor) -> torch.Tensor:
    """Each row a / |a|^2 [M, d], so a . a_normalised = 1."""
    return rows / rows.pow(2).sum(-1, keepdim=True)


def memory_targets(section: InductionSection, w: dict[str, torch.Tensor], task: InductionTask,
                   strength: float = 10.0) -> dict[str, torch.Tensor]:
    """The three memories of the construction for the frozen weights `w` (one model, CPU):
    W_K^1 [1, d, d], W_K^2 [1, d, d] and W_O^2 [1, d, d] (W_V^2 stays as it is)."""
    if section.architecture != "simplified":
        raise ValueError("the construction is the simplified model's (W_Q = I, one head per layer).")
    d = section.d_model
    scale = strength * math.sqrt(d)  # cancels the scores' 1/sqrt(d_head)
    P, E, U = w["pos_embed.W_pos"], w["embed.W_E"], w["unembed.W_U"].T  # [T, d], [N, d], [N, d]
    previous_token = scale * _normalised(P[:-1]).T @ _normalised(P[1:])  # [d, d]: key s = t-1 for query t
    keys = torch.arange(task.n_tokens) if task.triggers == "random" else task.fixed_triggers
    remapped = E[keys] @ w["blocks.0.attn.W_V"][0] @ w["blocks.0.attn.W_O"][0]  # [M, d] e~_k
    # e~_k less its part along the queries' own embeddings: at finite d, e_k . e~_k is O(1/sqrt d) and the
    # same at every position, a bias that sends a trigger's attention to its own earlier occurrences
    if len(keys) < d:  # (with d <= M nothing would be left)
        remapped = remapped - remapped @ torch.linalg.pinv(E[keys]) @ E[keys]
    induction = scale * _normalised(remapped).T @ _normalised(E[keys])  # [d, d]: key e~_k for query e_k
    copy = strength * _normalised(E).T @ _normalised(U)  # [d, d]: x W_V W_O = this, so e_k -> u_k
    output = torch.linalg.solve(w["blocks.1.attn.W_V"][0], copy)  # W_O^2 with W_V^2 W_O^2 = copy
    return {"blocks.0.attn.W_K": previous_token[None], "blocks.1.attn.W_K": induction[None],
            "blocks.1.attn.W_O": output[None]}


def induction_construction(section: InductionSection, w: dict[str, torch.Tensor], task: InductionTask,
                           strength: float = 10.0) -> dict[str, torch.Tensor]:
    """`w` with its three trained memories replaced by the construction's."""
    return {**w, **memory_targets(section, w, task, strength)}


def bigram_mlp(section: InductionSection, w: dict[str, torch.Tensor], task: InductionTask,
               strength: float = 4.0) -> dict[str, torch.Tensor]:
    """`w` with the last layer's MLP storing the global bigrams as an associative memory: hidden unit
    j fires on e_j (W_in = strength-scaled normalised embeddings, bias -strength/2 so that no other
    token's O(1/sqrt d) overlap passes; m >= N) and writes the direction whose unembedding is
    log pi_b(.|j), centred (W_out = L W_U^+), so W_U MLP(e_k) ~ log pi_b(.|k) + const."""
    m, N, last = section.d_mlp, task.n_tokens, f"blocks.{section.n_layers - 1}.mlp."
    if section.attn_only or m < N:
        raise ValueError(f"the bigram memory needs a final MLP of width >= N = {N}, got {section.d_mlp}.")
    E, W_U = w["embed.W_E"], w["unembed.W_U"]  # [N, d], [d, N]
    log_pi = task.conditionals.clamp_min(1e-6).log()  # [N, N]
    log_pi = log_pi - log_pi.mean(-1, keepdim=True)
    W_in = torch.zeros(section.d_model, m)
    W_in[:, :N] = strength * _normalised(E).T  # unit j: e_j . x, scaled
    b_in = torch.zeros(m)
    b_in[:N] = -strength / 2
    W_out = torch.zeros(m, section.d_model)
    W_out[:N] = log_pi @ torch.linalg.pinv(W_U) / (strength / 2)  # [N, d]: unit j's write, unembedded, log pi_b
    return {**w, last + "W_in": W_in, last + "b_in": b_in, last + "W_out": W_out}
