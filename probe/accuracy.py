"""Per-fact accuracy over many contexts (random positions and noise)."""
from __future__ import annotations

import pandas as pd

from probe import columns
from probe.contexts import correct
from probe.hooks import Hook, rerun_last_position
from probe.prompts import FactPrompts, given_or_built
from probe.stats import share_with_interval
from tasks.factual_recall import FactualRecallTask


def per_fact_accuracy(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                      fwd_hooks: tuple[Hook, ...] = (), name: str = columns.ACCURACY,
                      prompts: FactPrompts | None = None) -> pd.DataFrame:
    """Share of a fact's prompts whose top answer (over all R*D) is a*, with its 95%
    Wilson interval over contexts, indexed by the fact; `fwd_hooks` edit the run
    (ablations). `prompts`: built here (`contexts` per fact, `seed`) when not given."""
    prompts = given_or_built(model, task, contexts, seed, prompts)
    logits = rerun_last_position(model, prompts.run, fwd_hooks) if fwd_hooks else prompts.run.logits
    hits = correct(logits, prompts.batch.answers)  # [n]
    return prompts.frame(share_with_interval(name, prompts.per_fact(hits)))
