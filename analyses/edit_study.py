"""python -m analyses.edit_study CKPT [CKPT ...]   (also: python -m analyses.edit_facts study CKPT ...)

What localization is worth: per checkpoint, a sample of the facts of each storage label
(locate_facts' labels) is edited one at a time at each store (mlp, ov, both: the head that
carries the subject), so that editing where the fact lives can be set against editing
elsewhere; then mass editing: 1, 4, 16, 64 facts written at once (capped at half the facts
held, so that others remain to be kept) at the MLP and where each lives, against the share
of the other facts kept, beside the memory's spare capacity (0.15 facts per parameter of
4*H*d_h*d + 2*m*d, the paper's Figure 4 left law). Every share is counted, k of n held-out
prompts (won: of n edits), with its Wilson 95% interval (analyses/edit_counts.py). Writes
study.csv (one row per edit), mass.csv (one row per batch), summary.json (means by label x
store and by batch size) and study.png to DIR (default CKPT/analysis/edit_study; --out is
needed for several checkpoints). The checkpoints are never changed (docs/editing.md).

At depth (L > 1, analyses/edit_study_depth.py) each fact is edited at every store of every
block, where locate_facts at depth puts it against elsewhere; a write whose store has no key
for the fact is counted as refused (study.csv's `refused`), not as a failure.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from analyses import edit_counts, edit_study_depth
from analyses.edit_study_depth import REFUSED, new_answer, pooled, tried
from analyses.sweeps import cli
from analyses.sweeps.output import save_figure, subplots, write_csv, write_summary
from models import load
from models.out_folder import claim
from probe import columns, edit_keys
from probe.contexts import per_fact
from probe.edit_values import VALUE_HELP, VALUES, recorded_settings
from probe.editing import FactEdit, carrying_head
from probe.hooks import has_mlp, hooked_last_logits, model_device
from probe.prompts import fact_batch
from probe.storage import LABELS, StorageRule

WHERE = {"attention": "ov", "mlp": "mlp", "both": "both", "distributed": "both"}  # label -> where it lives
FACTS_PER_PARAMETER = 0.15  # the paper's Figure 4 left line (docs: REFERENCE section 4)
FILES = ("study.csv", "mass.csv", "summary.json", "study.png")


@dataclass(frozen=True)
class StudySettings:
    """How many facts are edited, and how each edit is keyed and measured."""

    per_label: int = field(default=8, metadata={"help": "facts edited per storage label (fewer where the model "
                                                        "holds fewer)"})
    sizes: str = field(default="1,4,16,64", metadata={"help": "mass editing: facts written at once (capped at "
                                                              "half the facts held)"})
    draws: int = field(default=2, metadata={"help": "mass editing: random batches per size"})
    contexts: int = field(default=8, metadata={"help": "noise contexts per fact for the keys (and, held out, "
                                                       "for the measurements)"})
    margin: float = field(default=2.0, metadata={"help": "logits by which the new answer should win"})
    value: str = field(default="auto", metadata={"help": VALUE_HELP, "choices": VALUES})

    def __post_init__(self):
        cli.at_least(self, per_label=1, draws=1, contexts=1)
        cli.require(self, "margin", self.margin > 0, "> 0")
        items = [t.strip() for t in str(self.sizes).split(",")]
        cli.require(self, "sizes", all(t.isdigit() and int(t) > 0 for t in items) and len(set(items)) == len(items),
                    "a comma list of distinct whole numbers > 0")

    def size_list(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.sizes.split(","))


def parameters(model, facts: int) -> dict:
    """The parameter count of the capacity law (Figure 4 left: attention 4*H*d_h*d, MLP 2*m*d
    per block, models.recall.weights.parameter_count), the facts it can hold at
    FACTS_PER_PARAMETER, the spare capacity (those minus the task's facts) and the fill (facts
    over capacity)."""
    cfg = model.cfg
    attention = 4 * cfg.n_heads * cfg.d_head * cfg.d_model * cfg.n_layers
    mlp = 2 * cfg.d_mlp * cfg.d_model * cfg.n_layers if has_mlp(model) else 0
    capacity = FACTS_PER_PARAMETER * (attention + mlp)
    return {"attention": attention, "mlp": mlp, "capacity": capacity, "spare_capacity": capacity - facts,
            "fill": facts / capacity}


def facts_located(model, task, contexts: int, seed: int) -> pd.DataFrame:
    """Per fact (subject, relation): its storage label, the head carrying its subject
    (editing.carrying_head: a tie goes to the largest key, then the lowest index; a share that
    patching cannot measure counts as none restored), and
    whether the model holds it (answers it in at least the storage rule's `known` share)."""
    from analyses.locate_facts import locate

    facts = locate(model, task, contexts=max(2, contexts), patch_contexts=1, seed=seed,
                   progress=False).facts.droplevel(columns.ANSWER)
    tokens = fact_batch(task, contexts, seed, model_device(model)).tokens  # [F * contexts, T]
    top = per_fact(hooked_last_logits(model, tokens).float(), contexts).argmax(-1).cpu()  # [F, contexts]
    answers = torch.as_tensor(task.facts).reshape(-1)  # [F] subject-major
    held = ((top == answers[:, None]).float().mean(1) >= StorageRule.known).tolist()  # [F]
    R = task.n_relations
    heads = [columns.patch("subject", columns.head(h)) for h in range(model.cfg.n_heads)]
    norms = edit_keys.head_key_norms(model, tokens, contexts).tolist()  # [F, H] each fact's key at each head
    restored = facts[heads].fillna(0.0).values  # [F, H]; NaN where patching moves nothing: no share restored
    carrying = [carrying_head(list(shares), norms[s * R + r]) for (s, r), shares in zip(facts.index, restored)]
    return pd.DataFrame({"label": facts[columns.LABEL].values, "head": carrying,
                         "held": [held[s * R + r] for s, r in facts.index]}, index=facts.index)


def one_layer_writes(model, located: pd.DataFrame, s: int, r: int, answer: int) -> list[tuple[dict, FactEdit]]:
    """Block 0's stores for fact (s, r): each write's columns and its edit (ov at the fact's carrying head)."""
    label, head = located.loc[(s, r), "label"], int(located.loc[(s, r), "head"])
    return [({"store": store, "head": head if store != "mlp" else None, "lives": WHERE.get(label) == store},
             FactEdit(s, r, answer, store, head)) for store in (("mlp", "ov", "both") if has_mlp(model) else ("ov",))]


def one_layer_batches(model, located: pd.DataFrame):
    """Mass editing at one layer: the facts it draws from, the stores a batch is written at, and
    each fact's edit there ("lives": where the fact lives), and the columns every row starts with."""
    pool = [f for f in located.index[located["held"] & located["label"].isin(list(WHERE))]]

    def edit(s: int, r: int, answer: int, store: str) -> FactEdit:
        return FactEdit(s, r, answer, WHERE[located.loc[(s, r), "label"]] if store == "lives" else store,
                        int(located.loc[(s, r), "head"]))
    return pool, (("mlp", "lives") if has_mlp(model) else ("lives",)), edit, {}


def single_edits(model, task, located: pd.DataFrame, settings: StudySettings, seed: int,
                 writes=one_layer_writes) -> pd.DataFrame:
    """Per sampled fact of each label, one edit at each store `writes` names (its columns and edit)."""
    rng = random.Random(seed)
    rows = []
    for label in LABELS:
        pool = [f for f in located.index[(located["label"] == label) & located["held"]]]
        for s, r in rng.sample(pool, min(settings.per_label, len(pool))):
            answer = new_answer(task, s, r, rng)
            for where, edit in writes(model, located, s, r, answer):
                row = {"label": label, "subject": s, "relation": r, **where}
                (table, spec), refusal = tried(model, task, [edit], settings, seed)
                if refusal:  # the store has no key for the fact: counted as refused
                    rows.append({**row, REFUSED: refusal})
                    continue
                one = table.iloc[0]
                rows.append({**row, **edit_counts.single_counts(one, spec, settings.contexts),
                             "old_rank": one["old_rank"], "leak": one["leak"], "boost": one["boost"],
                             **({"value": one["value"]} if "value" in one else {}),
                             "weight_change": one["weight_change"]})
    return pd.DataFrame(rows)


def mass_edits(model, task, located: pd.DataFrame, settings: StudySettings, seed: int,
               batches=one_layer_batches) -> pd.DataFrame:
    """Batches of n facts written at once, at each store `batches` names (a fixed store, or
    where each fact lives)."""
    rng = random.Random(seed + 1)
    pool, stores, edit, columns_first = batches(model, located)
    rows = []
    for n in sorted({min(n, len(pool) // 2) for n in settings.size_list()} - {0}):  # half: others to keep
        for draw in range(settings.draws):
            chosen = rng.sample(pool, n)
            answers = [new_answer(task, s, r, rng) for s, r in chosen]
            for store in stores:
                edits = [edit(s, r, a, store) for (s, r), a in zip(chosen, answers)]
                (table, spec), refusal = tried(model, task, edits, settings, seed)
                row = {"facts_edited": n, "draw": draw, "store": store, **columns_first}
                rows.append({**row, REFUSED: refusal} if refusal else
                            {**row, **edit_counts.batch_counts(table, spec, settings.contexts),
                             "others": spec["all"]["facts"], "weight_change": float(table["weight_change"].iloc[0]),
                             **({"optimised": int((table["value"] == "optimised").sum())} if "value" in table else {})})
    return pd.DataFrame(rows)


def summarize(single: pd.DataFrame, mass: pd.DataFrame) -> dict:
    """Counts added (k/n, Wilson intervals) by label x store, by where it lives against
    elsewhere (with the difference, Newcombe's interval), and by batch size x store."""
    where = {"where_it_lives" if row.pop("lives") else "elsewhere": row for row in pooled(single, ["lives"])}
    if len(where) == 2:
        where["difference"] = {s: edit_counts.difference(where["where_it_lives"], where["elsewhere"], s)
                               for s in ("efficacy", "won", "kept_all")}
    by = ["label", "store"] + (["lives"] if "layer" in single else [])  # at depth a label lives in several stores
    return {"by_label_store": pooled(single, by), "by_where": where,
            "mass": pooled(mass, ["facts_edited", "store"], ("efficacy", "won", "kept"))}


def figure(single: pd.DataFrame, mass: pd.DataFrame, path: Path | None = None):
    """Left: efficacy and the other facts kept by label x store; right: facts kept against
    facts edited at once, per checkpoint and store."""
    fig, (left, right) = subplots(1, 2, figsize=(11, 4))
    table = pd.DataFrame(edit_counts.pooled(single, ["label", "store"]))
    names = [f"{label}\n@{store}" for label, store in zip(table["label"], table["store"])]
    x = range(len(table))
    for shift, share, name in ((-0.2, "efficacy", "efficacy"), (0.2, "kept_all", "other facts kept")):
        bars = [table[share] - table[f"{share}_low"], table[f"{share}_high"] - table[share]]  # Wilson 95%
        left.bar([i + shift for i in x], table[share], width=0.4, yerr=bars, capsize=2, label=name)
    left.set_xticks(list(x), names, fontsize=7, rotation=90)
    left.set(ylim=(0, 1.05), ylabel="share", title="One fact edited: by storage label @ store")
    left.legend(fontsize=8, loc="lower left")
    for (ckpt, store), part in mass.groupby(["checkpoint", "store"]) if "kept" in mass else ():  # none: all refused
        means = part.groupby("facts_edited")["kept"].mean()
        right.plot(means.index, means.values, marker="o",
                   label=f"{Path(ckpt).name} (fill {part['fill'].iloc[0]:.2f}) @ {store}")
    right.set(xscale="log", ylim=(0, 1.05), xlabel="facts edited at once", ylabel="other facts kept",
              title="Mass editing")
    if right.get_lines():
        right.legend(fontsize=7)
    return save_figure(fig, path)


def _own(folder: Path) -> None:
    """claim's check: a folder holding anything but this study's files is not written over."""
    others = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in FILES)
    try:
        ours = "edit_study" in json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        ours = not (folder / "summary.json").exists()
    if others or not ours:
        raise ValueError(f"{folder} holds files that are not edit_study results "
                         f"({', '.join(others) or 'summary.json'}); choose another --out.")


def parser():
    p = cli.parser("python -m analyses.edit_study", __doc__)
    p.add_argument("ckpt", nargs="+", help=cli.CHECKPOINT_HELP + "; one or more")
    cli.add_out(p, "CKPT/analysis/edit_study, one checkpoint only")
    cli.add_device(p)
    cli.add_seed(p, "the facts sampled, their new answers and the keys' noise contexts")
    cli.add_quiet(p)
    cli.add_settings(p, StudySettings, "the study")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings = cli.settings(args, StudySettings)
    if args.out is None and len(args.ckpt) > 1:
        raise ValueError(f"{len(args.ckpt)} checkpoints: give --out DIR for the study's files.")
    ckpt_of = args.ckpt[0] if len(args.ckpt) == 1 else None
    out = claim(args.out if args.out is not None else Path(ckpt_of) / "analysis" / "edit_study", _own,
                ckpt=ckpt_of)
    loaded = [(ckpt, *load(ckpt, args.device, kind="factual_recall")) for ckpt in args.ckpt]
    depths = {ckpt: model.cfg.n_layers for ckpt, model, _ in loaded}
    if len(set(depths.values())) > 1:  # the stores' names differ with depth
        raise ValueError("the study compares checkpoints of one depth (its stores are named by block): got "
                         + ", ".join(f"{c} (L = {n})" for c, n in depths.items()) + "; run each depth apart.")
    start, singles, masses, checkpoints = time.perf_counter(), [], [], {}
    for ckpt, model, task in loaded:
        deep = edit_study_depth if model.cfg.n_layers > 1 else None
        located = (deep.facts_at_depth if deep else facts_located)(model, task, settings.contexts, args.seed)
        single = single_edits(model, task, located, settings, args.seed,
                              deep.writes if deep else one_layer_writes)
        single = single.assign(checkpoint=str(ckpt))
        capacity = parameters(model, task.n_facts)
        mass = mass_edits(model, task, located, settings, args.seed, deep.batches if deep else one_layer_batches)
        mass = mass.assign(checkpoint=str(ckpt), fill=capacity["fill"])
        singles.append(single)
        masses.append(mass)
        cfg = model.cfg
        checkpoints[str(ckpt)] = {"shape": {"d": cfg.d_model, "H": cfg.n_heads, "d_h": cfg.d_head,
                                            "m": cfg.d_mlp if has_mlp(model) else 0,
                                            **({"L": cfg.n_layers} if deep else {})},
                                  "facts": task.n_facts, "held": int(located["held"].sum()),
                                  "labels": located["label"].value_counts().to_dict(), **capacity,
                                  **summarize(single, mass)}
    single, mass = pd.concat(singles, ignore_index=True), pd.concat(masses, ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "study.csv", single)
    write_csv(out / "mass.csv", mass)
    figure(single, mass, out / "study.png")
    write_summary(out / "summary.json", {"edit_study": checkpoints, "overall": summarize(single, mass),
                                         "settings": {**recorded_settings(asdict(settings)), "seed": args.seed},
                                         "seconds": round(time.perf_counter() - start, 2)})
    print(report(single, mass, out))
    return 0


def report(single: pd.DataFrame, mass: pd.DataFrame, out: Path) -> str:
    lines, cell = [], edit_counts.cell
    for row in pooled(single, ["lives"]):
        lines.append(f"edited {'where the fact lives' if row['lives'] else 'elsewhere':22s}: {row['rows']} edits, "
                     f"efficacy {cell(row, 'efficacy')}, other facts kept {cell(row, 'kept_all')}" + _no_key(row))
    for row in pooled(mass, ["facts_edited", "store"], ("efficacy", "kept")):
        lines.append(f"{row['facts_edited']:4d} facts at once @ {row['store']:5s}: efficacy {cell(row, 'efficacy')}, "
                     f"other facts kept {cell(row, 'kept')}" + _no_key(row))
    if "layer" in single:  # at depth: the table by label x store
        lines += edit_study_depth.table(single)
    lines.append(f"wrote {out}/ ({', '.join(FILES)})")
    return "\n".join(lines)


def _no_key(row: dict) -> str:
    return f", {row[REFUSED]} refused (no key)" if row.get(REFUSED) else ""


if __name__ == "__main__":
    cli.run_cli(main)
