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

    @classmethod
    def of(cls, facts: pd.DataFrame, heads: pd.DataFrame, task, settings: dict, seconds: float) -> LocateSummary:
        """The summary of the per-fact (`facts`, labelled) and per-head measurements."""
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
        return {**fields, **(source or {})}
