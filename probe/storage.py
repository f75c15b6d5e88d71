"""The decision rule: where is each fact stored? Labels `attention`, `mlp`, `both`,
`distributed` or `not_stored` from the measurements of the other instruments.

A component stores a fact when (1) its path alone recalls it — with the other
component's write to the logits replaced by its mean, the model still answers a* in at
least `sufficient` of the contexts — and (2) it carries at least `share` of the fact's
logit margin in the direct logit attribution. (1) alone is fooled by chance: a random,
untrained OV circuit ranks a* first in A_r for about 1/D of the facts; (2) alone is
fooled by components that push in the right direction without deciding the answer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

LABELS = ("attention", "mlp", "both", "distributed", "not_stored")


@dataclass(frozen=True)
class StorageRule:
    known: float = 0.5  # the model knows a fact it answers in at least this share of contexts
    sufficient: float = 0.5  # a path alone recalls the fact in at least this share of contexts
    share: float = 0.25  # ... and carries at least this share of the fact's logit margin

    def stores(self, facts: pd.DataFrame, component: str) -> pd.Series:
        return (facts[f"{component}_path_accuracy"] >= self.sufficient) & (facts[f"{component}_share"] >= self.share)

    def label(self, facts: pd.DataFrame) -> pd.Series:
        """One label per row of `facts`, which needs the columns accuracy,
        {attention,mlp}_path_accuracy and {attention,mlp}_share."""
        attention, mlp = self.stores(facts, "attention"), self.stores(facts, "mlp")
        known = facts["accuracy"] >= self.known
        labels = np.select([~known, attention & mlp, attention, mlp], ["not_stored", "both", "attention", "mlp"],
                           default="distributed")
        return pd.Series(labels, index=facts.index, name="label")
