"""The decision rule: where is each fact stored? Labels `attention`, `mlp`, `both`,
`distributed` or `not_stored` from the measurements of the other instruments.

A component (attention or the MLP) stores a fact when, judged on its own:
(1) its path alone recalls it — with the other component's write to the logits replaced by
its mean, the model still answers a* in at least `sufficient` of the contexts; and
(2) its own write picks it — its direct logit contribution alone ranks a* first within
A_r in at least `sufficient` of the contexts (`{component}_top`, probe/attribution.py) —
and the component picks the facts' answers more often than chance at all: its share of
facts ranked first lies `chance` standard errors above what picks that ignore the subject
would give (`{component}_top_z`).
Neither condition compares one component with the other, so a fact kept in both stays
`both` however loud one of them is. (1) alone is fooled by the mean write, which favours
common answers; (2) alone by chance: a random, untrained OV circuit ranks a* first for
about 1/D of the facts, but no more often than that.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from probe import columns

LABELS = ("attention", "mlp", "both", "distributed", "not_stored")


@dataclass(frozen=True)
class StorageRule:
    known: float = 0.5  # the model knows a fact it answers in at least this share of contexts
    sufficient: float = 0.5  # share of contexts in which a component's path recalls a* and its own write ranks it first
    chance: float = 3.0  # standard errors above chance a component's picks must lie before it stores anything

    def stores(self, facts: pd.DataFrame, component: str) -> pd.Series:
        return ((facts[columns.path_accuracy(component)] >= self.sufficient)
                & (facts[columns.top(component)] >= self.sufficient)
                & (facts[columns.top_z(component)] >= self.chance))

    def label(self, facts: pd.DataFrame) -> pd.Series:
        """One label per row of `facts`, which needs the columns accuracy,
        {attention,mlp}_path_accuracy, {attention,mlp}_top and {attention,mlp}_top_z."""
        attention, mlp = self.stores(facts, "attention"), self.stores(facts, "mlp")
        known = facts[columns.ACCURACY] >= self.known
        labels = np.select([~known, attention & mlp, attention, mlp], ["not_stored", "both", "attention", "mlp"],
                           default="distributed")
        return pd.Series(labels, index=facts.index, name=columns.LABEL)


def stores_of(rule: StorageRule, facts: pd.DataFrame, stores) -> pd.DataFrame:
    """Per fact, the stores (probe.paths.Store, any depth) that keep it by `rule`'s two conditions,
    each judged on its own: `label` (attention, mlp, both when stores of both components keep it,
    distributed, not_stored), `stores` (their names, ';'-separated, empty for none), and for a
    fact kept in one store its `layer`, `component` and `route` (`component` none when not_stored)."""
    keeps = pd.DataFrame({store.name: rule.stores(facts, store.name) for store in stores}, index=facts.index)
    known = facts[columns.ACCURACY] >= rule.known
    rows = []
    for (_, kept), is_known in zip(keeps.iterrows(), known):
        mine = [store for store in stores if kept[store.name]] if is_known else []
        kinds = {store.component for store in mine}
        label = ("not_stored" if not is_known else "distributed" if not kinds else "both" if len(kinds) > 1
                 else kinds.pop())
        one = mine[0] if len(mine) == 1 else None
        rows.append({columns.LABEL: label, columns.LAYER: one.layer if one else None,
                     columns.COMPONENT: one.component if one else "none" if label == "not_stored" else None,
                     columns.ROUTE: one.route if one else None,
                     columns.STORE_LIST: ";".join(store.name for store in mine)})
    return pd.DataFrame(rows, index=facts.index)
