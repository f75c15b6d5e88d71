"""The paths by which each layer's stores reach the logits at the last position (EOS), for a
model of any depth L, read through the hooks (hook_resid_pre, hook_pattern, hook_mlp_out).

Without layer norm the logits at EOS are the unembedding of a sum of writes, and attention is
linear in its values once its pattern is fixed: head h of layer l writes at query q
sum_k A[q, k] resid_l[k] W_V W_O (+ b_V W_O), resid_l[k] being the embedding plus every earlier
block's attention and MLP output at k. So the logits split exactly into paths, each a store
(layer, component) and the layers whose heads moved its write to EOS, in order:

- `mlp` of layer l: its output (at any position) is its store's write: an MLP is a nonlinear
  memory, the store of what it writes whatever gathered its input;
- `attention` of layer l: its heads' OV write from the embedding (token and position);
- a store's write at some position, read by a later layer's heads and so moved, keeps its store
  and gains that layer as a mover: route `moved by layer 2 heads` (one mover), `direct` (none);
- the rest (the EOS embedding, b_V W_O, b_O, b_U, and their moves) is `direct`, as at one layer.

`path_logits` returns these writes [n, O] per store; `path_measurements` reads them per fact as
probe/attribution.py reads a one-layer model's components (`X_margin`, `X_top`, `X_top_z`) and
adds `X_path_accuracy`: the model's answer with every other store's write replaced by its mean
over the prompts of the fact's relation (every fact's prompts). The relation's own write (its
block A_r) may sit in another store than the subject's answers; the plain mean would erase it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from probe import columns
from probe.attribution import above_chance
from probe.contexts import answer_block, correct, ranks_first_in_block
from probe.hooks import HOOK_RESID_PRE, PROMPTS_PER_RUN, has_mlp
from probe.prompts import FactPrompts
from probe.stats import share_with_interval, with_interval

EMBEDDING, BIAS = "embedding", "bias"  # the stream terms that are no store


def hook_pattern(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"  # [batch, head, query, key]


def hook_mlp_out(layer: int) -> str:
    return f"blocks.{layer}.hook_mlp_out"  # [batch, pos, d_model]


@dataclass(frozen=True, order=True)
class Store:
    """A component of one layer that keeps facts, and the layers whose heads move its write to EOS."""
    layer: int
    component: str  # attention | mlp
    movers: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        """Its column prefix: attention0, mlp1, mlp0_via_attention1 (layers counted from 0)."""
        return f"{self.component}{self.layer}" + "".join(f"_via_attention{m}" for m in self.movers)

    @property
    def route(self) -> str:
        """How its write reaches EOS: 'direct', or 'moved by layer 1 heads' ('layers 1, 2' for a chain)."""
        if not self.movers:
            return "direct"
        return f"moved by layer{'s' * (len(self.movers) > 1)} {', '.join(map(str, self.movers))} heads"

    def moved(self, layer: int) -> Store:
        return Store(self.layer, self.component, self.movers + (layer,))


@dataclass(frozen=True, eq=False)
class PathWrites:
    """What every path writes onto the logits at EOS, per prompt."""
    logits: torch.Tensor  # [n, O] the model's
    stores: dict[Store, torch.Tensor]  # [n, O] each store's write (over its route)
    heads: dict[tuple[Store, int], torch.Tensor]  # [n, O] the part each head of the store's last layer carries
    direct: torch.Tensor  # [n, O] the rest: EOS embedding, biases (logits = direct + sum of the stores)
    subject_mass: torch.Tensor  # [n, L, H] the EOS query's attention on the subject
    relation_mass: torch.Tensor  # [n, L, H] on the relation


def _split(model, cache, positions: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """One chunk's writes at EOS, the cache holding resid_pre, every pattern and MLP output."""
    L = model.cfg.n_layers
    W_U = model.W_U  # [d, O]
    streams: dict = {EMBEDDING: cache[HOOK_RESID_PRE]}  # term -> [n, T, d] its part of the residual stream
    heads, masses = {}, []
    rows = torch.arange(len(positions[0]), device=W_U.device)
    for layer in range(L):
        A = cache[hook_pattern(layer)]  # [n, H, T, T]
        masses.append(torch.stack([A[rows, :, -1, p] for p in positions]))  # [2, n, H]
        OV = model.W_V[layer] @ model.W_O[layer]  # [H, d, d]
        written = {}
        for term, x in streams.items():
            per_head = torch.einsum("nhqk,nkd,hde->nhqe", A, x, OV)  # [n, H, T, d]
            target = BIAS if term == BIAS else Store(layer, "attention") if term == EMBEDDING else term.moved(layer)
            written[target] = written.get(target, 0) + per_head.sum(1)
            if target != BIAS:
                for h in range(per_head.shape[1]):
                    heads[(target, h)] = per_head[:, h, -1] @ W_U
        bias_v = torch.einsum("hv,hvd->hd", model.b_V[layer], model.W_O[layer])  # [H, d]
        written[BIAS] = written.get(BIAS, 0) + torch.einsum("nhq,hd->nqd", A.sum(-1), bias_v) + model.b_O[layer]
        for term, x in written.items():
            streams[term] = streams[term] + x if term in streams else x
        if has_mlp(model):
            streams[Store(layer, "mlp")] = cache[hook_mlp_out(layer)]
    at_eos = {term: x[:, -1] @ W_U for term, x in streams.items()}  # [n, O]
    direct = at_eos.pop(EMBEDDING) + at_eos.pop(BIAS) + model.b_U
    return {"stores": at_eos, "heads": heads, "direct": direct, "masses": torch.stack(masses, 2)}  # [2, n, L, H]


def n_path_runs(prompts: FactPrompts, chunk: int = PROMPTS_PER_RUN) -> int:
    """How many runs path_measurements makes on `prompts`: one per chunk of every fact's prompts."""
    return -(-len(prompts.every_fact.batch.tokens) // chunk)


def path_logits(model, batch, chunk: int = PROMPTS_PER_RUN, progress: Callable[[], None] | None = None) -> PathWrites:
    """Every path's write at EOS on the prompts of `batch` (model run with run_with_cache, in chunks;
    `progress()` called after each)."""
    names = {HOOK_RESID_PRE, *(hook_pattern(l) for l in range(model.cfg.n_layers)),
             *(hook_mlp_out(l) for l in range(model.cfg.n_layers) if has_mlp(model))}
    parts, logits = [], []
    tokens = batch.tokens
    with torch.inference_mode():
        for start in range(0, len(tokens), chunk):
            out, cache = model.run_with_cache(tokens[start:start + chunk], names_filter=lambda n: n in names)
            logits.append(out[:, -1])
            where = (batch.subject_pos[start:start + chunk], batch.relation_pos[start:start + chunk])
            parts.append(_split(model, cache, where))
            if progress is not None:
                progress()
    masses = torch.cat([p["masses"] for p in parts], 1)  # [2, n, L, H]
    return PathWrites(torch.cat(logits), {k: torch.cat([p["stores"][k] for p in parts]) for k in parts[0]["stores"]},
                      {k: torch.cat([p["heads"][k] for p in parts]) for k in parts[0]["heads"]},
                      torch.cat([p["direct"] for p in parts]), masses[0], masses[1])


def silent(writes: PathWrites, tolerance: float = 1e-5) -> set[Store]:
    """The stores that write nothing on any prompt (a construction's empty blocks: float noise, at most
    `tolerance` of the largest logit): not candidates."""
    floor = tolerance * float(writes.logits.abs().max())
    return {store for store, x in writes.stores.items() if float(x.abs().max()) <= floor}


def path_measurements(model, task, prompts: FactPrompts, relation_mean: bool = True,
                      progress: Callable[[], None] | None = None) -> tuple[pd.DataFrame, list[Store], PathWrites]:
    """Per fact (indexed by the fact): `margin` (with its interval) and for every store X that writes
    anything (attention0, mlp1, mlp0_via_attention1, ...): `X_margin`, `X_top`, `X_top_z`,
    `X_path_accuracy` (each with its interval where it has one) and per head h of the store's last
    layer `X_head<h>_top`; `attention_margin`, `mlp_margin`: the attention (MLP) stores' parts summed,
    `direct_margin` the rest's (the three add up to `margin`).
    Measured on every fact's prompts and cut to the facts of `prompts`. `relation_mean=False`: the
    other stores at their mean over every prompt, the one-layer rule's (probe/ablation.py's mean
    ablation). `progress()` is called after each of its n_path_runs runs. Returns the frame, the
    stores (in order) and every fact's writes."""
    every = prompts.every_fact
    writes = path_logits(model, every.batch, progress=progress)
    stores = sorted(set(writes.stores) - silent(writes))
    rows = slice(None) if prompts.rows is None else prompts.rows
    batch, seed, D, R = prompts.batch, prompts.seed, task.answers_per_relation, task.n_relations
    logits = writes.logits[rows]
    block = answer_block(logits, batch.relations, D)  # [n, D]
    target = batch.answers - batch.relations * D
    rival = block.scatter(-1, target[:, None], float("-inf")).argmax(-1) + batch.relations * D  # [n]

    def margin(x):  # a* over the model's rival, per fact and context [F, C]
        return prompts.per_fact(x.gather(-1, batch.answers[:, None])[:, 0] - x.gather(-1, rival[:, None])[:, 0])

    cols = with_interval(columns.MARGIN, margin(logits), seed)
    relation = every.batch.relations  # [N]
    stored = writes.logits - writes.direct  # [N, O] every store's write summed
    by_component = {c: torch.zeros_like(logits) for c in columns.STORES}
    for store in stores:
        x = writes.stores[store]  # [N, O]
        by_component[store.component] = by_component[store.component] + x[rows]
        name = store.name
        cols.update(with_interval(columns.margin(name), margin(x[rows]), seed))
        every_top, _ = ranks_first_in_block(x, relation, every.batch.answers, D)
        cols.update(share_with_interval(columns.top(name), prompts.per_fact(every_top[rows])))
        _, z = above_chance(x, task, every.batch, every.per_fact(every_top).mean(1), strict=True)
        cols[columns.top_z(name)] = torch.full((len(prompts.facts),), z)
        others = stored - x  # [N, O]
        if relation_mean:  # [N, O] the mean over the prompts of each one's relation
            mean = torch.zeros(R, others.shape[1], dtype=others.dtype, device=others.device).index_add_(0, relation,
                                                                                                       others)
            mean = (mean / torch.bincount(relation, minlength=R).clamp(min=1)[:, None].to(others.dtype))[relation]
        else:
            mean = others.mean(0)
        path = writes.logits - others + mean  # the model's answer with only this store knowing the subject
        cols.update(share_with_interval(columns.path_accuracy(name),
                                        prompts.per_fact(correct(path, every.batch.answers)[rows])))
        for h in range(model.cfg.n_heads):
            if (store, h) in writes.heads:
                top = ranks_first_in_block(writes.heads[(store, h)][rows], batch.relations, batch.answers, D)[0]
                cols[columns.top(f"{name}_{columns.head(h)}")] = prompts.per_fact(top).mean(1)
    for component, x in by_component.items():
        cols.update(with_interval(columns.margin(component), margin(x), seed))
    cols.update(with_interval(columns.margin("direct"), margin(writes.direct[rows]), seed))
    return prompts.frame(cols), stores, writes


def head_table(writes: PathWrites, n_layers: int, seq_len: int) -> pd.DataFrame:
    """Per (layer, head): the EOS query's mean attention on the subject and the relation, and the
    denoising scores (mass - 1/T) / (1 - 1/T) as at one layer (probe/denoising.py)."""
    rows = []
    for layer in range(n_layers):
        for h in range(writes.subject_mass.shape[2]):
            subject = float(writes.subject_mass[:, layer, h].mean())
            relation = float(writes.relation_mass[:, layer, h].mean())
            scores = [(m - 1 / seq_len) / (1 - 1 / seq_len) for m in (subject, relation)]
            rows.append({"layer": layer, "head": h, "subject_mass": subject, "relation_mass": relation,
                         "subject_score": scores[0], "relation_score": scores[1], "denoising_score": max(scores)})
    return pd.DataFrame(rows)
