"""Print the editing study's tables (results/editing/README.md) as Markdown from a study folder
(python -m analyses.edit_study ... --out DIR), or several: the models with their spare capacity, label x
store edited, where it lives against elsewhere, and mass editing; each share as
`share [95% Wilson interval] k/n` (analyses/edit_counts.py). Where a write was refused (a key
that carries nothing: probe.edit_keys.EmptyKey) a `refused` column counts those rows, which
add nothing to the counts.

usage: python scripts/edit_study_tables.py DIR [DIR ...]   (one table over all the folders)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from analyses.edit_counts import cell


def rows(header: list[str], body: list[list]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
                      *("| " + " | ".join(str(x) for x in row) + " |" for row in body)])


def shape(ckpt: Path) -> dict:
    """d, H, d_h, m from the checkpoint's config.json (for a summary written without them)."""
    model = json.loads((ckpt / "config.json").read_text())["model"]
    return {"d": model["d_model"], "H": model["n_heads"], "d_h": model["d_head"],
            "m": 0 if model["attn_only"] else model["d_mlp"]}


def refusals(frame: pd.DataFrame) -> pd.Series:
    """Per row: was its write refused (a study written before refusals were kept has none)."""
    if "refused" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["refused"].map(lambda reason: isinstance(reason, str) and reason != "")  # read back: NaN or ""


def mean(part: pd.DataFrame, column: str, form: str) -> str:
    """The mean of `column` over the writes made (a refused row holds none; a file of refused
    rows alone has no such column), or a dash."""
    return "—" if column not in part or part[column].isna().all() else format(part[column].mean(), form)


def tables(folders: list[Path]) -> str:
    summary = {k: v for f in folders for k, v in json.loads((f / "summary.json").read_text())["edit_study"].items()}
    study = pd.concat([pd.read_csv(f / "study.csv") for f in folders], ignore_index=True)
    mass = pd.concat([pd.read_csv(f / "mass.csv") for f in folders], ignore_index=True)
    study["refused"], mass["refused"] = refusals(study), refusals(mass)
    shown = bool(study["refused"].any() or mass["refused"].any())  # a refused column where any write was

    def refused(part: pd.DataFrame) -> list:
        return [int(part["refused"].sum()) or "—"] if shown else []
    models, labels, where, batches = [], [], [], []
    for ckpt, r in summary.items():
        name, s = Path(ckpt).name, r.get("shape") or shape(Path(ckpt))
        models.append([name, f"{s['d']}, {s['H']}, {s['d_h']}, {s['m']}", f"{r['held']} / {r['facts']}",
                       ", ".join(f"{k} {v}" for k, v in r["labels"].items()), f"{r['attention']} + {r['mlp']}",
                       f"{r['capacity']:.0f}", f"{r['spare_capacity']:.0f}", f"{r['fill']:.2f}"])
        mine = study[study["checkpoint"] == ckpt]
        for c in r["by_label_store"]:
            part = mine[(mine["label"] == c["label"]) & (mine["store"] == c["store"])]
            lives = "**yes**" if part["lives"].all() else "no"
            labels.append([name, c["label"], c["store"], lives, c["rows"], *refused(part), cell(c, "efficacy"),
                           cell(c, "won"), *(cell(c, f"kept_{g}") for g in ("all", "same_subject", "same_relation",
                                                                             "other")),
                           mean(part, "boost", ".2f")])
        for key in ("where_it_lives", "elsewhere"):
            if key in r["by_where"]:
                c = r["by_where"][key]
                part = mine[mine["lives"] == (key == "where_it_lives")]
                where.append([name, key.replace("_", " "), c["rows"], *refused(part), cell(c, "efficacy"),
                              cell(c, "won"), cell(c, "kept_all")])
        if "difference" in r["by_where"]:
            d = r["by_where"]["difference"]
            where.append([name, "*difference*", "", *([""] if shown else []),
                          *("—" if d[s]["difference"] is None else  # a side with every write refused
                            f"{d[s]['difference']:+.3f} [{d[s]['low']:+.2f}, {d[s]['high']:+.2f}]"
                            for s in ("efficacy", "won", "kept_all"))])
        heavy = mass[mass["checkpoint"] == ckpt]
        for c in r["mass"]:
            part = heavy[(heavy["facts_edited"] == c["facts_edited"]) & (heavy["store"] == c["store"])]
            batches.append([name, f"{r['fill']:.2f}", c["store"], c["facts_edited"], c["rows"], *refused(part),
                            cell(c, "efficacy"), cell(c, "won"), cell(c, "kept"), mean(part, "weight_change", ".3g")])
    extra = ["refused"] if shown else []
    return "\n\n".join([
        rows(["model", "shape (d, H, d_h, m)", "facts held", "labels", "law's params (4Hd_hd + 2md)",
              "capacity at 0.15/param", "spare", "fill"], models),
        rows(["model", "label", "store", "lives there", "edits", *extra, "efficacy", "won (edits)", "kept: all",
              "same subject", "same relation", "other", "mean boost"], labels),
        rows(["model", "edited", "edits", *extra, "efficacy", "won (edits)", "kept: all"], where),
        rows(["model", "fill", "store", "facts edited at once", "batches", *extra, "efficacy", "all won (facts)",
              "other facts kept", "‖ΔW‖"], batches)])


if __name__ == "__main__":
    given = [Path(a) for a in sys.argv[1:]]
    if not given or not all((f / "summary.json").is_file() for f in given):
        print("error: give edit_study folders (each holding summary.json, study.csv, mass.csv)", file=sys.stderr)
        sys.exit(2)
    print(tables(given))
