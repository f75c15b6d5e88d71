"""Causal tracing (ROME, Meng et al. 2022): corrupt the subject's (or the relation's)
embedding, then restore one clean activation at a time and measure how much of the
answer's probability comes back.

Protocol. The corruption adds Gaussian noise of `NOISE_SCALE` (3) times the standard
deviation of the embeddings of the corrupted kind's tokens (the rows of W_E of every
subject, or of every relation; one number over all their entries) to hook_embed at the
corrupted token's position, a fresh draw per prompt and per noise draw; or (`noise=
"resample"`) puts another subject's (relation's) token there, one whose answer differs.
Each hidden state is then restored from the clean run at one (layer, position): layer 0 is
the embedding (blocks.0.hook_resid_pre), layer l >= 1 the output of block l
(blocks.{l-1}.hook_resid_post); and each block's MLP output (hook_mlp_out) and attention
output (hook_attn_out) at layer l = its block. The severed variants restore the hidden
state while every MLP (attention) output, at every layer and position, is held at its
corrupted value (ROME holds them at the restored token only; at one layer nothing reads
that token's MLP, so the severed effect would always be the plain one): what is left is
the effect that does not pass through the MLPs (the attention).

indirect effect = P(a* | corrupted, restored) - P(a* | corrupted), the probability of the
answer over the answer vocabulary (softmax of the last-position logits, as the task's loss
reads them), averaged over noise draws and contexts. The prompts place subject and relation
at random positions, so positions are named by role (subject, relation, noise, last); noise
is the mean over the noise positions. Every activation is read and written through
TransformerLens hooks: any depth, the model computes its own forward.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields

import pandas as pd
import torch

from probe.hooks import PROMPTS_PER_RUN, has_mlp
from probe.patching import corrupted_prompts
from probe.prompts import checked_facts, fact_batch, fact_index
from tasks.batch import Batch

NOISE_SCALE = 3.0  # ROME: the noise's standard deviation is 3 times the embeddings'
DRAWS = 10  # noise draws per prompt
CORRUPT = ("subject", "relation")
NOISE = ("gaussian", "resample")
ROLES = ("subject", "relation", "noise", "last")
COMPONENTS = ("resid", "mlp", "attn", "resid_severed_mlp", "resid_severed_attn")
COLUMNS = ("fact", "layer", "position", "component", "indirect_effect", "clean_probability",
           "corrupted_probability")


def noise_std(model, task, corrupt: str = "subject") -> float:
    """The standard deviation of the embeddings (W_E rows) of every subject (relation) token."""
    rows = range(task.n_subjects) if corrupt == "subject" else [task.relation_token(r) for r in range(task.n_relations)]
    return embedding_std(model, rows)


def embedding_std(model, rows) -> float:
    """The standard deviation of the entries of the W_E rows `rows` (token ids): one number."""
    return float(model.W_E.detach()[list(rows)].float().std())


def named_roles(batch) -> dict[str, torch.Tensor]:
    """A factual-recall prompt's named roles and their positions [n]: subject, relation."""
    return {"subject": batch.subject_pos, "relation": batch.relation_pos}


def role_order(batch, T: int, roles: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """[n, T] absolute positions in role order per prompt: the named roles (default: subject,
    relation; any distinct positions before the last, in the dict's order), the noise
    positions (left to right), last."""
    roles = named_roles(batch) if roles is None else roles
    n, device, k = len(batch), batch.tokens.device, len(roles)
    key = torch.arange(T, device=device, dtype=torch.float).repeat(n, 1) / T + k  # noise: k <= key < k + 1
    rows = torch.arange(n, device=device)
    for i, position in enumerate(roles.values()):
        key[rows, position] = float(i)
    key[:, -1] = k + 1.0
    return key.argsort(-1)


def slot_roles(T: int, named=("subject", "relation")) -> list[str]:
    """The role of each slot of role_order: the named roles, noise (T - 1 - len(named) of them), last."""
    return list(named) + ["noise"] * (T - 1 - len(named)) + ["last"]


def restore_points(model) -> list[tuple[str, int, str, list[str]]]:
    """(component, layer, the hook restored, the hooks frozen at their corrupted values)."""
    L, mlp = model.cfg.n_layers, has_mlp(model)
    resid = ["blocks.0.hook_resid_pre"] + [f"blocks.{b}.hook_resid_post" for b in range(L)]
    mlps, attns = [f"blocks.{b}.hook_mlp_out" for b in range(L)], [f"blocks.{b}.hook_attn_out" for b in range(L)]
    points = [("resid", layer, hook, []) for layer, hook in enumerate(resid)]
    points += [("mlp", b + 1, hook, []) for b, hook in enumerate(mlps) if mlp]
    points += [("attn", b + 1, hook, []) for b, hook in enumerate(attns)]
    if mlp:
        points += [("resid_severed_mlp", layer, hook, mlps) for layer, hook in enumerate(resid)]
    points += [("resid_severed_attn", layer, hook, attns) for layer, hook in enumerate(resid)]
    return points


def tracing_prompts(task, contexts: int, seed: int, facts: Sequence[tuple[int, int]] | None = None,
                    device="cpu") -> tuple[Batch, pd.MultiIndex]:
    """`contexts` prompts per fact (probe.prompts.fact_batch: a chosen fact gets the prompts it
    gets among all), fact-major, and the index of the facts: of every fact, or of `facts`."""
    batch = fact_batch(task, contexts, seed, device)
    subjects, relations, answers = task.all_facts()
    if facts is None:
        return batch, fact_index(subjects, relations, answers)
    chosen = torch.tensor([s * task.n_relations + r for s, r in checked_facts(task, facts)])  # [F]
    rows = (chosen[:, None] * contexts + torch.arange(contexts)).flatten().to(batch.tokens.device)  # [n]
    picked = Batch(*(getattr(batch, f.name)[rows] for f in fields(Batch)))
    return picked, fact_index(subjects[chosen], relations[chosen], answers[chosen])


def n_steps(n_facts: int, contexts: int, draws: int = DRAWS) -> int:
    """How many times causal_trace calls its `progress`: once per chunk of prompts and draw."""
    return -(-n_facts * contexts // PROMPTS_PER_RUN) * draws


def causal_trace(model, task, generator: torch.Generator, contexts: int = 2, seed: int = 0,
                 facts: Sequence[tuple[int, int]] | None = None, draws: int = DRAWS, corrupt: str = "subject",
                 noise: str = "gaussian", progress: Callable[[], None] | None = None) -> pd.DataFrame:
    """One row per fact (every fact, or `facts`), layer, position (role) and component
    (COMPONENTS): the indirect effect of restoring it, with the clean and corrupted
    probabilities of a* (module docstring), on `contexts` prompts per fact drawn with
    `seed`. `generator` draws the noise (or the resampled tokens): no global state."""
    if corrupt not in CORRUPT:
        raise ValueError(f"corrupt must be one of {', '.join(CORRUPT)}, got {corrupt!r}.")
    if noise not in NOISE:
        raise ValueError(f"noise must be one of {', '.join(NOISE)}, got {noise!r}.")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}.")
    batch, index = tracing_prompts(task, contexts, seed, facts, model.W_E.device)
    corruption = (NOISE_SCALE * noise_std(model, task, corrupt) if noise == "gaussian"
                  else lambda part, g: corrupted_prompts(task, part, corrupt, g)[0])
    return trace_prompts(model, batch, index, named_roles(batch), corrupt, corruption, generator, draws, progress)


def trace_prompts(model, batch, index: pd.MultiIndex, roles: dict[str, torch.Tensor], corrupt: str, corruption,
                  generator: torch.Generator, draws: int = DRAWS,
                  progress: Callable[[], None] | None = None) -> pd.DataFrame:
    """causal_trace on any prompts: `batch` (a dataclass of [n, ...] fields with tokens [n, T] and
    answers [n]) holds len(index) facts' prompts, fact-major, the same count each; `roles` names
    positions [n] (in the order the rows list them), `corrupt` the one corrupted; `corruption` the
    Gaussian noise's standard deviation, or a function (chunk of batch, generator) -> its
    corrupted tokens [n, T] (resampling)."""
    T = batch.tokens.shape[-1]
    points = restore_points(model)
    sums = torch.zeros(len(points), len(batch), T)  # [point, n, slot] effect summed over draws
    clean_p, corrupted_p = torch.zeros(len(batch)), torch.zeros(len(batch))
    for start in range(0, len(batch), PROMPTS_PER_RUN):
        rows = slice(start, start + PROMPTS_PER_RUN)
        part = type(batch)(*(getattr(batch, f.name)[rows] for f in fields(batch)))
        named = {role: position[rows] for role, position in roles.items()}
        effects, clean, corrupted = _trace_chunk(model, part, named, corrupt, points, generator, draws, corruption,
                                                 progress)
        sums[:, rows], clean_p[rows], corrupted_p[rows] = effects, clean, corrupted
    return _frame(index, points, sums / draws, clean_p, corrupted_p, T, tuple(roles))


def _trace_chunk(model, batch, roles, corrupt, points, generator, draws, corruption, progress):
    """The summed effects [point, n, slot], clean and mean corrupted probabilities [n] of one chunk."""
    names = {hook for _, _, hook, frozen in points for hook in [hook, *frozen]}
    device, n, T = batch.tokens.device, len(batch), batch.tokens.shape[-1]
    rows = torch.arange(n, device=device)
    order = role_order(batch, T, roles)  # [n, T]
    with torch.inference_mode():
        logits, clean_cache = model.run_with_cache(batch.tokens, names_filter=lambda name: name in names)
        clean = _probability(logits, batch.answers)  # [n]
        effects, corrupted_sum = torch.zeros(len(points), n, T), torch.zeros(n)
        for _ in range(draws):
            tokens, corrupting = _corruption(model, batch, generator, corruption, roles[corrupt], rows)
            with model.hooks(fwd_hooks=corrupting):
                logits, corrupted_cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
            corrupted = _probability(logits, batch.answers)
            corrupted_sum += corrupted.cpu()
            for p, (_, _, hook, frozen) in enumerate(points):
                for slot in range(T):
                    at = order[:, slot]  # [n] the position restored in each prompt
                    hooks = corrupting + [(hook, _put(clean_cache[hook], rows, at))]
                    hooks = [(name, _frozen(corrupted_cache[name])) for name in frozen] + hooks
                    restored = _probability(model.run_with_hooks(tokens, fwd_hooks=hooks), batch.answers)
                    effects[p, :, slot] += (restored - corrupted).cpu()
            if progress is not None:
                progress()
    return effects, clean.cpu(), corrupted_sum / draws


def _corruption(model, batch, generator, corruption, position, rows):
    """(the corrupted tokens, the hooks that corrupt them) of one draw."""
    if callable(corruption):
        return corruption(batch, generator), []
    d = model.cfg.d_model
    draw = torch.randn(len(batch), d, generator=generator, device=generator.device) * corruption  # [n, d]

    def add_noise(x, hook):  # hook_embed [n, T, d]
        x = x.clone()
        x[rows, position] += draw.to(x.device, x.dtype)
        return x
    return batch.tokens, [("hook_embed", add_noise)]


def _put(source: torch.Tensor, rows: torch.Tensor, at: torch.Tensor) -> Callable:
    """A hook that writes source[rows, at] (one position per prompt) into the activation."""
    def hook(x, hook):
        x = x.clone()
        x[rows, at] = source[rows, at].to(x.dtype)
        return x
    return hook


def _frozen(source: torch.Tensor) -> Callable:
    """A hook that holds the activation at `source` (its corrupted value), every position."""
    return lambda x, hook: source.to(x.dtype)


def _probability(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """P(a*) [n] over the answer vocabulary at the last position of logits [n, T, O]."""
    return logits[:, -1].float().softmax(-1).gather(-1, answers[:, None])[:, 0]


def _frame(index: pd.MultiIndex, points, effects, clean, corrupted, T, named=("subject", "relation")) -> pd.DataFrame:
    """effects [point, n, slot] -> rows per fact, layer, role, component (means over contexts, noise slots);
    a fact named by its index's levels but the last (the answer), ':'-joined."""
    F = len(index)
    per_fact = effects.reshape(len(points), F, -1, T).mean(2)  # [point, F, slot]
    clean_f, corrupted_f = (v.reshape(F, -1).mean(1) for v in (clean, corrupted))
    roles = slot_roles(T, named)
    names = [":".join(str(x) for x in key[:-1]) for key in index]
    rows = []
    for p, (component, layer, _, _) in enumerate(points):
        for role in (*named, "noise", "last"):
            slots = [i for i, name in enumerate(roles) if name == role]
            if not slots:
                continue
            value = per_fact[p][:, slots].mean(-1)  # [F]
            rows += [{"fact": names[f], "layer": layer, "position": role, "component": component,
                      "indirect_effect": float(value[f]), "clean_probability": float(clean_f[f]),
                      "corrupted_probability": float(corrupted_f[f])} for f in range(F)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


TIE = 1e-3  # effects (probability) closer than this are a tie, not a peak
STORE = {"mlp": "mlp", "attn": "attention"}


def peaks(effects: pd.DataFrame) -> pd.DataFrame:
    """Per fact, the output (MLP or attention, any layer and position) whose restoration has
    the largest indirect effect: its store (`mlp`, `attention`, or `tie` when the other
    component's best lies within TIE of it), layer, position and effect."""
    outputs = effects[effects["component"].isin(list(STORE))]
    rows = {}
    for fact, group in outputs.groupby("fact", sort=False):
        best = group.loc[group.groupby("component")["indirect_effect"].idxmax()].sort_values(
            "indirect_effect", ascending=False)
        top = best.iloc[0]
        tied = len(best) > 1 and top["indirect_effect"] - best.iloc[1]["indirect_effect"] < TIE
        rows[fact] = {"store": "tie" if tied else STORE[top["component"]], "layer": int(top["layer"]),
                      "position": top["position"], "indirect_effect": float(top["indirect_effect"])}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("fact")


def severed_stores(effects: pd.DataFrame, corrupted: str = "subject", band: float = 0.25) -> pd.Series:
    """Per fact, where the corrupted token's effect passes, from ROME's severed variant:
    the share of the embedding's effect (layer 0 at that token) lost when every MLP is
    frozen; `mlp` above 1 - band, `attention` below band, `both` between (NaN effect: `none`)."""
    at = effects[(effects["layer"] == 0) & (effects["position"] == corrupted)].pivot_table(
        index="fact", columns="component", values="indirect_effect", sort=False)
    plain = at["resid"]
    severed = at["resid_severed_mlp"] if "resid_severed_mlp" in at else plain
    share = (1 - severed / plain).where(plain > TIE)  # [F] share through the MLPs
    labels = pd.Series("both", index=at.index, name="severed_store")
    labels[share >= 1 - band], labels[share <= band], labels[share.isna()] = "mlp", "attention", "none"
    return labels
