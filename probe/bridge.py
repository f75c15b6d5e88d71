"""Where a two-hop prompt's bridge entity r1(s) is readable (Biran et al. 2024, "Hopping too late").

At the last position, the residual stream after each layer (layer 0 the embedding, layer l
the output of block l) is read two ways: the logit lens (the residual through the
unembedding, as if the model stopped there: the bridge's rank among the S entities, 0 = the
top; and the answer's) and a linear probe (least squares from the residual to the bridge's
one-hot vector, fitted on the prompts of half the pairs (s, r1) and scored on the others':
the share whose largest output is the bridge). The models have no layer norm, so the lens is the model's own
readout: at the last layer it is the model's logits.
"""
from __future__ import annotations

import pandas as pd
import torch

RIDGE = 1e-3  # the least-squares probe's ridge, relative to the residuals' mean square (a scale-free probe)
RESOLVED_RANK = 0  # the lens resolves the bridge at a layer where it is the top entity


def resid_hooks(n_layers: int) -> list[str]:
    """The residual after each layer 0..L: the embedding, then each block's output."""
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{b}.hook_resid_post" for b in range(n_layers)]


def last_residuals(model, tokens: torch.Tensor) -> torch.Tensor:
    """The residual at the last position after each layer: [L+1, n, d_model]."""
    names = resid_hooks(model.cfg.n_layers)
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    return torch.stack([cache[name][:, -1] for name in names]).float()


def lens_ranks(resid: torch.Tensor, W_U: torch.Tensor, b_U: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each target's rank among the outputs under the logit lens: [L+1, n] (0 = the largest
    logit; the count of outputs whose logit is strictly larger), from resid [L+1, n, d],
    W_U [d, O], b_U [O], targets [n]."""
    logits = resid @ W_U + b_U  # [L+1, n, O]
    target = logits.gather(-1, targets.expand(len(resid), -1)[..., None])  # [L+1, n, 1]
    return (logits > target).sum(-1)


def probe_accuracy(resid: torch.Tensor, targets: torch.Tensor, n_classes: int, fit: torch.Tensor) -> torch.Tensor:
    """Per layer [L+1], the share of the prompts outside `fit` ([n] bool, those the probe is fitted
    on) whose least-squares readout (resid and a constant -> one-hot target) is largest at the
    target. resid [L+1, n, d], targets [n]."""
    X = torch.cat([resid, torch.ones_like(resid[..., :1])], -1).double()  # [L+1, n, d+1]
    Y = torch.nn.functional.one_hot(targets, n_classes).double()  # [n, C]
    Xf = X[:, fit]  # [L+1, n_fit, d+1]
    scale = Xf[..., :-1].pow(2).mean((1, 2), keepdim=True).clamp(min=1e-30)  # [L+1, 1, 1] the residuals' mean square
    penalty = torch.diag(torch.cat([torch.ones(X.shape[-1] - 1), torch.zeros(1)])).double()  # the constant's free
    gram = Xf.transpose(1, 2) @ Xf + RIDGE * scale * Xf.shape[1] * penalty
    W = torch.linalg.solve(gram, Xf.transpose(1, 2) @ Y[fit])  # [L+1, d+1, C]
    scores = X[:, ~fit] @ W  # [L+1, n_test, C]
    return (scores.argmax(-1) == targets[~fit]).double().mean(-1).float()


def split(groups: torch.Tensor, seed: int) -> torch.Tensor:
    """The probe's fitting prompts [n] bool: those whose group (groups [n], the pair (s, r1)) is in
    a random half of the groups, fixed by `seed`; the probe is scored on the other groups' prompts,
    whose (s, r1) it never saw, so it reads the bridge, not the prompt's pair."""
    names = groups.unique()  # [G] sorted
    chosen = names[torch.randperm(len(names), generator=torch.Generator().manual_seed(seed))[:len(names) // 2]]
    return torch.isin(groups, chosen)


def readout_table(resid: torch.Tensor, W_U: torch.Tensor, b_U: torch.Tensor, bridges: torch.Tensor,
                  answers: torch.Tensor, fit: torch.Tensor) -> pd.DataFrame:
    """Per layer (index 0..L): the bridge's mean lens rank and the share where it is the top
    entity, the answer's likewise, and the linear probe's held-out accuracy on the bridge."""
    bridge_rank = lens_ranks(resid, W_U, b_U, bridges).float()  # [L+1, n]
    answer_rank = lens_ranks(resid, W_U, b_U, answers).float()
    table = pd.DataFrame({
        "bridge_rank": bridge_rank.mean(-1).numpy(),
        "bridge_top1": (bridge_rank == 0).float().mean(-1).numpy(),
        "answer_rank": answer_rank.mean(-1).numpy(),
        "answer_top1": (answer_rank == 0).float().mean(-1).numpy(),
        "probe_accuracy": probe_accuracy(resid, bridges, W_U.shape[1], fit).numpy(),
        "chance": 1.0 / W_U.shape[1],
    })
    table.index.name = "layer"
    return table


def bridge_readout(model, batch, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per layer, per prompt) readouts of the bridges of a two-hop `batch` (tasks.two_hop's
    TwoHopBatch, every prompt two-hop) on a TransformerBridge `model`. Per prompt: s, r1, r2,
    bridge, answer, the model's answer and whether it is right, and `bridge_layer`, the first
    intermediate layer (1..L-1) whose lens puts the bridge on top (-1: none; the last layer is
    the model's answer, the embedding the same EOS vector for every prompt)."""
    if bool((batch.hops != 2).any()):
        raise ValueError("the bridge is read on two-hop prompts only.")
    device = model.W_U.device
    resid = last_residuals(model, batch.tokens.to(device)).cpu()  # [L+1, n, d]
    W_U, b_U = model.W_U.detach().float().cpu(), model.b_U.detach().float().cpu()
    bridges, answers = batch.bridges.cpu(), batch.answers.cpu()
    pairs = batch.subjects.cpu() * (int(batch.relations.max()) + 1) + batch.relations[:, 0].cpu()  # [n] (s, r1)
    layers = readout_table(resid, W_U, b_U, bridges, answers, split(pairs, seed))
    ranks = lens_ranks(resid, W_U, b_U, bridges)  # [L+1, n]
    top = ranks[1:-1] == RESOLVED_RANK  # [L-1, n] the intermediate layers: 0 is the EOS embedding, L the output
    first = torch.where(top.any(0), top.float().argmax(0) + 1, -1)  # [n]
    final = lens_ranks(resid[-1:], W_U, b_U, answers)[0]  # [n] the model's own readout
    predicted = (resid[-1] @ W_U + b_U).argmax(-1)  # [n]
    prompts = pd.DataFrame({"subject": batch.subjects.cpu().numpy(), "r1": batch.relations[:, 0].cpu().numpy(),
                            "r2": batch.relations[:, 1].cpu().numpy(), "bridge": bridges.numpy(),
                            "answer": answers.numpy(), "predicted": predicted.numpy(), "correct": (final == 0).numpy(),
                            "bridge_layer": first.numpy()})
    return layers, prompts


def shortcuts(prompts: pd.DataFrame, facts) -> dict:
    """What the model answers where it is wrong: of the wrong prompts, the share whose predicted
    entity is the bridge r1(s), r2(s) (the first hop skipped) or r1(r2(s)) (the hops swapped),
    each counted only where that reading differs from the answer; `facts` [S, R] entity ids."""
    facts = torch.as_tensor(facts)
    s, r1, r2, predicted = (torch.tensor(prompts[c].to_numpy()) for c in ("subject", "r1", "r2", "predicted"))
    answer = facts[facts[s, r1], r2]
    wrong = predicted != answer  # [n]
    readings = {"bridge": facts[s, r1], "first_hop_skipped": facts[s, r2], "hops_swapped": facts[facts[s, r2], r1]}
    shares = {name: int((wrong & (predicted == value)).sum()) / int(wrong.sum()) if wrong.any() else None
              for name, value in readings.items()}
    return {"wrong": int(wrong.sum()), **shares}


def resolution_by_outcome(prompts: pd.DataFrame) -> pd.DataFrame:
    """Per outcome (correct, wrong): prompts, the share whose bridge the lens resolves at some
    layer, and the mean layer where it first does (over those it resolves)."""
    resolved = prompts["bridge_layer"] >= 0
    rows = {}
    for outcome, group in (("correct", prompts[prompts["correct"]]), ("wrong", prompts[~prompts["correct"]])):
        seen = group[resolved[group.index]]
        rows[outcome] = {"prompts": len(group), "resolved_share": len(seen) / len(group) if len(group) else None,
                         "mean_bridge_layer": float(seen["bridge_layer"].mean()) if len(seen) else None}
    return pd.DataFrame.from_dict(rows, orient="index")
