"""The numbers, the figure and the printed report of analyses/hops.py."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.sweeps.output import save_figure, subplots
from probe import columns
from probe.causal_tracing import peaks
from probe.hops import REUSES, ROLES

OUTPUTS = ("mlp", "attn")  # the outputs tracing's peaks are read among


def store_counts(frame: pd.DataFrame) -> dict[str, int]:
    """How many facts each store keeps (a fact kept in several counts in each), by store name."""
    names = [name for kept in frame[columns.STORE_LIST] for name in kept.split(";") if name]
    return pd.Series(names, dtype=object).value_counts().to_dict()


def one_hop_numbers(one_hop: pd.DataFrame) -> dict:
    """The one-hop facts: count, accuracy, labels, stores, per token set."""
    numbers = {"facts": len(one_hop), "accuracy": float(one_hop[columns.ACCURACY].mean()),
               "labels": one_hop[columns.LABEL].value_counts().to_dict(), "stores": store_counts(one_hop)}
    for token_set, group in one_hop.groupby(level="token_set"):
        numbers[f"token_set_{token_set}"] = {"labels": group[columns.LABEL].value_counts().to_dict(),
                                             "stores": store_counts(group)}
    return numbers


def two_hop_numbers(two_hop: pd.DataFrame) -> dict:
    """Per set (trained, held-out) and outcome (right: answered in at least the rule's `known` share
    of contexts): compositions, labels, stores, how many have a store and how many of those reuse
    the one-hop fact (b, r2)'s store; the same counts of the compositions no shortcut answers."""
    numbers = {}
    for held, by_set in two_hop.groupby("held_out"):
        for right, group in by_set.groupby("right"):
            stored = group[group[columns.STORE_LIST] != ""]
            numbers[f"{'held_out' if held else 'trained'}/{'right' if right else 'wrong'}"] = {
                "compositions": len(group), "accuracy": float(group[columns.ACCURACY].mean()),
                "labels": group[columns.LABEL].value_counts().to_dict(), "stores": store_counts(group),
                "with_a_store": len(stored), "reusing": int(stored[REUSES].sum()),
                "reuse_share": float(stored[REUSES].mean()) if len(stored) else None,
                "without_shortcut": int((group["shortcut"] == "").sum()),
                "with_a_store_without_shortcut": int((stored["shortcut"] == "").sum()),
                "reusing_without_shortcut": int(stored[REUSES][stored["shortcut"] == ""].sum())}
    return numbers


def tracing_numbers(effects: pd.DataFrame, two_hop: pd.DataFrame) -> dict:
    """Per set, outcome, corrupted role and noise: compositions, the mean clean and corrupted
    probabilities, the output (MLP or attention; layer, role) of the largest mean effect, the
    largest at the corrupted token's own position and at the last, and the per-composition peaks."""
    if effects.empty:
        return {}
    right = {":".join(map(str, key[:3])): bool(r) for key, r in two_hop["right"].items()}
    effects = effects.assign(right=effects["fact"].map(right))
    numbers = {}
    for (name, ok, corrupt, noise), group in effects.groupby(["set", "right", "corrupt", "noise"], sort=False):
        outputs = group[group["component"].isin(OUTPUTS)]
        mean = outputs.groupby(["component", "layer", "position"])["indirect_effect"].mean()
        first = group.drop_duplicates("fact")

        place = peaks(group).apply(lambda r: f"{r['store']} {r['layer']} {r['position']}", axis=1)
        numbers[f"{name}/{'right' if ok else 'wrong'}/{corrupt}/{noise}"] = {
            "compositions": len(first), "clean_probability": float(first["clean_probability"].mean()),
            "corrupted_probability": float(first["corrupted_probability"].mean()),
            "peak": _best(mean), "at_corrupted_token": _best(mean, corrupt), "at_last": _best(mean, "last"),
            "peaks": place.value_counts().to_dict()}
    return numbers


def _best(mean: pd.Series, position: str | None = None) -> dict | None:
    """The output (component, layer, position) of the largest mean effect [(component, layer, position)],
    at `position` only when given; None where there is none."""
    at = mean if position is None else mean[mean.index.get_level_values("position") == position]
    if not len(at):
        return None
    component, layer, where = at.idxmax()
    return {"component": component, "layer": int(layer), "position": where, "effect": float(at.max())}


def summarise(one_hop: pd.DataFrame, two_hop: pd.DataFrame, effects: pd.DataFrame) -> dict:
    return {"one_hop": one_hop_numbers(one_hop), "two_hop": two_hop_numbers(two_hop),
            "tracing": tracing_numbers(effects, two_hop)}


def figure(effects: pd.DataFrame, path: Path | None = None):
    """Per corrupted role (rows) and set (columns): the mean indirect effect of restoring the hidden
    state, per layer and role, under Gaussian noise."""
    sets = list(dict.fromkeys(effects["set"])) or ["trained"]
    fig, axes = subplots(len(ROLES), len(sets), figsize=(4.2 * len(sets), 2.4 * len(ROLES)), squeeze=False)
    fig.set_layout_engine("constrained")
    for i, corrupt in enumerate(ROLES):
        for j, name in enumerate(sets):
            ax = axes[i][j]
            chosen = effects[(effects["set"] == name) & (effects["corrupt"] == corrupt)
                             & (effects["noise"] == "gaussian") & (effects["component"] == "resid")]
            table = (chosen.groupby(["layer", "position"])["indirect_effect"].mean().unstack()
                     .reindex(columns=[r for r in (*ROLES, "noise", "last") if r in set(chosen["position"])]))
            if table.empty:
                ax.set_axis_off()
                continue
            image = ax.imshow(table.to_numpy(), aspect="auto", cmap="magma", vmin=0)
            ax.set_xticks(range(table.shape[1]), table.columns)
            ax.set_yticks(range(len(table)), [f"layer {layer}" for layer in table.index])
            ax.set_title(f"{corrupt} corrupted, {name.replace('_', '-')}", fontsize=9)
            fig.colorbar(image, ax=ax)
    return save_figure(fig, path)


def report(numbers: dict, ckpt: str, out: Path) -> str:
    one = numbers["one_hop"]
    lines = [f"{ckpt}: L = {numbers['n_layers']}; one-hop facts {one['facts']}, accuracy {one['accuracy']:.3f}, "
             "stores " + ", ".join(f"{k} {v}" for k, v in one["stores"].items())]
    for group, found in numbers["two_hop"].items():
        share = "none" if found["reuse_share"] is None else f"{found['reuse_share']:.2f}"
        lines.append(f"compositions {group}: {found['compositions']}, with a store {found['with_a_store']}, "
                     f"reusing the one-hop store {share}; stores "
                     + (", ".join(f"{k} {v}" for k, v in found["stores"].items()) or "none"))
    for run, found in numbers["tracing"].items():
        peak = found["peak"]
        lines.append(f"tracing {run}: P clean {found['clean_probability']:.3f}, corrupted "
                     f"{found['corrupted_probability']:.3f}; peak "
                     + ("none" if peak is None else f"{peak['component']} {peak['layer']} {peak['position']} "
                                                    f"{peak['effect']:.3f}"))
    lines.append(f"wrote {out}/ (one_hop_facts.csv, compositions.csv, tracing.csv, summary.json, hops.png) "
                 f"in {numbers['seconds']:.1f} s")
    return "\n".join(lines)
