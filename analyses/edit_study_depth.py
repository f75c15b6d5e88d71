"""The editing study's writes (analyses/edit_study.py), and the study on a model of L > 1 blocks.

At depth a fact lives where locate_facts puts it (its `stores`, probe/paths.py), each mapped to
the store an edit is keyed at (probe/edit_stores.py: a head's W_O, an MLP's W_out at the last
position, or at the subject's position for an MLP write that later heads move: ROME's key);
every other store of every block is elsewhere. An ov write goes to the head of its block with
the largest key for the fact (editing.carrying_head, no patching shares at depth). A write
whose store has no key for the fact (edit_keys.EmptyKey) is counted as refused, not as a failure.
"""
from __future__ import annotations

import random

import pandas as pd

from analyses import edit_counts
from probe import columns, edit_keys
from probe.edit_effects import edit_effects
from probe.edit_stores import lives_in, name, stores
from probe.edit_values import found_by
from probe.editing import FactEdit, carrying_head, edit_facts
from probe.hooks import has_mlp, model_device
from probe.prompts import fact_batch
from probe.storage import StorageRule

REFUSED = "refused"  # the column of a refused write: the refusal's line ('' for a write made)


def new_answer(task, s: int, r: int, rng: random.Random) -> int:
    old = int(task.facts[s, r])
    return rng.choice([a for a in task.relation_answers(r) if a != old])


def measure(model, task, edits: list[FactEdit], settings, seed: int) -> tuple[pd.DataFrame, dict]:
    """One write of `edits` at once: its edits table (with boost) and specificity."""
    edited = edit_facts(model, task, edits, settings.contexts, seed, settings.margin, value=settings.value)
    table, specificity = edit_effects(model, edited.model, task, [(e.subject, e.relation, old, e.answer) for e, old
                                                                  in zip(edited.edits, edited.old_answers)],
                                      settings.contexts, seed)
    table["boost"] = edited.boosts
    if settings.value != "closed":
        table["value"] = found_by(edited.optimised)
    table["weight_change"] = sum(float(d.norm() ** 2) for d in edited.deltas.values()) ** 0.5
    return table, specificity


def refused(frame: pd.DataFrame) -> pd.Series:
    """Which rows are refused writes (all False where no write was refused)."""
    if REFUSED not in frame:
        return pd.Series(False, index=frame.index)
    return frame[REFUSED].fillna("").astype(str) != ""


def pooled(frame: pd.DataFrame, by: list[str], shares=edit_counts.SHARES) -> list[dict]:
    """edit_counts.pooled, with each group's refused writes counted (`refused`) where any was
    refused: their shares count nothing (n = 0), their rows do."""
    rows = edit_counts.pooled(frame, by, shares)
    if REFUSED in frame:
        counts = refused(frame).groupby([frame[b] for b in by]).sum()
        for row in rows:
            row[REFUSED] = int(counts.loc[tuple(row[b] for b in by) if len(by) > 1 else row[by[0]]])
    return rows


def facts_at_depth(model, task, contexts: int, seed: int) -> pd.DataFrame:
    """Per fact (subject, relation): its label and the edit stores where it lives (`lives`:
    from locate_facts at depth, the store of the largest part of its margin first), whether
    the model holds it, and per block l the head with the largest key for it (`head{l}`)."""
    from analyses.locate_facts import locate

    facts = locate(model, task, contexts=max(2, contexts), patch_contexts=1, seed=seed,
                   progress=False).facts.droplevel(columns.ANSWER)
    tokens = fact_batch(task, contexts, seed, model_device(model)).tokens  # [F * contexts, T]
    H, R = model.cfg.n_heads, task.n_relations
    held = (facts[columns.ACCURACY] >= StorageRule.known).values
    out = pd.DataFrame({"label": facts[columns.LABEL].values, "held": held,
                        "lives": _lives(facts)}, index=facts.index)
    for layer in range(model.cfg.n_layers):
        norms = edit_keys.head_key_norms(model, tokens, contexts, layer).tolist()  # [F, H]
        out[f"head{layer}"] = [carrying_head([0.0] * H, norms[s * R + r]) for s, r in facts.index]
    return out


def _lives(facts: pd.DataFrame) -> list[tuple]:
    """Each fact's edit stores, by the part of its margin each store writes, largest first."""
    out = []
    for names, (_, row) in zip(facts[columns.STORE_LIST], facts.iterrows()):
        ranked = sorted(filter(None, str(names).split(";")), key=lambda n: -row[columns.margin(n)])
        out.append(lives_in(";".join(ranked)))
    return out


def _edit(located: pd.DataFrame, s: int, r: int, answer: int, store) -> FactEdit:
    at, layer, position = store
    return FactEdit(s, r, answer, at, int(located.loc[(s, r), f"head{layer}"]) if at == "ov" else None, layer,
                    position)


def tried(model, task, edits: list[FactEdit], settings, seed: int):
    """measure's (table, specificity), or the refusal's line where a store has no key."""
    try:
        return measure(model, task, edits, settings, seed), ""
    except edit_keys.EmptyKey as e:
        return (None, None), str(e)


def writes(model, located: pd.DataFrame, s: int, r: int, answer: int) -> list[tuple[dict, FactEdit]]:
    """Every store of every block for fact (s, r) (its heads alone without an MLP): each
    write's columns and its edit."""
    out = []
    for store in [e for e in stores(model.cfg.n_layers) if e[0] == "ov" or has_mlp(model)]:
        edit = _edit(located, s, r, answer, store)
        out.append(({"store": name(store), "layer": edit.layer, "position": edit.position, "head": edit.head,
                     "lives": store in located.loc[(s, r), "lives"], REFUSED: ""}, edit))  # refused named first
    return out


def batches(model, located: pd.DataFrame):
    """Mass editing at depth: the held facts that live in a store with a key of ours, written at the
    last block's MLP and where each lives (of its stores, the one of the largest part of its
    margin), and the columns every row starts with."""
    pool = [f for f in located.index[located["held"] & (located["lives"].map(len) > 0)]]
    last = ("mlp", model.cfg.n_layers - 1, "last")

    def edit(s: int, r: int, answer: int, store: str) -> FactEdit:
        return _edit(located, s, r, answer, located.loc[(s, r), "lives"][0] if store == "lives" else last)
    return pool, ((name(last), "lives") if has_mlp(model) else ("lives",)), edit, {REFUSED: ""}


TABLE = (("efficacy", "efficacy"), ("won", "won"), ("kept: all", "kept_all"), ("same subject", "kept_same_subject"),
         ("same relation", "kept_same_relation"))


def table(single: pd.DataFrame) -> list[str]:
    """The single edits by label x store edited x where the fact lives, as a Markdown table:
    each share with its Wilson interval and count (edit_counts.cell), refused writes apart."""
    lines = ["| label | store edited | lives there | edits | refused | " + " | ".join(t for t, _ in TABLE) + " |",
             "| --- " * (5 + len(TABLE)) + "|"]
    for row in pooled(single, ["label", "store", "lives"]):
        lines.append(f"| {row['label']} | {row['store']} | {'**yes**' if row['lives'] else 'no'} | {row['rows']} | "
                     f"{row.get(REFUSED) or '—'} | " + " | ".join(edit_counts.cell(row, s) for _, s in TABLE) + " |")
    return lines
