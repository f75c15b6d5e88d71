"""The report page's editing section: one fact the model holds given another answer by a
rank-one write at each store it has (the MLP's W_out; the W_O of the head that carries the
subject), and the relation's answers' logits before and after each write, on held-out noise
contexts of the edited prompt, with the write's efficacy and the other facts it kept."""
from __future__ import annotations

import base64
import html
import io

import pandas as pd

from analyses.sweeps.output import subplots
from probe import columns, edit_keys
from probe.edit_effects import HELD_OUT, edit_effects
from probe.editing import FactEdit, carrying_head, edit_facts, held
from probe.hooks import has_mlp, hooked_last_logits, model_device
from probe.prompts import fact_batch

ORDER = ("mlp", "both", "distributed", "attention")  # the labels whose facts are shown first


def chosen_fact(model, task, facts: pd.DataFrame, contexts: int, seed: int) -> tuple[int, int, int] | None:
    """(subject, relation, head) of the first fact the model holds, by ORDER of its label;
    the head that carries the subject (editing.carrying_head on locate_facts' columns: a tie
    goes to the largest key; 0 where not recorded). None where the model holds none of them."""
    ranked = sorted(facts.itertuples(index=False), key=lambda f: ORDER.index(f.label) if f.label in ORDER else 9)
    for f in ranked:
        s, r = int(getattr(f, columns.SUBJECT)), int(getattr(f, columns.RELATION))
        try:
            held(model, task, [FactEdit(s, r, 0)], contexts, seed)
        except ValueError:
            continue
        patched = [columns.patch("subject", columns.head(h)) for h in range(model.cfg.n_heads)]
        row = facts[(facts[columns.SUBJECT] == s) & (facts[columns.RELATION] == r)].iloc[0]
        if not set(patched) <= set(facts.columns):
            return s, r, 0
        tokens = fact_batch(task, contexts, seed, model_device(model)).tokens  # [F * contexts, T]
        norms = edit_keys.head_key_norms(model, tokens, contexts)[s * task.n_relations + r]  # [H]
        head = carrying_head(row[patched].astype(float).tolist(), norms.tolist())
        return s, r, head
    return None


def before_after(model, task, s: int, r: int, head: int, contexts: int = 8, seed: int = 0) -> tuple[pd.DataFrame,
                                                                                                      pd.DataFrame]:
    """The relation's answers' logits [D answers x (before, after at each store)], mean over
    held-out contexts, and per store the write's efficacy and the share of other facts kept."""
    old = int(task.facts[s, r])
    new = next(a for a in task.relation_answers(r) if a != old)
    tokens = fact_batch(task, contexts, seed + HELD_OUT, model_device(model)).tokens  # [F * contexts, T]
    rows = slice((s * task.n_relations + r) * contexts, (s * task.n_relations + r + 1) * contexts)
    block = list(task.relation_answers(r))
    logits, effects = {}, {}
    stores = ("mlp", "ov") if has_mlp(model) else ("ov",)
    for name, at in (("before", None), *((f"after, at {a}", a) for a in stores)):
        m = model
        if at is not None:
            try:
                edited = edit_facts(model, task, [FactEdit(s, r, new, at, head)], contexts, seed)
            except edit_keys.EmptyKey:  # the head does not read this fact: no write to show
                continue
            table, kept = edit_effects(model, edited.model, task, [(s, r, old, new)], contexts, seed)
            m = edited.model
            effects[at] = {"efficacy": float(table["efficacy"][0]), "kept": kept["all"]["share"],
                           "boost": edited.boosts[0]}
        logits[name] = hooked_last_logits(m, tokens[rows]).float().mean(0)[block].detach().cpu().numpy()  # [D]
    names = [task.answer_label(a) + (" (old)" if a == old else " (new)" if a == new else "") for a in block]
    return pd.DataFrame(logits, index=names), pd.DataFrame(effects).T


def edit_section(model, task, facts: pd.DataFrame, contexts: int = 8, seed: int = 0) -> str:
    """<h2>Editing</h2>: the before/after of one fact's edit at each store (HTML)."""
    chosen = chosen_fact(model, task, facts, contexts, seed)
    if chosen is None:
        return "<h2>Editing</h2><p>The model holds none of its facts: there is nothing to edit.</p>"
    s, r, head = chosen
    logits, effects = before_after(model, task, s, r, head, contexts, seed)
    fig, ax = subplots(figsize=(6, 3))
    width = 0.8 / len(logits.columns)
    for i, column in enumerate(logits.columns):
        ax.bar([j + width * (i - (len(logits.columns) - 1) / 2) for j in range(len(logits))], logits[column],
               width=width, label=column)
    ax.set_xticks(range(len(logits)), logits.index, fontsize=8)
    ax.set(ylabel="logit (mean, held-out contexts)", title=f"S{s} R{r}: the relation's answers")
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    image = base64.b64encode(buffer.getvalue()).decode()
    label = facts.loc[(facts[columns.SUBJECT] == s) & (facts[columns.RELATION] == r), columns.LABEL].iloc[0]
    rows = "".join(f"<tr><td>{html.escape(at)}</td><td>{e['efficacy']:.2f}</td><td>{e['kept']:.3f}</td>"
                   f"<td>{e['boost']:g}</td></tr>" for at, e in effects.iterrows())
    return (f"<h2>Editing</h2><h3>S{s} R{r} (stored in: {html.escape(str(label))}) given another answer</h3>"
            f"<p>A rank-one write (ROME) at each store, the ov write at head {head}; logits on held-out "
            f"contexts of the edited prompt (docs/editing.md).</p>"
            f'<figure><img alt="before and after the edit" src="data:image/png;base64,{image}">'
            f"<figcaption>The relation's answers' logits before and after each write</figcaption></figure>"
            "<table><thead><tr><th>store</th><th>efficacy</th><th>other facts kept</th><th>boost</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>")
