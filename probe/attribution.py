"""Direct logit attribution at the last position: what each head, the MLP and the direct
path (EOS embedding and biases) write onto the answer logits, per fact."""
from __future__ import annotations

import pandas as pd

from probe.accuracy import columns, facts_frame
from probe.contexts import answer_block, per_fact, ranks_first_in_block
from probe.hooks import clean_run
from probe.stats import ratio_with_interval, with_interval
from probe.task import FactualRecallTask


def direct_logit_attribution(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0) -> pd.DataFrame:
    """Per fact, in logit units averaged over contexts: the full margin of a* over the
    model's strongest other answer b in A_r, and each component's share of it
    (head{h}_margin, attention_margin = sum of heads, mlp_margin, direct_margin; they add
    up to margin). `X_top`: share of contexts where component X alone ranks a* first in A_r.
    `attention_share`, `mlp_share`: mean component margin / mean full margin."""
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
        top, _ = ranks_first_in_block(logits, batch.relations, batch.answers, D)
        cols.update(with_interval(f"{name}_top", per_fact(top, contexts), seed))
    for name in ("attention", "mlp"):
        cols.update(ratio_with_interval(f"{name}_share", per_fact(margin(components[name]), contexts), total, seed))
    return columns(facts_frame(task), cols)
