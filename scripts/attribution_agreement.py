"""Attribution patching against activation patching on checkpoints: per checkpoint and
corruption (subject, relation), the agreement table of probe.attribution_patching.agreement
(per head, the MLP, and all pooled: correlation over facts, sign agreement, largest
difference), and the mean estimate for the residual input at the corrupted position
(activation patching restores 1 there by construction). With --markdown, one summary row per
checkpoint and corruption instead (the table of docs/locate_facts.md, which
scripts/refresh_docs.py regenerates from it).

    .venv/bin/python scripts/attribution_agreement.py CKPT [CKPT ...] [--contexts 2] [--seed 0] [--markdown]
"""
import argparse

import pandas as pd

from models import load
from models.text import count
from probe import columns
from probe.attribution_patching import agreement, attribution_patching
from probe.patching import activation_patching
from probe.prompts import FactPrompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpts", nargs="+")
    p.add_argument("--contexts", type=int, default=2, help="prompts per fact (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--markdown", action="store_true", help="one summary row per checkpoint and corruption")
    args = p.parse_args()
    if args.markdown:
        print("| model, swapped token | components | correlation (pooled) | sign agreement (pooled) "
              "| largest difference | residual estimate |\n| --- | --- | --- | --- | --- | --- |")
    for ckpt in args.ckpts:
        model, task = load(ckpt, device="cpu", kind="factual_recall")
        prompts = FactPrompts.build(model, task, args.contexts, args.seed)
        for corrupt in ("subject", "relation"):
            attributed = attribution_patching(model, task, corrupt, prompts=prompts)
            table = agreement(activation_patching(model, task, corrupt, prompts=prompts), attributed, corrupt)
            resid = attributed[columns.attribution(corrupt, "resid")].mean()
            if args.markdown:
                print(summary_row(f"`{ckpt}`, {corrupt}", table, resid))
                continue
            print(f"{ckpt}, {corrupt} swapped: residual at its position {resid:.3f} (activation patching: 1)")
            print(table.round(3).to_string(index=False), end="\n\n")


TIE = 1e-3  # differences this close are one value (the row's last digit; float32's noise is ~1e-6)


def where(components) -> str:
    """'head 0', 'heads 0, 1, 2', 'heads 0, 2, MLP': the components named in the table's words."""
    heads = [c.removeprefix("head") for c in components if c.startswith("head")]
    named = [("head " if len(heads) == 1 else "heads ") + ", ".join(heads)] if heads else []
    return ", ".join(named + (["MLP"] if "mlp" in components else []))


def summary_row(name: str, table: pd.DataFrame, resid: float) -> str:
    """A Markdown row: the components, the pooled correlation and sign agreement (with the
    heads' range where pooled is below 1), the largest difference (and where: every component
    within TIE of it, so that float noise never picks one of a tie), the residual."""
    rows = table.set_index("component")
    heads = rows[rows.index.str.startswith("head")]
    pooled = rows.loc["all"]
    parts = [count(len(heads), "head") + (", MLP" if "mlp" in rows.index else "")]
    correlation = f"{pooled.correlation:.3f}"
    if round(pooled.correlation, 3) < 1 and heads.correlation.notna().any():
        correlation += f" (heads {heads.correlation.min():.2f}–{heads.correlation.max():.2f})"
    signs = f"{pooled.sign_agreement:.3f}"
    if round(pooled.sign_agreement, 3) < 1:
        signs += f" (heads ≥ {heads.sign_agreement.min():.3f})"
    parts += [correlation, signs]
    largest = rows.drop(index="all").max_abs_difference
    tied = largest.index[largest >= largest.max() - TIE]  # every component at the largest: a tie named whole
    difference = f"{largest.max():.3f}"
    if round(largest.max(), 3) > 0:
        mlp = f"; MLP {largest['mlp']:.3f}" if "mlp" in largest.index and "mlp" not in tied else ""
        difference += f" ({where(tied)}{mlp})"
    return f"| {name} | " + " | ".join([*parts, difference, f"{resid:.3f}"]) + " |"


if __name__ == "__main__":
    main()
