"""The summary of a locate_facts run (summary.json): the accuracy, the share of facts per
storage label and the recall over facts, each a share with its 95% Wilson interval over
facts (probe.stats), and the heads ranked by denoising score."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import pandas as pd
import torch

from probe import columns
from probe.stats import share_with_interval
from probe.storage import LABELS


@dataclass(frozen=True)
class Interval:
    """A share over facts (a mean of values in [0, 1]) and its 95% Wilson interval."""
    value: float
    low: float
    high: float

    @classmethod
    def over_facts(cls, name: str, values: pd.Series) -> Interval:
        cols = share_with_interval(name, torch.tensor(values.to_numpy(dtype=float)))
        return cls(*(float(cols[k]) for k in columns.interval(name)))


@dataclass(frozen=True)
class TopHead:
    """A head's denoising scores (1 = all attention on the token, 0 = uniform)."""
    head: int
    denoising_score: float
    subject_score: float
    relation_score: float
    layer: int | None = None  # at depth, the head's layer (not written at one layer)


@dataclass(frozen=True)
class Source:
    """The checkpoint (and snapshot step, None for the final weights) the model came from,
    and the content hash of those weights (analyses.recorded.source)."""
    checkpoint: str
    step: int | None
    weights_sha256: str


@dataclass(frozen=True)
class LocateSummary:
    accuracy: float  # mean over facts of the share of contexts answered a*
    accuracy_interval: Interval
    n_facts: int
    label_counts: dict[str, int]  # facts per storage label, in the order of LABELS
    label_shares: dict[str, float]  # 0..1
    label_share_intervals: dict[str, Interval]
    recall: dict[str, Interval]  # ov_probe, mlp_probe (when measured): share of facts recalled
    path_accuracy: dict[str, Interval]  # attention, mlp: accuracy of each store's path alone
    top_heads: tuple[TopHead, ...]  # every head, best denoising score first
    task: str  # repr of the task
    settings: dict  # what was measured: contexts, patch_contexts, seed, the rule, the device
    seconds: float
    source: Source | None = None  # written as `checkpoint`, `step`, `weights_sha256` when known
    intervals: str = "wilson"  # how the intervals were computed (summaries without it: "bootstrap")
    stores: dict | None = None  # at depth, per store (probe.paths): layer, component, route, facts kept, share
    layer_components: dict[str, Interval] | None = None  # at depth, "layer 0 mlp": share of facts kept there

    @classmethod
    def of(cls, facts: pd.DataFrame, heads: pd.DataFrame, task, settings: dict, seconds: float,
           stores: list | None = None) -> LocateSummary:
        """The summary of the per-fact (`facts`, labelled) and per-head measurements; at depth,
        of the `stores` (probe.paths.Store) measured, the facts' `stores` column naming theirs."""
        if stores is not None:
            return _deep(cls, facts, heads, task, settings, seconds, stores)
        labels = facts[columns.LABEL]
        counts = {label: int((labels == label).sum()) for label in LABELS}
        n = len(facts)
        top = heads.sort_values("denoising_score", ascending=False)
        recall = {name: Interval.over_facts(name, facts[name].dropna())
                  for name in (columns.ov_probe(), columns.MLP_PROBE) if facts[name].notna().any()}
        return cls(
            accuracy=float(facts[columns.ACCURACY].mean()),
            accuracy_interval=Interval.over_facts(columns.ACCURACY, facts[columns.ACCURACY]),
            n_facts=n, label_counts=counts, label_shares={label: counts[label] / n for label in LABELS},
            label_share_intervals={label: Interval.over_facts(label, (labels == label).astype(float))
                                   for label in LABELS},
            recall=recall,
            path_accuracy={name: Interval.over_facts(name, facts[columns.path_accuracy(name)])
                           for name in columns.STORES},
            top_heads=tuple(TopHead(int(r.head), float(r.denoising_score), float(r.subject_score),
                                    float(r.relation_score)) for r in top.itertuples()),
            task=repr(task), settings=settings, seconds=seconds)

    def from_checkpoint(self, source: dict) -> LocateSummary:
        """This summary with its source (analyses.recorded.source: checkpoint, step, hash)."""
        return replace(self, source=Source(**source))

    def to_json(self) -> dict:
        """summary.json's content: every field, `source` as `checkpoint`, `step` and `weights_sha256`."""
        fields = asdict(self)
        source = fields.pop("source")
        if self.stores is None:  # one layer: the fields as before depth was measured
            del fields["stores"], fields["layer_components"]
            for head in fields["top_heads"]:
                del head["layer"]
        return {**fields, **(source or {})}


def _deep(cls, facts: pd.DataFrame, heads: pd.DataFrame, task, settings: dict, seconds: float,
          stores: list) -> LocateSummary:
    """LocateSummary.of at depth: shares of facts per store and per (layer, component), each with
    its Wilson interval; a fact kept in several stores counts in each."""
    labels, n = facts[columns.LABEL], len(facts)
    counts = {label: int((labels == label).sum()) for label in LABELS}
    kept = facts[columns.STORE_LIST].fillna("").str.split(";")
    per_store = {}
    for store in stores:
        mine = kept.map(lambda names, name=store.name: name in names).astype(float)
        share = Interval.over_facts(store.name, mine)
        per_store[store.name] = {"layer": store.layer, "component": store.component, "route": store.route,
                                 "facts": int(mine.sum()), "share": share.value, "low": share.low, "high": share.high}
    places = sorted({(store.layer, store.component) for store in stores})
    layer_components = {}
    for layer, component in places:
        names = {store.name for store in stores if (store.layer, store.component) == (layer, component)}
        mine = kept.map(lambda keep, names=names: bool(names.intersection(keep))).astype(float)
        layer_components[f"layer {layer} {component}"] = Interval.over_facts(component, mine)
    top = heads.sort_values("denoising_score", ascending=False)
    return cls(
        accuracy=float(facts[columns.ACCURACY].mean()),
        accuracy_interval=Interval.over_facts(columns.ACCURACY, facts[columns.ACCURACY]),
        n_facts=n, label_counts=counts, label_shares={label: counts[label] / n for label in LABELS},
        label_share_intervals={label: Interval.over_facts(label, (labels == label).astype(float)) for label in LABELS},
        recall={}, path_accuracy={s.name: Interval.over_facts(s.name, facts[columns.path_accuracy(s.name)])
                                  for s in stores},
        top_heads=tuple(TopHead(int(r.head), float(r.denoising_score), float(r.subject_score), float(r.relation_score),
                                int(r.layer)) for r in top.itertuples()),
        task=repr(task), settings=settings, seconds=seconds, stores=per_store, layer_components=layer_components)
