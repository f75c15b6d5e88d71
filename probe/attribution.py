"""Direct logit attribution at the last position: what each head, the MLP and the direct
path (EOS embedding and biases) write onto the answer logits, per fact."""
from __future__ import annotations

import pandas as pd
import torch

from probe import columns
from probe.contexts import TIE, answer_block, ranks_first_in_block
from probe.prompts import FactPrompts, given_or_built
from probe.stats import ratio_with_interval, share_with_interval, with_interval
from tasks.factual_recall import Batch, FactualRecallTask


@torch.no_grad()  # reads the weights; no gradient to keep
def direct_logit_attribution(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                             prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Per fact (indexed by the fact), in logit units averaged over contexts (each with a
    95% interval):

    - `margin`: a* over the model's strongest other answer b in A_r; `X_margin` for
      X = head{h}, attention (heads summed), mlp, direct (EOS embedding, biases): X's part
      of it (they add up to `margin`).
    - `X_top`: share of contexts where X alone ranks a* first in A_r (ties do not count).
    - `attention_own_margin`, `mlp_own_margin`: X's own margin of a* over X's strongest
      other answer in A_r, X judged alone whatever the other component writes.
    - `X_top_chance`, `X_top_z` (one value per model, see `above_chance`): the share of
      facts X would rank first if its picks ignored the subject, and how many standard
      errors X's mean `X_top` lies above it; over every fact's prompts, whichever facts are
      measured.
    - `attention_share`, `mlp_share`: X's margin over the full margin (means over contexts);
      NaN where the full margin is not positive or both components' margins are negative,
      where a share means nothing.

    `prompts`: built here (`contexts` per fact, `seed`) when not given.
    """
    prompts = given_or_built(model, task, contexts, seed, prompts)
    batch, run, seed = prompts.batch, prompts.run, prompts.seed
    D = task.answers_per_relation
    components = component_logits(model, run)
    every = prompts.every_fact
    every_components = components if every is prompts else component_logits(model, every.run)

    block = answer_block(run.logits, batch.relations, D)  # [n, D]
    target = batch.answers - batch.relations * D
    rival = block.scatter(-1, target[:, None], float("-inf")).argmax(-1) + batch.relations * D  # [n] answer id b

    def margin(logits):  # a* over the fixed rival b, per fact and context [F, C]
        return prompts.per_fact(logits.gather(-1, batch.answers[:, None])[:, 0]
                                - logits.gather(-1, rival[:, None])[:, 0])

    total = margin(run.logits)  # [F, C]
    cols = with_interval(columns.MARGIN, total, seed)
    for name, logits in components.items():
        cols.update(with_interval(columns.margin(name), margin(logits), seed))
        top, own = (prompts.per_fact(x) for x in ranks_first_in_block(logits, batch.relations, batch.answers, D))
        cols.update(share_with_interval(columns.top(name), top))
        if name in columns.STORES:
            cols.update(with_interval(columns.own_margin(name), own, seed))
            every_top = top if every is prompts else every.per_fact(ranks_first_in_block(
                every_components[name], every.batch.relations, every.batch.answers, D)[0])
            chance, z = above_chance(every_components[name], task, every.batch, every_top.mean(1))
            cols[columns.top_chance(name)] = torch.full((len(prompts.facts),), chance)
            cols[columns.top_z(name)] = torch.full((len(prompts.facts),), z)
    means = {name: cols[columns.margin(name)] for name in columns.STORES}
    meaningless = (cols[columns.MARGIN] <= 0) | ((means["attention"] < 0) & (means["mlp"] < 0))  # [F]
    for name in columns.STORES:
        shares = ratio_with_interval(columns.share(name), margin(components[name]), total, seed)
        cols.update({k: v.masked_fill(meaningless, float("nan")) for k, v in shares.items()})
    return prompts.frame(cols)


def component_logits(model, run) -> dict[str, torch.Tensor]:
    """What each head, the heads summed (`attention`), the MLP and the direct path (EOS
    embedding, b_O, b_U) write onto the logits at EOS, per prompt of a clean run: [n, O] each."""
    W_U = model.W_U  # [d, O]
    heads = run.head_results @ W_U  # [n, H, O]
    components = {columns.head(h): heads[:, h] for h in range(heads.shape[1])}
    components["attention"] = heads.sum(1)
    components["mlp"] = run.mlp_out @ W_U
    components["direct"] = run.logits - components["attention"] - components["mlp"]
    return components


def above_chance(logits: torch.Tensor, task: FactualRecallTask, batch: Batch, top: torch.Tensor,
                 strict: bool = False) -> tuple[float, float]:
    """Does a component rank the facts' answers first more often than chance?

    Chance: the share of prompts whose a* it would rank first if its pick within A_r were
    drawn independently of the subject, sum_r p(r) sum_b q_r(b) p_r(b), with q_r its
    distribution of picks and p_r that of the answers in relation r's prompts of `batch`
    (1/D for a uniform pick; more for a component that always names a common answer);
    logits [n, R*D] on those prompts. Returns (chance, z): z = (mean of `top` [F], each
    fact's share of contexts ranked first, minus chance) in standard errors
    sqrt(chance (1 - chance) / F). `strict`: a prompt on which the component's top logits in A_r
    tie (within TIE) is no pick (it ranks no answer first); else argmax's first (the one-layer rule's)."""
    R, D = task.n_relations, task.answers_per_relation
    relations = batch.relations
    block = answer_block(logits, relations, D)  # [n, D]
    picks = block.argmax(-1)  # [n] index within A_r
    target = batch.answers - relations * D  # [n]
    counted = torch.ones(len(picks))
    if strict:  # [n] 1 where the top logit beats the runner-up by more than a rounding tie
        best = block.topk(2, -1).values
        counted = (best[:, 0] - best[:, 1] > TIE).float().cpu()
    joint_pick = torch.zeros(R, D).index_put_((relations.cpu(), picks.cpu()), counted, accumulate=True)
    joint_answer = torch.zeros(R, D).index_put_((relations.cpu(), target.cpu()), torch.ones(len(target)),
                                                accumulate=True)
    per_relation = torch.bincount(relations.cpu(), minlength=R).float().clamp(min=1)  # [R] prompts of each relation
    chance = float(((joint_pick / per_relation[:, None]) * joint_answer).sum() / len(picks))
    spread = max(chance * (1 - chance), 1e-12) ** 0.5 / len(top) ** 0.5
    return chance, float((top.float().mean() - chance) / spread)
