"""Edit facts where they live: a rank-one write (ROME; several facts at once, MEMIT's
batched form or its exact limit) to an MLP's W_out or to one head's W_O of a chosen block,
returning a new model, the original untouched.

For each edited fact (s, r) -> a_new: the key k* is the store's input averaged over the
fact's noise contexts (probe/edit_keys.py: at the last position, or for an MLP at the
subject's position), C the keys' second moment over every fact's prompts (at the subject's
position: over every position, since the write reaches them all), and the value asked for is
the least residual change that puts a_new `margin` logits above every other answer (and
a_old below it): through the frozen unembedding's dual basis for the last block's write at
the last position, else through the later blocks' first-order map (edit_keys.output_map,
in W_U's place), or with value='optimise' by ROME's optimisation (probe/edit_values.py); the
default 'auto' keeps the closed form where it (doubled as below) makes a_new win on all the
fact's prompts, and takes ROME's v* for the facts where it does not. A key under
KEY_FLOOR of the keys' typical norm carries nothing: the write is refused (EmptyKey), not
blown up by C^-1. W' = W + C^-1 k* Lambda^T, Lambda = (v* - W k*) / (k*^T C^-1 k*). Where a
fact lives in both stores, the head writes half of the change and the MLP, keyed on the
model the head's write left, the rest. What the closed form misses (the block's MLP reading
its heads' new write, the later blocks past first order, keys that vary over contexts,
d_model < R*D) is made up by doubling a fact's
change (or v*) until the new answer wins on the fact's prompts (`tries` times at most).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from probe import edit_keys, edit_values
from probe.contexts import per_fact
from probe.hooks import has_mlp, hooked_last_logits, model_device
from probe.prompts import fact_batch
from probe.storage import StorageRule
from tasks.factual_recall import FactualRecallTask

AT = ("mlp", "ov", "both")  # where a fact is written
POSITIONS = ("last", "subject")  # where an MLP write's key is read
TIE = 0.01  # heads' shares restored (and their keys' norms, relative) this close are a tie


def store_key(store: str, layer: int = 0) -> str:
    """The checkpoint's key of a store's matrix in block `layer`."""
    return f"blocks.{layer}.mlp.W_out" if store == "mlp" else f"blocks.{layer}.attn.W_O"


W_OUT, W_O = store_key("mlp"), store_key("ov")  # block 0's: a one-layer model's two stores
# the bridge's parameters that hold them: fc_out.weight = W_out^T, o.weight = W_O flattened over heads, transposed
PARAMETERS = {"W_out": "mlp._original_component.fc_out._original_component.weight",
              "W_O": "attn._original_component.o._original_component.weight"}


@dataclass(frozen=True)
class FactEdit:
    """Fact (subject, relation) gets `answer` (an answer id of the relation's block A_r),
    written at `at` (mlp, ov, both) of block `layer` (None: the last block at the last
    position, block 0 at the subject's); `head` is the head an ov write goes to, `position`
    where an MLP write's key is read (last, subject)."""
    subject: int
    relation: int
    answer: int
    at: str = "mlp"
    head: int | None = None
    layer: int | None = None
    position: str = "last"


@dataclass(frozen=True, eq=False)
class Edited:
    model: object  # the edited copy (TransformerBridge)
    edits: tuple[FactEdit, ...]  # as written (each ov write's head and each layer filled in)
    old_answers: tuple[int, ...]  # each edited fact's answer before the edit
    deltas: dict[str, torch.Tensor] = field(default_factory=dict)  # checkpoint key -> dW, its layout
    boosts: tuple[float, ...] = ()  # how many times each fact's value (closed-form change, or v*) was taken
    optimised: tuple[bool, ...] = ()  # whether each fact's value is ROME's v* (else the closed form)


def carrying_head(restored: Sequence[float], key_norms: Sequence[float]) -> int:
    """The head that carries a fact's subject: the largest share restored through it when the
    subject is patched. Heads within TIE of the best tie; a tie goes to the largest norm of
    the fact's key at the head (within TIE of it, relative), then to the lowest index: never
    to float noise, and never to a head whose key is empty where a tied head's is not."""
    best = max(restored)
    tied = [h for h, x in enumerate(restored) if x >= best - TIE]
    top = max(key_norms[h] for h in tied)
    return min(h for h in tied if key_norms[h] >= (1 - TIE) * top)


def checked_edits(model, task: FactualRecallTask, edits: Sequence[FactEdit]) -> tuple[FactEdit, ...]:
    """The edits with each ov write's head filled in (the only head of a one-head model) and
    each layer; ValueError, one line, for an edit the model or the task cannot take."""
    checked, seen, L = [], set(), model.cfg.n_layers
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
        if e.position not in POSITIONS:
            raise ValueError(f"a key is read at one of {', '.join(POSITIONS)}, got {e.position!r}.")
        if e.position == "subject" and e.at != "mlp":
            raise ValueError("a key at the subject's position is an MLP's (--at mlp): a head's key is read at "
                             "the last position.")
        layer = e.layer if e.layer is not None else (L - 1 if e.position == "last" else 0)
        if not 0 <= layer < L:
            raise ValueError(f"layer {layer} is outside the model (layers 0..{L - 1}).")
        if e.position == "subject" and layer == L - 1:
            raise ValueError(f"an MLP write at the subject's position needs a later block's heads to carry it to "
                             f"the last position: layer {layer} is the model's last"
                             + (f" (use {'0' if L == 2 else f'0..{L - 2}'})." if L > 1 else "."))
        head = e.head
        if e.at in ("ov", "both"):
            if head is None and model.cfg.n_heads > 1:
                raise ValueError(f"an ov write needs a head: the model has {model.cfg.n_heads} heads (--head H).")
            head = 0 if head is None else head
            if not 0 <= head < model.cfg.n_heads:
                raise ValueError(f"head {head} is outside the model (heads 0..{model.cfg.n_heads - 1}).")
        checked.append(FactEdit(s, r, a, e.at, head, layer, e.position))
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
               margin: float = 2.0, form: str = "exact", ridge: float = edit_keys.RIDGE, tries: int = 4,
               value: str = "auto") -> Edited:
    """A copy of `model` with every edit written (module docstring); `contexts` prompts per
    fact (seed `seed`) give the keys and C, `margin` the logits by which the new answer
    should win, `form` the batched write (edit_keys.write), `value` how each write's value is
    found: `closed` (the margin through W_U or the later blocks' first-order map), `optimise`
    (ROME's v*, probe/edit_values.py; doubled as the closed form's where it does not win), or
    `auto` (the closed form for the facts it wins, then ROME's v* for the others)."""
    if value not in edit_values.VALUES:
        raise ValueError(f"a write's value is one of {', '.join(edit_values.VALUES)}, got {value!r}.")
    edits = checked_edits(model, task, edits)
    held(model, task, edits, contexts, seed)
    old = tuple(int(task.facts[e.subject, e.relation]) for e in edits)
    new = torch.tensor([e.answer for e in edits])
    optimise = torch.full((len(edits),), value == "optimise")  # [n] whose value is ROME's v*
    found = {}  # ROME's v* of each write, by the model it was keyed on: found once, not on every try
    edited, deltas, boosts, wins = _tried(model, task, edits, contexts, seed, margin, form, ridge, tries, new, optimise,
                                          torch.ones(len(edits)), found)
    if value == "auto" and not wins.all():  # ROME's v* for the facts the closed form does not reach
        optimise = ~wins
        edited, deltas, boosts, wins = _tried(model, task, edits, contexts, seed, margin, form, ridge, tries, new,
                                              optimise, torch.where(optimise, 1.0, boosts), found)
    return Edited(edited, edits, old, deltas, tuple(boosts.tolist()), tuple(optimise.tolist()))


def _tried(model, task, edits, contexts, seed, margin, form, ridge, tries, new, optimise, boosts, found):
    """The writes, each fact's value doubled until its new answer wins on its prompts (`tries`
    writes at most): (edited model, deltas, boosts [n], wins [n])."""
    for attempt in range(tries):
        edited, deltas = _written(model, task, edits, contexts, seed, margin * boosts, form, ridge, optimise, margin,
                                  found)
        wins = _wins(edited, task, edits, contexts, seed, new)
        if wins.all() or attempt == tries - 1:
            break
        boosts = torch.where(wins, boosts, 2 * boosts)
    return edited, deltas, boosts, wins


def _wins(model, task, edits, contexts, seed, new: torch.Tensor) -> torch.Tensor:
    """Whether each edit's new answer (ids `new` [n]) wins on all its prompts [n], on the CPU."""
    logits = _fact_logits(model, task, edits, contexts, seed)  # [n, contexts, O]
    return (logits.argmax(-1) == new.to(logits.device)[:, None]).all(1).cpu()


def _writes(edits: Sequence[FactEdit]) -> list:
    """(layer, store, head, position) -> the edits written there, in the forward's order:
    block by block, a block's heads before its MLP."""
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(edits):
        if e.at in ("ov", "both"):
            groups.setdefault((e.layer, 0, e.head, "last"), []).append(i)
        if e.at in ("mlp", "both"):
            groups.setdefault((e.layer, 1, -1, e.position), []).append(i)
    return sorted(groups.items())


def _written(model, task, edits, contexts, seed, margins, form, ridge, optimise, margin, found: dict):
    """A copy of `model` with every write made in the forward's order (each keyed on the model
    the earlier writes left); the facts where `optimise` [n] take ROME's v* (taken
    margins / margin times), kept in `found` under the write and the margins of the writes
    before it, which fix the model it is keyed on."""
    edited = copy.deepcopy(model)
    deltas, before = {}, []
    batch = fact_batch(task, contexts, seed, model_device(model))  # [F_all * contexts] prompts
    for where, chosen in _writes(edits):
        layer, kind, head, position = where
        store = ("ov", "mlp")[kind]
        share = torch.tensor([0.5 if edits[i].at == "both" and store == "ov" else 1.0 for i in chosen])
        dW = _store_write(edited, task, [edits[i] for i in chosen], batch, contexts, store, head, layer, position,
                          margins[chosen] * share, form, ridge, optimise[chosen], margin, found,
                          (where, tuple(before)))  # [d_key, d_model]
        before += (margins[chosen] * share).tolist()
        if store == "ov":  # [d_head, d_model] -> W_O's [head, d_head, d_model]
            dW = torch.zeros_like(edited.W_O[layer]).index_copy(0, torch.tensor([head], device=dW.device), dW[None])
        key = store_key(store, layer)
        deltas[key] = deltas.get(key, 0) + dW
        add_to(edited, key, dW)
    return edited, deltas


def _store_write(model, task, edits, batch, contexts, store, head, layer, position, margins, form, ridge,
                 optimise, margin, found, state):
    """dW of one store [d_key, d_model] for `edits`, each asking `margins[i]` logits: the closed
    form's value, or where `optimise` [n] ROME's v* taken margins[i] / margin times (found once
    per `state` in the dict `found`); EmptyKey where a fact's key carries nothing."""
    at = None if position == "last" else batch.subject_pos
    keys = edit_keys.store_keys(model, batch.tokens, store, head, layer, at)  # [F_all * contexts, d_key]
    C = edit_keys.second_moment(keys if at is None else
                                edit_keys.store_keys(model, batch.tokens, store, head, layer, "all"), ridge)
    rows = torch.tensor([e.subject * task.n_relations + e.relation for e in edits], device=keys.device)
    k_star = edit_keys.fact_keys(keys, contexts)[rows]  # [n, d_key]
    empty, norms, typical = edit_keys.empty_keys(k_star, keys)
    for e, is_empty, norm in zip(edits, empty.tolist(), norms.tolist()):
        if is_empty:
            where = (f"head {head} of layer {layer}" if store == "ov"
                     else f"layer {layer}'s MLP at the {position} position")
            raise edit_keys.EmptyKey(
                f"fact {e.subject}:{e.relation} has no key at {where}: its norm {norm:.3g} is under "
                f"{edit_keys.KEY_FLOOR:g} of the keys' typical norm {typical:.3g} (root mean square over the task's "
                "prompts), so a write there cannot reach it; write it at another store.")
    T = batch.tokens.shape[1]
    key_at = batch.subject_pos if at is not None else torch.full_like(batch.subject_pos, T - 1)  # [F_all * contexts]
    values = torch.zeros(len(edits), model.cfg.d_model, dtype=k_star.dtype, device=k_star.device)  # [n, d_model]
    closed = ~optimise  # [n], on the CPU as margins
    if closed.any():
        values[closed.to(values.device)] = _closed_values(
            model, task, [e for e, c in zip(edits, closed.tolist()) if c], batch, contexts, store, layer, at, key_at,
            rows[closed.to(rows.device)], margins[closed]).to(values)
    if optimise.any():
        if state not in found:  # ROME's v* on the model this write is keyed on: the same on every try
            found[state] = _optimised(model, task, [e for e, o in zip(edits, optimise.tolist()) if o], batch, contexts,
                                      store, head, layer, key_at, rows[optimise.to(rows.device)])
        values[optimise.to(values.device)] = (found[state] * (margins[optimise] / margin)[:, None].to(found[state])
                                              ).to(values)
    return edit_keys.write(C, k_star, values, form)


def _closed_values(model, task, edits, batch, contexts, store, layer, at, where, rows, margins) -> torch.Tensor:
    """The closed form's value [n, d_model] of each edit: the least change of the store's output
    that moves the logits by the margin asked, through W_U or the later blocks' first-order map
    (`where` [F_all * contexts]: the key's position in each prompt)."""
    logits = _fact_logits(model, task, edits, contexts, tokens=batch.tokens)  # [n, contexts, O]
    old = torch.tensor([int(task.facts[e.subject, e.relation]) for e in edits], device=rows.device)
    new = torch.tensor([e.answer for e in edits], device=rows.device)
    change = torch.cat([edit_keys.logit_change(logits[i:i + 1], old[i:i + 1], new[i:i + 1], float(margins[i]))
                        for i in range(len(edits))])  # [n, O]
    if at is None and layer == model.cfg.n_layers - 1:  # the last block's write at the last position
        return edit_keys.residual_change(model.W_U.detach().float(), change)  # [n, d_model] through W_U
    # a block below the last, or the subject's position: through the later blocks, to first order
    prompts = (rows[:, None] * contexts + torch.arange(contexts, device=rows.device))  # [n, contexts]
    return torch.cat([edit_keys.residual_change(
        edit_keys.output_map(model, batch.tokens[p], layer, where[p], store), change[i:i + 1])
        for i, p in enumerate(prompts)])  # [n, d_model]


def _optimised(model, task, edits, batch, contexts, store, head, layer, where, rows) -> torch.Tensor:
    """ROME's v* [n, d_model] of each edit (probe/edit_values.py): delta at the key's position
    (`where`) of the fact's prompts and, for the KL term, of the same subject's other facts' prompts."""
    out = []
    for e, row in zip(edits, rows.tolist()):
        fact = torch.arange(row * contexts, (row + 1) * contexts, device=where.device)  # [contexts]
        others = torch.tensor([(e.subject * task.n_relations + r) * contexts + c for r in range(task.n_relations)
                               if r != e.relation for c in range(contexts)], dtype=torch.long, device=where.device)
        out.append(edit_values.optimised_value(model, batch.tokens[fact], where[fact], e.answer, batch.tokens[others],
                                               where[others], store, head, layer))
    return torch.stack(out)  # [n, d_model]


def _fact_logits(model, task, edits, contexts, seed=0, tokens=None) -> torch.Tensor:
    """Logits at EOS [n, contexts, O] of the edited facts' prompts (those of fact_batch)."""
    if tokens is None:
        tokens = fact_batch(task, contexts, seed, model_device(model)).tokens
    rows = torch.tensor([(e.subject * task.n_relations + e.relation) * contexts + c
                         for e in edits for c in range(contexts)], device=tokens.device)
    return per_fact(hooked_last_logits(model, tokens[rows]).float(), contexts)


def add_to(model, key: str, delta: torch.Tensor) -> None:
    """Add `delta` (the checkpoint's layout of `key`, blocks.L.mlp.W_out [d_mlp, d_model] or
    blocks.L.attn.W_O [head, d_head, d_model]) to the bridge's parameter that holds it, in
    place; RuntimeError when the bridge's own view of the weight (model.W_out[L],
    model.W_O[L]) does not show it."""
    layer, name = int(key.split(".")[1]), key.split(".")[-1]
    view = (lambda: model.W_out[layer]) if name == "W_out" else (lambda: model.W_O[layer])
    before = view().detach().clone()
    param = [p for n, p in model.named_parameters() if n.endswith(PARAMETERS[name])][layer]  # one per block, in order
    with torch.no_grad():
        param += (delta if name == "W_out" else delta.reshape(-1, delta.shape[-1])).T.to(param.dtype)
    after = view().detach()
    if not torch.allclose(after - before, delta.to(after.dtype), atol=1e-5 * (1 + float(delta.abs().max()))):
        raise RuntimeError(f"the bridge does not hold the write to {key}: its weight layout has changed.")
