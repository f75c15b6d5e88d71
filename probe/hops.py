"""Where each hop of two-hop recall lives: the storage rule at depth (probe/paths.py,
probe/storage.py) and causal tracing (probe/causal_tracing.py) on a two-hop model's prompts.

Hop 1 and the one-hop facts: every one-hop fact (s, r) with either of r's tokens (the first set's,
`token_set` 1, or the second's, 2), `contexts` prompts each, split into paths and judged store by
store. Hop 2: every composition (s, r1, r2) on two-hop prompts, its answer r2(b), b = r1(s), judged
likewise; a composition `reuses` the one-hop memory when a store keeping it also keeps the one-hop
fact (b, r2) with r2's second-set token (the token the two-hop prompt holds).

The two-hop task's relations share one answer vocabulary (the S entities): the rule reads one answer
block A = every entity, so a store's path is judged with the others at their mean over every prompt
and its picks against the chance of picks that ignore the prompt. Causal tracing names the roles of a
two-hop prompt subject, r1, r2 (then noise, last) and corrupts one of them.
"""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import torch

from probe import columns
from probe.causal_tracing import NOISE_SCALE, embedding_std, trace_prompts
from probe.contexts import correct
from probe.paths import path_measurements
from probe.prompts import FactPrompts
from probe.stats import share_with_interval
from probe.storage import StorageRule, stores_of
from tasks.batch import Batch
from tasks.two_hop import TwoHopBatch

ONE_HOP_INDEX = ("subject", "relation", "token_set", "answer")
TWO_HOP_INDEX = ("subject", "r1", "r2", "answer")
ROLES = ("subject", "r1", "r2")  # the named positions of a two-hop prompt, corrupted one at a time
REUSES = "reuses_one_hop_store"
SHORTCUTS = ("", "first_hop_skipped", "bridge")  # a composition whose answer r2(s) (or b) also is: no composing needed


def _prompts(task, subjects, first, second, answers, contexts: int, seed: int) -> TwoHopBatch:
    """`contexts` prompts [F * contexts] per row of the [F] tensors, fact-major: subject at a random
    position, token `first` at another, `second` (-1: none, noise kept) at a third, noise elsewhere, EOS last."""
    g = torch.Generator().manual_seed(seed)
    T, S, R = task.seq_len, task.n_subjects, task.n_relations
    s, a, b, answer = (x.repeat_interleave(contexts) for x in (subjects, first, second, answers))
    n = len(s)
    tokens = torch.randint(0, task.n_noise, (n, T), generator=g) + S + 2 * R  # [n, T]
    tokens[:, -1] = task.eos
    positions = torch.rand(n, T - 1, generator=g).argsort(-1)[:, :3]  # [n, 3] distinct, before the last
    rows = torch.arange(n)
    tokens[rows, positions[:, 0]] = s
    tokens[rows, positions[:, 1]] = a
    two = b >= 0
    tokens[rows[two], positions[two, 2]] = b[two]
    return TwoHopBatch(tokens, s, torch.stack([a, b], -1), answer, answer, torch.where(two, 2, 1), positions)


def one_hop_prompts(task, contexts: int = 8, seed: int = 0) -> tuple[TwoHopBatch, pd.MultiIndex]:
    """Every one-hop fact (s, r, token set) [2 S R], `contexts` prompts each (relations [n, 2]: the
    relation token's id and -1), and their index (ONE_HOP_INDEX)."""
    S, R = task.n_subjects, task.n_relations
    fact = torch.arange(2 * S * R)
    s, r, hop = fact // (2 * R), fact // 2 % R, fact % 2 + 1  # [F] subject-major, then relation, then set
    answers = task.facts[s, r]
    batch = _prompts(task, s, task.relation_token(r, 1) + (hop - 1) * R, torch.full_like(s, -1), answers,
                     contexts, seed)
    batch = TwoHopBatch(batch.tokens, batch.subjects, torch.stack([r.repeat_interleave(contexts),
                                                                   batch.relations[:, 1]], -1),
                        torch.full_like(batch.bridges, -1), batch.answers, batch.hops, batch.positions)
    return batch, pd.MultiIndex.from_arrays([s.numpy(), r.numpy(), hop.numpy(), answers.numpy()], names=ONE_HOP_INDEX)


def composition_prompts(task, triples: torch.Tensor, contexts: int = 8,
                        seed: int = 0) -> tuple[TwoHopBatch, pd.MultiIndex]:
    """`contexts` two-hop prompts per composition of `triples` [F] (ids s R^2 + r1 R + r2), and
    their index (TWO_HOP_INDEX)."""
    s, r1, r2, bridge, answer = task.composition(triples)
    batch = _prompts(task, s, task.relation_token(r1, 1), task.relation_token(r2, 2), answer, contexts, seed)
    batch = TwoHopBatch(batch.tokens, batch.subjects, torch.stack([r1, r2], -1).repeat_interleave(contexts, 0),
                        bridge.repeat_interleave(contexts), batch.answers, batch.hops, batch.positions)
    return batch, pd.MultiIndex.from_arrays([s.numpy(), r1.numpy(), r2.numpy(), answer.numpy()], names=TWO_HOP_INDEX)


def roles(batch: TwoHopBatch) -> dict[str, torch.Tensor]:
    """The named positions [n] of two-hop prompts: subject, r1, r2."""
    return dict(zip(ROLES, batch.positions.unbind(-1)))


def located(model, task, batch: TwoHopBatch, index: pd.MultiIndex, contexts: int, seed: int = 0,
            rule: StorageRule = StorageRule()) -> tuple[pd.DataFrame, list]:
    """Per fact of `index` (its prompts in `batch`): the accuracy, every store's path measurements and
    the rule's stores (probe.storage.stores_of), with one answer block of every entity."""
    block = Batch(batch.tokens, batch.subjects, torch.zeros_like(batch.subjects), batch.answers,
                  batch.positions[:, 0], batch.positions[:, 1])
    prompts = FactPrompts(block, None, index, contexts, seed)
    one_block = SimpleNamespace(n_relations=1, answers_per_relation=task.n_subjects)
    paths, stores, writes = path_measurements(model, one_block, prompts)
    accuracy = prompts.frame(share_with_interval(columns.ACCURACY,
                                                 prompts.per_fact(correct(writes.logits, batch.answers))))
    facts = pd.concat([accuracy, paths], axis=1)
    return pd.concat([facts, stores_of(rule, facts, stores)], axis=1), stores


def reuse(task, one_hop: pd.DataFrame, two_hop: pd.DataFrame) -> pd.DataFrame:
    """`two_hop` (per composition, stores_of's columns) with its held-out flag, bridge b, `shortcut` (the
    answer r2(b) is also r2(s), first_hop_skipped, or b itself, bridge: an answer that needs no composing),
    the stores of the one-hop fact (b, r2) by r2's second-set token (`one_hop_stores`) and REUSES: a store
    keeps both."""
    s, r1, r2 = (torch.tensor(two_hop.index.get_level_values(k).to_numpy()) for k in TWO_HOP_INDEX[:3])
    R = task.n_relations
    held = set(task.held_out.tolist())
    bridge = task.facts[s, r1]
    kept = one_hop.xs(2, level="token_set")[columns.STORE_LIST].droplevel("answer")
    theirs = [kept.loc[(b, r)] for b, r in zip(bridge.tolist(), r2.tolist())]
    ours = two_hop[columns.STORE_LIST]
    both = [bool(set(a.split(";")) & set(b.split(";")) - {""}) for a, b in zip(ours, theirs)]
    answer = torch.tensor(two_hop.index.get_level_values("answer").to_numpy())
    shortcut = [SHORTCUTS[1] if skipped else SHORTCUTS[2] if same else SHORTCUTS[0] for skipped, same in
                zip((task.facts[s, r2] == answer).tolist(), (bridge == answer).tolist())]
    return two_hop.assign(held_out=[t in held for t in (s * R * R + r1 * R + r2).tolist()],
                          bridge=bridge.numpy(), shortcut=shortcut, one_hop_stores=theirs, **{REUSES: both})


def resample(task, corrupt: str):
    """The resampling corruption of a two-hop prompt's `corrupt` role: another token of its kind
    (entity, first-set or second-set relation) whose composition's answer differs, drawn uniformly
    (the prompt keeps its own where none does): (chunk, generator) -> tokens [n, T]."""
    def corrupted(batch: TwoHopBatch, generator: torch.Generator) -> torch.Tensor:
        facts = task.facts.to(batch.tokens.device)
        s, r1, r2 = batch.subjects, batch.relations[:, 0], batch.relations[:, 1]
        n, S, R = len(s), task.n_subjects, task.n_relations
        if corrupt == "subject":
            own, answers, base = s, facts[facts[:, r1].T, r2[:, None]], 0  # [n, S]
        elif corrupt == "r1":
            own, answers, base = r1, facts[facts[s], r2[:, None]], S  # [n, R]
        else:
            own, answers, base = r2, facts[facts[s, r1]], S + R
        ids = torch.arange(answers.shape[1], device=s.device)
        allowed = (ids[None] != own[:, None]) & (answers != batch.answers[:, None])  # [n, count]
        scores = torch.rand(n, answers.shape[1], generator=generator, device=s.device).masked_fill(~allowed, -1)
        other = torch.where(allowed.any(-1), scores.argmax(-1), own)  # [n]
        tokens = batch.tokens.clone()
        column = dict(zip(ROLES, range(3)))[corrupt]
        tokens[torch.arange(n), batch.positions[:, column]] = other + base
        return tokens
    return corrupted


def role_tokens(task, corrupt: str) -> list[int]:
    """The input ids of the corrupted role's kind: every entity, or every relation token of r1's
    (first) or r2's (second) set."""
    if corrupt == "subject":
        return list(range(task.n_subjects))
    return [task.relation_token(r, 1 if corrupt == "r1" else 2) for r in range(task.n_relations)]


def trace_compositions(model, task, triples: torch.Tensor, generator: torch.Generator, contexts: int = 2,
                       seed: int = 0, corrupt: str = "subject", noise: str = "gaussian", draws: int = 4,
                       progress=None) -> pd.DataFrame:
    """Causal tracing (probe.causal_tracing.trace_prompts) of the compositions `triples` on two-hop
    prompts, the role `corrupt` (ROLES) corrupted by Gaussian noise of 3 times its kind's embedding
    std, or resampled: one row per composition ('s:r1:r2'), layer, role and component."""
    if corrupt not in ROLES:
        raise ValueError(f"corrupt must be one of {', '.join(ROLES)}, got {corrupt!r}.")
    batch, index = composition_prompts(task, triples, contexts, seed)
    batch = batch.to(model.W_E.device)
    corruption = (NOISE_SCALE * embedding_std(model, role_tokens(task, corrupt)) if noise == "gaussian"
                  else resample(task, corrupt))
    return trace_prompts(model, batch, index, roles(batch), corrupt, corruption, generator, draws, progress)
