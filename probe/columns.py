"""The names of the per-fact columns: written here once, called by the instruments that
produce a column and by everything that reads one (the storage rule, locate_facts, the
figures, the sweeps). docs/locate_facts.md lists them; tests/test_locate_facts.py holds
the two together.

A component is `head<h>`, `attention` (the heads summed), `mlp` or `direct` (EOS
embedding and biases); a store is `attention` or `mlp`."""
from __future__ import annotations

SUBJECT, RELATION, ANSWER = "subject", "relation", "answer"
FACT = (SUBJECT, RELATION, ANSWER)  # the index of every per-fact frame
ANSWER_NAME = "answer_name"  # a*'s name: R1:a3, relation 1's answer 3 (task.answer_label)
ACCURACY = "accuracy"  # share of contexts answered a*
MARGIN = "margin"  # logits: a* over the model's strongest rival in A_r
LABEL = "label"  # the storage rule's verdict
STORES = ("attention", "mlp")
MLP_PROBE = "mlp_probe"
# at depth (probe/paths.py): where a fact kept in one store lives, and the stores keeping it
LAYER, COMPONENT, ROUTE, STORE_LIST = "layer", "component", "route", "stores"


def interval(name: str) -> tuple[str, str, str]:
    """A measurement and its 95% interval, in that order (probe.stats: with_interval, share_with_interval)."""
    return name, f"{name}_low", f"{name}_high"


def head(h: int) -> str:
    return f"head{h}"


def margin(component: str) -> str:
    """The component's part of `margin` (logits)."""
    return f"{component}_{MARGIN}"


def head_margin(h: int) -> str:
    return margin(head(h))


def top(component: str) -> str:
    """Share of contexts where the component alone ranks a* first in A_r."""
    return f"{component}_top"


def own_margin(store: str) -> str:
    """The store's own margin of a* over its strongest other answer in A_r (logits)."""
    return f"{store}_own_margin"


def top_chance(store: str) -> str:
    """Share of facts the store's picks would rank first by chance (one value per model)."""
    return f"{store}_top_chance"


def top_z(store: str) -> str:
    """Standard errors the store's mean `top` lies above chance (one value per model)."""
    return f"{store}_top_z"


def share(store: str) -> str:
    """The store's margin over the full margin."""
    return f"{store}_share"


def ablation(kind: str, target: str) -> str:
    """An ablation's name: `kind` zero or mean, `target` heads, head<h> or mlp."""
    return f"{kind}_ablate_{target}"


def path(store: str) -> str:
    """The run in which only `store` writes to the logits (the other's write at its mean)."""
    return f"{store}_path"


def accuracy_under(edit: str) -> str:
    """Share of contexts answered a* with the run edited by `edit` (an ablation or a path)."""
    return f"{edit}_{ACCURACY}"


def ablated_accuracy(kind: str, target: str) -> str:
    return accuracy_under(ablation(kind, target))


def path_accuracy(store: str) -> str:
    return accuracy_under(path(store))


def patch(corrupt: str, component: str) -> str:
    """Share of the clean logit difference restored by patching `component` (head<h> or
    mlp) into prompts whose `corrupt` (subject or relation) was swapped."""
    return f"patch_{corrupt}_{component}"


def ov_probe(h: int | None = None) -> str:
    """1.0 where the OV recall probe of head h (of the heads summed: None) ranks a* first."""
    return "ov_probe" if h is None else f"ov_probe_{head(h)}"


def attribution(corrupt: str, component: str) -> str:
    """Attribution patching's linear estimate of `patch(corrupt, component)` (resid: the
    residual input at the corrupted token's position)."""
    return f"attrib_{corrupt}_{component}"
