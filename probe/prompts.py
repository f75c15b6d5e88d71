"""The prompts every fact instrument reads: `contexts` prompts per fact, the clean run on
them and the table of facts, built once (`FactPrompts.build`) and passed to each
instrument, as TransformerLens's patching passes one clean cache to every measurement."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from probe import columns
from probe.contexts import per_fact
from probe.hooks import CleanRun, clean_run, model_device
from tasks.factual_recall import Batch, FactualRecallTask


def fact_batch(task: FactualRecallTask, contexts: int, seed: int, device="cpu") -> Batch:
    """`contexts` prompts per fact (random positions and noise), fact-major: prompt i holds
    fact i // contexts, facts in the order of task.all_facts()."""
    subjects, relations, _ = task.all_facts()
    generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
    return task.fact_prompts(subjects.repeat_interleave(contexts), relations.repeat_interleave(contexts), generator)


@dataclass(frozen=True, eq=False)
class FactPrompts:
    """The fact prompts of one model and the clean run on them. It holds tensors, not the
    model: after the weights change it is stale, build a new one."""
    batch: Batch  # [n = F * contexts] prompts, fact-major, on the model's device
    run: CleanRun  # the model without hooks on batch.tokens, read at EOS
    facts: pd.MultiIndex  # [F] (subject, relation, answer), in the order of task.all_facts()
    contexts: int
    seed: int

    @classmethod
    def build(cls, model, task: FactualRecallTask, contexts: int = 8, seed: int = 0) -> FactPrompts:
        batch = fact_batch(task, contexts, seed, model_device(model))
        facts = pd.MultiIndex.from_arrays([t.numpy() for t in task.all_facts()], names=columns.FACT)
        return cls(batch, clean_run(model, batch.tokens), facts, contexts, seed)

    def per_fact(self, values: torch.Tensor) -> torch.Tensor:
        """[n, ...] per prompt -> [F, contexts, ...]."""
        return per_fact(values, self.contexts)

    def frame(self, values: dict[str, torch.Tensor]) -> pd.DataFrame:
        """Columns of one value per fact [F], indexed by the fact."""
        return pd.DataFrame({k: v.detach().cpu().numpy() for k, v in values.items()}, index=self.facts)


def given_or_built(model, task: FactualRecallTask, contexts: int, seed: int,
                   prompts: FactPrompts | None) -> FactPrompts:
    """`prompts` when given (their own contexts and seed hold), else FactPrompts.build."""
    return prompts if prompts is not None else FactPrompts.build(model, task, contexts, seed)


def one_context_prompts(task: FactualRecallTask, subjects: torch.Tensor, relations: torch.Tensor,
                        seed: int = 0) -> Batch:
    """Prompts for the given facts [n] that share one context (the same noise, subject
    position and relation position), as TransformerLens's position-wise patching
    (`get_act_patch_resid_pre` and kin) needs: one position means one thing in every prompt."""
    context = task.eval_set(1, seed=seed)
    n = len(subjects)
    tokens = context.tokens.repeat(n, 1)  # [n, T]
    tokens[:, context.subject_pos[0]] = subjects
    tokens[:, context.relation_pos[0]] = task.relation_token(relations)
    return Batch(tokens, subjects, relations, task.facts[subjects, relations],
                 context.subject_pos.expand(n), context.relation_pos.expand(n))
