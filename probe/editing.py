"""Edit facts where they live: a rank-one write (ROME; several facts at once, MEMIT's
batched form or its exact limit) to the MLP's W_out or to one head's W_O, returning a new
model, the original untouched.

For each edited fact (s, r) -> a_new: the key k* is the store's input at EOS averaged over
the fact's noise contexts (probe/edit_keys.py), C the keys' second moment over every fact's
prompts, and the value asked for is the least residual change that puts a_new `margin`
logits above every other answer (and a_old below it) through the frozen unembedding's
dual basis. W' = W + C^-1 k* Lambda^T, Lambda = (v* - W k*) / (k*^T C^-1 k*). Where a fact
lives in both stores, the head writes half of the change and the MLP, keyed on the model
the head's write left, the rest. What the closed form misses (the MLP reading a head's new
write, keys that vary over contexts, d_model < R*D) is made up by doubling a fact's change
until the new answer wins on the fact's prompts (`tries` times at most).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from probe import edit_keys
from probe.contexts import per_fact
from probe.hooks import has_mlp, hooked_last_logits, model_device
from probe.prompts import fact_batch
from probe.storage import StorageRule
from tasks.factual_recall import FactualRecallTask

AT = ("mlp", "ov", "both")  # where a fact is written
W_OUT, W_O = "blocks.0.mlp.W_out", "blocks.0.attn.W_O"  # the checkpoint's keys of the two stores
# the bridge's parameters that hold them: fc_out.weight = W_out^T, o.weight = W_O flattened over heads, transposed
PARAMETERS = {W_OUT: "mlp._original_component.fc_out._original_component.weight",
              W_O: "attn._original_component.o._original_component.weight"}


@dataclass(frozen=True)
class FactEdit:
    """Fact (subject, relation) gets `answer` (an answer id of the relation's block A_r),
    written at `at` (mlp, ov, both); `head` is the head an ov write goes to."""
    subject: int
    relation: int
    answer: int
    at: str = "mlp"
    head: int | None = None


@dataclass(frozen=True, eq=False)
class Edited:
    model: object  # the edited copy (TransformerBridge)
    edits: tuple[FactEdit, ...]  # as written (each ov write's head filled in)
    old_answers: tuple[int, ...]  # each edited fact's answer before the edit
    deltas: dict[str, torch.Tensor] = field(default_factory=dict)  # checkpoint key -> dW, its layout
    boosts: tuple[float, ...] = ()  # how many times each fact's closed-form change was taken


def checked_edits(model, task: FactualRecallTask, edits: Sequence[FactEdit]) -> tuple[FactEdit, ...]:
    """The edits with each ov write's head filled in (the only head of a one-head model);
    ValueError, one line, for an edit the model or the task cannot take."""
    checked, seen = [], set()
    for e in edits:
        s, r, a = e.subject, e.relation, e.answer
        if not (0 <= s < task.n_subjects and 0 <= r < task.n_relations):
            raise ValueError(f"fact {s}:{r} is outside the task (subjects 0..{task.n_subjects - 1}, "
                             f"relations 0..{task.n_relations - 1}).")
        if (s, r) in seen:
            raise ValueError(f"fact {s}:{r} is edited twice; give each fact one new answer.")
        seen.add((s, r))
        if a not in task.relation_answers(r):
            raise ValueError(f"answer {a} is not one of relation R{r}'s answers "
                             f"({task.answer_label(task.relation_answers(r)[0])} .. "
                             f"{task.answer_label(task.relation_answers(r)[-1])}).")
        if a == int(task.facts[s, r]):
            raise ValueError(f"fact {s}:{r} already answers {task.answer_label(a)}; an edit needs another answer.")
        if e.at not in AT:
            raise ValueError(f"a fact is written at one of {', '.join(AT)}, got {e.at!r}.")
        if e.at in ("mlp", "both") and not has_mlp(model):
            raise ValueError("the model has no MLP (attention only): write at ov.")
        head = e.head
        if e.at in ("ov", "both"):
            if head is None and model.cfg.n_heads > 1:
                raise ValueError(f"an ov write needs a head: the model has {model.cfg.n_heads} heads (--head H).")
            head = 0 if head is None else head
            if not 0 <= head < model.cfg.n_heads:
                raise ValueError(f"head {head} is outside the model (heads 0..{model.cfg.n_heads - 1}).")
        checked.append(FactEdit(s, r, a, e.at, head))
    if not checked:
        raise ValueError("no edits given: give at least one fact and its new answer.")
    return tuple(checked)


def held(model, task: FactualRecallTask, edits: Sequence[FactEdit], contexts: int = 8, seed: int = 0,
         known: float = StorageRule.known) -> torch.Tensor:
    """Each edited fact's accuracy on its prompts [n]; ValueError for a fact the model does
    not hold (answers it in fewer than `known` of its contexts, the storage rule's threshold)."""
    logits = _fact_logits(model, task, edits, contexts, seed)  # [n, contexts, O]
    answers = torch.tensor([int(task.facts[e.subject, e.relation]) for e in edits], device=logits.device)
    accuracy = (logits.argmax(-1) == answers[:, None]).float().mean(1)  # [n]
    for e, acc in zip(edits, accuracy.tolist()):
        if acc < known:
            raise ValueError(f"the model does not hold fact {e.subject}:{e.relation}: it answers "
                             f"{task.answer_label(int(task.facts[e.subject, e.relation]))} in "
                             f"{round(acc * contexts)} of {contexts} contexts; there is nothing to edit.")
    return accuracy


def edit_facts(model, task: FactualRecallTask, edits: Sequence[FactEdit], contexts: int = 8, seed: int = 0,
               margin: float = 2.0, form: str = "exact", ridge: float = edit_keys.RIDGE, tries: int = 4) -> Edited:
    """A copy of `model` with every edit written (module docstring); `contexts` prompts per
    fact (seed `seed`) give the keys and C, `margin` the logits by which the new answer
    should win, `form` the batched write (edit_keys.write)."""
    edits = checked_edits(model, task, edits)
    held(model, task, edits, contexts, seed)
    old = tuple(int(task.facts[e.subject, e.relation]) for e in edits)
    boosts = torch.ones(len(edits))
    for attempt in range(tries):
        edited, deltas = _written(model, task, edits, contexts, seed, margin * boosts, form, ridge)
        logits = _fact_logits(edited, task, edits, contexts, seed)  # [n, contexts, O]
        new = torch.tensor([e.answer for e in edits], device=logits.device)
        wins = (logits.argmax(-1) == new[:, None]).all(1).cpu()  # [n]
        if wins.all() or attempt == tries - 1:
            break
        boosts = torch.where(wins, boosts, 2 * boosts)
    return Edited(edited, edits, old, deltas, tuple(boosts.tolist()))


def _written(model, task, edits, contexts, seed, margins, form, ridge):
    """A copy of `model` with the heads' writes, then the MLP's (keyed on the heads' result)."""
    edited = copy.deepcopy(model)
    deltas = {}
    tokens = fact_batch(task, contexts, seed, model_device(model)).tokens  # [F_all * contexts, T]
    heads = sorted({e.head for e in edits if e.at in ("ov", "both")})
    for h in heads:
        chosen = [i for i, e in enumerate(edits) if e.at in ("ov", "both") and e.head == h]
        share = torch.tensor([0.5 if edits[i].at == "both" else 1.0 for i in chosen])
        dW = _store_write(edited, task, [edits[i] for i in chosen], tokens, contexts, "ov", h,
                          margins[chosen] * share, form, ridge)  # [d_head, d_model]
        full = torch.zeros_like(edited.W_O[0]).index_copy(0, torch.tensor([h], device=dW.device), dW[None])
        deltas[W_O] = deltas.get(W_O, 0) + full
        add_to(edited, W_O, full)
    chosen = [i for i, e in enumerate(edits) if e.at in ("mlp", "both")]
    if chosen:
        deltas[W_OUT] = _store_write(edited, task, [edits[i] for i in chosen], tokens, contexts, "mlp", None,
                                     margins[chosen], form, ridge)  # [d_mlp, d_model]
        add_to(edited, W_OUT, deltas[W_OUT])
    return edited, deltas


def _store_write(model, task, edits, tokens, contexts, store, head, margins, form, ridge) -> torch.Tensor:
    """dW of one store [d_key, d_model] for `edits`, each asking `margins[i]` logits."""
    keys = edit_keys.store_keys(model, tokens, store, head)  # [F_all * contexts, d_key]
    C = edit_keys.second_moment(keys, ridge)
    rows = torch.tensor([e.subject * task.n_relations + e.relation for e in edits], device=keys.device)
    k_star = edit_keys.fact_keys(keys, contexts)[rows]  # [n, d_key]
    logits = _fact_logits(model, task, edits, contexts, tokens=tokens)  # [n, contexts, O]
    old = torch.tensor([int(task.facts[e.subject, e.relation]) for e in edits], device=keys.device)
    new = torch.tensor([e.answer for e in edits], device=keys.device)
    change = torch.cat([edit_keys.logit_change(logits[i:i + 1], old[i:i + 1], new[i:i + 1], float(margins[i]))
                        for i in range(len(edits))])  # [n, O]
    values = edit_keys.residual_change(model.W_U.detach().float(), change)  # [n, d_model]
    return edit_keys.write(C, k_star, values, form)


def _fact_logits(model, task, edits, contexts, seed=0, tokens=None) -> torch.Tensor:
    """Logits at EOS [n, contexts, O] of the edited facts' prompts (those of fact_batch)."""
    if tokens is None:
        tokens = fact_batch(task, contexts, seed, model_device(model)).tokens
    rows = torch.tensor([(e.subject * task.n_relations + e.relation) * contexts + c
                         for e in edits for c in range(contexts)], device=tokens.device)
    return per_fact(hooked_last_logits(model, tokens[rows]).float(), contexts)


def add_to(model, key: str, delta: torch.Tensor) -> None:
    """Add `delta` (the checkpoint's layout of `key`: W_out [d_mlp, d_model], W_O [head,
    d_head, d_model]) to the bridge's parameter that holds it, in place; RuntimeError when
    the bridge's own view of the weight (model.W_out, model.W_O) does not show it."""
    before = (model.W_out if key == W_OUT else model.W_O)[0].detach().clone()
    param = next(p for name, p in model.named_parameters() if name.endswith(PARAMETERS[key]))
    with torch.no_grad():
        param += (delta if key == W_OUT else delta.reshape(-1, delta.shape[-1])).T.to(param.dtype)
    after = (model.W_out if key == W_OUT else model.W_O)[0].detach()
    if not torch.allclose(after - before, delta.to(after.dtype), atol=1e-5 * (1 + float(delta.abs().max()))):
        raise RuntimeError(f"the bridge does not hold the write to {key}: its weight layout has changed.")
