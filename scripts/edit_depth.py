"""python scripts/edit_depth.py CKPT --out DIR [--contexts 8] [--margin 2] [--value auto|closed|optimise]

Hase et al.'s question where the truth is known: on a depth construction
(models.recall.deep_constructions, each fact's store in config.json's training.stores),
every held fact is given another answer at every store of every block (a head's W_O, the
MLP's W_out keyed at the last position, the MLP keyed at the subject's position where a
later block can carry it), one fact at a time, and each write is measured (efficacy,
specificity, leak: probe/edit_effects.py) or refused where the store has no key for the
fact. With causal_tracing's peaks.csv in CKPT/analysis/causal_tracing, each edit also says
whether it was made at the fact's traced peak. Writes edits_marginM.csv and table_marginM.md
(edits_marginM_V.csv and table_marginM_V.md with --value V other than closed)
to DIR.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

from models import load
from models.checkpoint import atomic_write
from models.out_folder import claim, only
from probe import edit_keys
from probe.edit_effects import edit_effects
from probe.edit_stores import name, stores
from probe.edit_values import VALUE_HELP, VALUES, found_by
from probe.editing import FactEdit, carrying_head, edit_facts, held
from probe.prompts import fact_batch

TRUTH = {"attention": ("ov", 0, "last"), "enriched": ("mlp", 0, "subject")}  # "mlp": the last block's, at the last


def peak_store(row) -> tuple[str, int, str] | None:
    """causal_tracing's peak (its layer l is block l - 1's output) as an edit's store; None for
    a tie or a head's output at the subject's position (no write of ours is keyed there)."""
    if row["store"] not in ("attention", "mlp") or (row["store"] == "attention" and row["position"] != "last"):
        return None
    return ("ov" if row["store"] == "attention" else "mlp", int(row["layer"]) - 1, row["position"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ckpt", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--contexts", type=int, default=8)
    p.add_argument("--margin", type=float, default=2.0)
    p.add_argument("--value", choices=VALUES, default="auto", help=VALUE_HELP)
    args = p.parse_args(argv)
    try:  # the one --out rule: a folder of its own (a run per margin), refused before any edit
        claim(args.out, only("edits_margin*.csv", "table_margin*.md"), ckpt=args.ckpt)
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    model, task = load(args.ckpt, "cpu")
    L, R = model.cfg.n_layers, task.n_relations
    training = json.loads((args.ckpt / "config.json").read_text())["training"]
    truth = ({(d["s"], d["r"]): d["store"] for d in training["stores"]} if "stores" in training  # a trained model:
             else {(s, r): "unknown" for s in range(task.n_subjects) for r in range(R)})  # no store known
    traced = args.ckpt / "analysis" / "causal_tracing" / "peaks.csv"
    peaks = ({tuple(map(int, row["fact"].split(":"))): peak_store(row) for _, row in pd.read_csv(traced).iterrows()}
             if traced.exists() else {})
    tokens = fact_batch(task, args.contexts, 0).tokens
    norms = {layer: edit_keys.head_key_norms(model, tokens, args.contexts, layer) for layer in range(L)}  # [F, H]
    rows = []
    for (s, r), kind in sorted(truth.items()):
        try:
            held(model, task, [FactEdit(s, r, 0)], args.contexts)
        except ValueError:  # a fact the model does not hold ("none"): nothing to edit
            continue
        block = task.relation_answers(r)
        new = block[(int(task.facts[s, r]) - block.start + 1) % len(block)]
        lives = TRUTH.get(kind, ("mlp", L - 1, "last")) if kind != "unknown" else None
        for store in stores(L):
            at, layer, position = store
            head = carrying_head([0.0] * model.cfg.n_heads, norms[layer][s * R + r].tolist()) if at == "ov" else None
            row = {"subject": s, "relation": r, "kind": kind, "store": name(store), "head": head,
                   "lives": store == lives, "peak": peaks.get((s, r)) == store, "refused": ""}
            try:
                edited = edit_facts(model, task, [FactEdit(s, r, new, at, head, layer, position)], args.contexts,
                                    margin=args.margin, value=args.value)
            except edit_keys.EmptyKey as e:
                rows.append({**row, "refused": str(e)})
                continue
            table, spec = edit_effects(model, edited.model, task, [(s, r, edited.old_answers[0], new)], args.contexts)
            rows.append({**row, "efficacy": table["efficacy"][0], "leak": table["leak"][0],
                         "boost": edited.boosts[0], **{f"kept_{g}": spec[g]["share"] for g in spec},
                         **({} if args.value == "closed" else {"value": found_by(edited.optimised)[0]}),
                         "weight_change": sum(float(d.norm() ** 2) for d in edited.deltas.values()) ** 0.5})
    edits = pd.DataFrame(rows)
    run = f"margin{args.margin:g}" + ("" if args.value == "closed" else f"_{args.value}")
    atomic_write(args.out / f"edits_{run}.csv", lambda tmp: edits.to_csv(tmp, index=False))
    atomic_write(args.out / f"table_{run}.md", lambda tmp: Path(tmp).write_text(tables(edits)))
    print(tables(edits))
    return 0


def cells(part: pd.DataFrame) -> str:
    written = part[part["refused"] == ""]
    if written.empty:
        return f"| {len(part)} | no key ({len(part)}) | | | | | |"
    refused = len(part) - len(written)
    return (f"| {len(part)} | {f'no key ({refused})' if refused else '—'} | {written['efficacy'].mean():.3f} "
            f"| {written['kept_all'].mean():.3f} | {written['kept_same_subject'].mean():.3f} "
            f"| {written['kept_same_relation'].mean():.3f} "
            f"| {written['leak'].mean():.2f} |")


def tables(edits: pd.DataFrame) -> str:
    def head(labels: str) -> str:
        names = f"| {labels} | edits | refused | efficacy | kept: all | same subject | same relation | leak |"
        return names + "\n" + "| --- " * (names.count("|") - 1) + "|"
    lines = [head("true store | store edited | lives there")]
    for (kind, store), part in edits.groupby(["kind", "store"]):
        lines.append(f"| {kind} | {store} | {'**yes**' if part['lives'].all() else 'no'} " + cells(part))
    lines += ["", head("edited at")]
    known = (edits["kind"] != "unknown").all()
    for label, part in (("the true store", edits[edits["lives"]]), ("the traced peak", edits[edits["peak"]]),
                        ("the peak, not the store", edits[edits["peak"] & ~edits["lives"]] if known else []),
                        ("elsewhere", edits[~edits["lives"]] if known else []),
                        ("not at the peak", edits[~edits["peak"]])):
        if len(part):
            lines.append(f"| {label} " + cells(part))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    torch.set_num_threads(1)
    raise SystemExit(main())
