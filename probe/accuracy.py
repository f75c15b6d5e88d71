"""Per-fact accuracy over many contexts (random positions and noise)."""
from __future__ import annotations

import pandas as pd
import torch

from probe.contexts import correct, fact_run, per_fact
from probe.hooks import CleanRun, Hook, rerun_last_position
from probe.stats import with_interval
from tasks.factual_recall import FactualRecallTask


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def facts_frame(task: FactualRecallTask) -> pd.DataFrame:
    """One row per fact (s, r) with its answer a*(s, r), subject-major."""
    subjects, relations, answers = task.all_facts()
    return pd.DataFrame({"subject": subjects.numpy(), "relation": relations.numpy(), "answer": answers.numpy()})


def columns(frame: pd.DataFrame, values: dict[str, torch.Tensor]) -> pd.DataFrame:
    """`frame` with tensor columns [n_facts] added."""
    return frame.assign(**{k: v.detach().cpu().numpy() for k, v in values.items()})


def per_fact_accuracy(model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
                      fwd_hooks: tuple[Hook, ...] = (), name: str = "accuracy",
                      run: CleanRun | None = None) -> pd.DataFrame:
    """Share of a fact's `contexts` prompts whose top answer (over all R*D) is a*, with its
    95% bootstrap interval over contexts; `fwd_hooks` edit the run (ablations). `run`: the
    clean run on these prompts (contexts.fact_run), computed here when not given."""
    batch, run = fact_run(model, task, contexts, seed, run)
    logits = rerun_last_position(model, run, fwd_hooks) if fwd_hooks else run.logits
    hits = correct(logits, batch.answers)  # [n]
    return columns(facts_frame(task), with_interval(name, per_fact(hits, contexts), seed))
