"""The prompts every fact instrument reads: `contexts` prompts per fact, the clean run on
them and the table of facts, built once (`FactPrompts.build`) and passed to each
instrument, as TransformerLens's patching passes one clean cache to every measurement."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

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
    model: after the weights change it is stale, build a new one.

    Built for some facts only (`facts=[(s, r), ...]`), each fact gets the very prompts it
    gets among all of them, and `population` holds every fact's prompts and clean run: the
    model-wide references (ablation means, chance levels, patching's swaps) are read there,
    so each measured fact's row equals its row in a run over every fact."""
    batch: Batch  # [n = F * contexts] prompts, fact-major, on the model's device
    run: CleanRun  # the model without hooks on batch.tokens, read at EOS
    facts: pd.MultiIndex  # [F] (subject, relation, answer), in the order of task.all_facts() (or as chosen)
    contexts: int
    seed: int
    population: FactPrompts | None = None  # every fact's prompts, when these are some of them
    rows: torch.Tensor | None = None  # [n] where each prompt sits in population's prompts

    @classmethod
    def build(cls, model, task: FactualRecallTask, contexts: int = 8, seed: int = 0,
              facts: Sequence[tuple[int, int]] | None = None, references: bool = True) -> FactPrompts:
        """The prompts of every fact, or of `facts` (distinct (subject, relation) pairs) with
        every fact's prompts and clean run as their `population`, the chosen prompts' run cut
        from it. `references=False` leaves every fact's clean run out: enough for activation
        patching, which reads every fact's prompts only, for its swaps (`population_batch`)."""
        batch = fact_batch(task, contexts, seed, model_device(model))
        if facts is None:
            return cls(batch, clean_run(model, batch.tokens), fact_index(*task.all_facts()), contexts, seed)
        chosen = torch.tensor([s * task.n_relations + r for s, r in checked_facts(task, facts)])  # [F]
        rows = (chosen[:, None] * contexts + torch.arange(contexts)).flatten().to(batch.tokens.device)  # [n]
        picked = Batch(*(getattr(batch, f.name)[rows] for f in fields(Batch)))
        every, run = None, None
        if references:
            every = cls(batch, clean_run(model, batch.tokens), fact_index(*task.all_facts()), contexts, seed)
            run = CleanRun(*(getattr(every.run, f.name)[rows] for f in fields(CleanRun)))
        subjects, relations, answers = task.all_facts()
        return cls(picked, run if run is not None else clean_run(model, picked.tokens),
                   fact_index(subjects[chosen], relations[chosen], answers[chosen]), contexts, seed, every, rows)

    @property
    def every_fact(self) -> FactPrompts:
        """The prompts of every fact (these, when they are): the model-wide references."""
        if self.rows is not None and self.population is None:
            raise ValueError("these prompts of chosen facts were built without every fact's references "
                             "(references=False): build them with references=True.")
        return self if self.population is None else self.population

    def population_batch(self, task: FactualRecallTask) -> Batch:
        """Every fact's prompts [F_all * contexts] (these, when they are every fact's)."""
        if self.rows is None:
            return self.batch
        return fact_batch(task, self.contexts, self.seed, self.batch.tokens.device)

    def fact_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(subjects, relations, answers) [F] of the facts measured, on the prompts' device."""
        device = self.batch.tokens.device
        return tuple(torch.tensor(self.facts.get_level_values(i).to_numpy(), device=device) for i in range(3))

    def per_fact(self, values: torch.Tensor) -> torch.Tensor:
        """[n, ...] per prompt -> [F, contexts, ...]."""
        return per_fact(values, self.contexts)

    def frame(self, values: dict[str, torch.Tensor]) -> pd.DataFrame:
        """Columns of one value per fact [F], indexed by the fact."""
        return pd.DataFrame({k: v.detach().cpu().numpy() for k, v in values.items()}, index=self.facts)


def fact_index(subjects: torch.Tensor, relations: torch.Tensor, answers: torch.Tensor) -> pd.MultiIndex:
    """The index of every per-fact frame: (subject, relation, answer) ids."""
    return pd.MultiIndex.from_arrays([t.numpy() for t in (subjects, relations, answers)], names=columns.FACT)


def checked_facts(task: FactualRecallTask, facts: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """`facts` as distinct (subject, relation) pairs of the task, in their order; a pair
    outside the task is refused with one line."""
    pairs = []
    for fact in facts:
        try:
            s, r = (int(x) for x in fact)
        except (TypeError, ValueError):
            raise ValueError(f"a fact is a (subject, relation) pair of integers, got {fact!r}.") from None
        if not (0 <= s < task.n_subjects and 0 <= r < task.n_relations):
            raise ValueError(f"fact ({s}, {r}) is outside the task (subjects 0..{task.n_subjects - 1}, "
                             f"relations 0..{task.n_relations - 1}).")
        pairs.append((s, r))
    if not pairs:
        raise ValueError("no facts chosen: give at least one (subject, relation) pair.")
    return list(dict.fromkeys(pairs))


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
