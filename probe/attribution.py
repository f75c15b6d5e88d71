"""Direct logit attribution at the last position: what each head, the MLP and the direct
path (EOS embedding and biases) write onto the answer logits, per fact."""
from __future__ import annotations

import pandas as pd
import torch

from probe.accuracy import columns, facts_frame
from probe.contexts import answer_block, per_fact, ranks_first_in_block
from probe.hooks import clean_run
from probe.stats import ratio_with_interval, with_interval
from probe.task import FactualRecallTask

COMPONENTS = ("attention", "mlp")


def direct_logit_attribution(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                             chance: float = 4.0) -> pd.DataFrame:
    """Per fact, in logit units averaged over contexts (each with a 95% interval):

    - `margin`: a* over the model's strongest other answer b in A_r; `X_margin` for
      X = head{h}, attention (heads summed), mlp, direct (EOS embedding, biases): X's part
      of it (they add up to `margin`).
    - `X_top`: share of contexts where X alone ranks a* first in A_r.
    - `attention_own_margin`, `mlp_own_margin`: X's own margin of a* over X's strongest
      other answer in A_r, X judged alone whatever the other component writes;
      `X_chance_margin` (one number per model, see `chance_margin`): the margin X reaches
      by chance; `X_decides`: share of contexts where X alone ranks a* first in A_r with a
      margin above its chance margin (`chance` times the RMS margin of its chance picks).
    - `attention_share`, `mlp_share`: X's margin over the full margin (means over contexts);
      NaN where the full margin is not positive or both components' margins are negative,
      where a share means nothing.
    """
    D = task.answers_per_relation
    batch, run = clean_run(model, task, contexts, seed)
    W_U = model.W_U  # [d, O]
    heads = run["head_results"] @ W_U  # [n, H, O]
    components = {f"head{h}": heads[:, h] for h in range(heads.shape[1])}
    components["attention"] = heads.sum(1)
    components["mlp"] = run["mlp_out"] @ W_U
    components["direct"] = run["logits"] - components["attention"] - components["mlp"]  # EOS embedding, b_O, b_U

    block = answer_block(run["logits"], batch.relations, D)  # [n, D]
    target = batch.answers - batch.relations * D
    rival = block.scatter(-1, target[:, None], float("-inf")).argmax(-1) + batch.relations * D  # [n] answer id b

    def margin(logits):  # a* over the fixed rival b, per prompt [n]
        return logits.gather(-1, batch.answers[:, None])[:, 0] - logits.gather(-1, rival[:, None])[:, 0]

    total = per_fact(margin(run["logits"]), contexts)  # [F, C]
    cols = with_interval("margin", total, seed)
    for name, logits in components.items():
        cols.update(with_interval(f"{name}_margin", per_fact(margin(logits), contexts), seed))
        top, own = ranks_first_in_block(logits, batch.relations, batch.answers, D)
        cols.update(with_interval(f"{name}_top", per_fact(top, contexts), seed))
        if name in COMPONENTS:
            cols.update(with_interval(f"{name}_own_margin", per_fact(own, contexts), seed))
            level = chance_margin(logits, run["logits"].argmax(-1), batch.relations, batch.answers, D, chance)
            cols[f"{name}_chance_margin"] = torch.full((task.n_facts,), level)
            cols.update(with_interval(f"{name}_decides", per_fact(top * (own > level), contexts), seed))
    means = {name: cols[f"{name}_margin"] for name in COMPONENTS}
    meaningless = (cols["margin"] <= 0) | ((means["attention"] < 0) & (means["mlp"] < 0))  # [F]
    for name in COMPONENTS:
        shares = ratio_with_interval(f"{name}_share", per_fact(margin(components[name]), contexts), total, seed)
        cols.update({k: v.masked_fill(meaningless, float("nan")) for k, v in shares.items()})
    return columns(facts_frame(task), cols)


def chance_margin(logits: torch.Tensor, model_answers: torch.Tensor, relations: torch.Tensor,
                  answers: torch.Tensor, D: int, times: float) -> float:
    """The margin (logit units) beyond which a component's pick is clear of chance: `times`
    the root-mean-square margin of its top answer over its runner-up in A_r, over the
    prompts where that top answer is wrong and not the model's answer either (picks nothing
    acted on; the model's own wrong beliefs are left out). 0 when it never picks so.
    A random OV circuit ranks a* first for about 1/D of the facts with margins of this size."""
    block = answer_block(logits, relations, D)  # [n, D]
    best, runner_up = block.topk(2, -1).values.unbind(-1)  # [n], [n]
    picked = block.argmax(-1) + relations * D  # [n] answer id
    chance_picks = (picked != answers) & (picked != model_answers)
    if not chance_picks.any():
        return 0.0
    return times * float((best - runner_up)[chance_picks].float().pow(2).mean().sqrt())
