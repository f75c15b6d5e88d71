"""The editing study's shares as counts: every efficacy and specificity share as k of n
held-out prompts with its Wilson 95% interval (probe/stats.py), pooled over edits by adding
the counts; `won` (the new answer wins on every held-out prompt of the edit) as k of n edits.

The prompts of one write share its fate, so an interval over prompts is narrower than the
spread between edits; `won`, counted over edits, is the between-edit measure."""
from __future__ import annotations

import pandas as pd
import torch

from probe.stats import wilson_interval

SHARES = ("efficacy", "won", "kept_all", "kept_same_subject", "kept_same_relation", "kept_other")


def counted(name: str, k: int, n: int) -> dict:
    """Columns name (k/n), name_k, name_n, name_low, name_high; NaN shares where n = 0."""
    if n == 0:
        return {name: float("nan"), f"{name}_k": 0, f"{name}_n": 0, f"{name}_low": float("nan"),
                f"{name}_high": float("nan")}
    low, high = wilson_interval(torch.tensor(k / n), n)
    return {name: k / n, f"{name}_k": int(k), f"{name}_n": int(n), f"{name}_low": float(low),
            f"{name}_high": float(high)}


def refused(shares) -> dict:
    """A refused write's counts: every share n = 0 (added to a pool, it adds nothing)."""
    return {k: v for share in shares for k, v in counted(share, 0, 0).items()}


def single_counts(row, specificity: dict, contexts: int) -> dict:
    """One edit's counts: efficacy over its `contexts` held-out prompts, each specificity group
    over its other facts' prompts (edit_effects' shares are means over facts of shares over
    `contexts` prompts, so share * facts * contexts is a whole number of prompts)."""
    won = round(float(row["efficacy"]) * contexts)
    out = {**counted("efficacy", won, contexts), **counted("won", int(won == contexts), 1)}
    for group, spec in specificity.items():
        n = spec["facts"] * contexts
        out.update(counted(f"kept_{group}", round(spec["share"] * n) if n else 0, n))
    return out


def batch_counts(table: pd.DataFrame, specificity: dict, contexts: int) -> dict:
    """A batch written at once: efficacy over the edited facts' prompts, won over the edited
    facts, kept over every other fact's prompts."""
    wins = [round(float(e) * contexts) for e in table["efficacy"]]
    n = specificity["all"]["facts"] * contexts
    return {**counted("efficacy", sum(wins), contexts * len(wins)),
            **counted("won", sum(w == contexts for w in wins), len(wins)),
            **counted("kept", round(specificity["all"]["share"] * n) if n else 0, n)}


def pooled(frame: pd.DataFrame, by: list[str], shares=SHARES) -> list[dict]:
    """Per group of `by` (plain Python values, for JSON): each share's counts added over the
    group's rows (k/n of all its prompts or edits) with their Wilson interval, and the number
    of rows."""
    rows = []
    for key, part in frame.groupby(by):
        row = dict(zip(by, key)) | {"rows": len(part)}  # pandas gives the keys as Python values
        for share in shares:
            if f"{share}_k" in part:
                row.update(counted(share, int(part[f"{share}_k"].sum()), int(part[f"{share}_n"].sum())))
        rows.append(row)
    return rows


def difference(a: dict, b: dict, share: str) -> dict:
    """a's share minus b's with Newcombe's interval (his method 10: from the two Wilson
    intervals), 95%."""
    p, q = a[share], b[share]
    low = p - q - ((p - a[f"{share}_low"]) ** 2 + (b[f"{share}_high"] - q) ** 2) ** 0.5
    high = p - q + ((a[f"{share}_high"] - p) ** 2 + (q - b[f"{share}_low"]) ** 2) ** 0.5
    return {"difference": p - q, "low": low, "high": high}


def cell(row: dict, share: str, digits: int = 3) -> str:
    """`0.984 [0.917, 0.997] 63/64`: a share, its interval and its count, for the tables."""
    if not row.get(f"{share}_n"):
        return "—"
    return (f"{row[share]:.{digits}f} [{row[f'{share}_low']:.{digits}f}, {row[f'{share}_high']:.{digits}f}] "
            f"{row[f'{share}_k']}/{row[f'{share}_n']}")
