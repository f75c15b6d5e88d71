"""The circuit by its attention: the previous-token head and the induction head found by their scores
(probe.induction.head_scores), and circuitsvis views of every head on one held-out sequence, on one
offline HTML page (circuitsvis's inline script: nothing is fetched)."""
from __future__ import annotations

import html

import pandas as pd
import torch

from analyses.visualize import offline_html, page
from probe.induction import clean_batch, head_scores


def attention_view(model, tokens: torch.Tensor, layer: int):
    """circuitsvis attention_heads view of one layer's heads on one sequence [T] (characters shown)."""
    from circuitsvis.attention import attention_heads

    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens[None], names_filter=f"blocks.{layer}.attn.hook_pattern")
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0].float().cpu()  # [H, T, T]
    labels = [repr(c)[1:-1] or " " for c in model.to_str_tokens(tokens)]
    return attention_heads(attention=torch.round(pattern, decimals=4).tolist(), tokens=labels,
                           attention_head_names=[f"L{layer}H{h}" for h in range(pattern.shape[0])],
                           max_value=1.0, min_value=0.0, mask_upper_tri=True)


def _head(row: pd.Series, score: str) -> str:
    return f"L{int(row['layer'])}H{int(row['head'])} ({row[score]:.2f})"


def circuit_page(model, task, title: str, n: int = 64, length: int = 48) -> tuple[str, pd.DataFrame]:
    """(the HTML page, the head scores table) of a model: scores on n held-out sequences, views of the
    first `length` characters of one of them, layer by layer."""
    batch = clean_batch(model, task, n)
    scores = head_scores(model, task, batch)
    tokens = batch.tokens[0, :length]
    triggers = ", ".join(repr(task.token_label(int(q))) + " -> " + repr(task.token_label(int(o)))
                         for q, o in zip(batch.triggers[0], batch.outputs[0]))
    best = {col: scores.loc[scores[col].idxmax()] for col in ("previous_token", "induction")}
    body = [f"<p>Held-out sequence 0: triggers {html.escape(triggers)}. Scores over {n} sequences: "
            "<b>previous_token</b> = share of a query's attention on the position before it; "
            "<b>induction</b> = share, at in-context positions (a trigger seen before), on the positions "
            "that follow an earlier occurrence of the query's token.</p>",
            scores.to_html(index=False, float_format="%.3f"),
            f"<p>The previous-token head: {_head(best['previous_token'], 'previous_token')}; "
            f"the induction head: {_head(best['induction'], 'induction')}.</p>"]
    for layer in range(model.cfg.n_layers):
        body.append(f"<h2>Layer {layer}</h2>")
        body.append(offline_html(attention_view(model, tokens, layer)))
    return page(title, "\n".join(body)), scores
