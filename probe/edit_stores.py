"""The stores an edit can be keyed at in a model of L blocks, and the one where a store of
locate_facts at depth (probe/paths.py) is written.

An edit's store is (at, layer, position): a head's W_O keyed at the last position ("ov"),
the MLP's W_out keyed at the last position, or, where a later block's heads can carry it,
keyed at the subject's position (ROME's key). A path store of probe/paths.py maps to one:
`attentionL` to block L's heads, `mlpL` to block L's MLP at the last position, `mlpL_via_...`
(moved to the last position by later heads) to block L's MLP at the subject's. A head's write
moved by later heads (`attentionL_via_...`) is read at the subject's position, where no write
of ours is keyed: it maps to none.
"""
from __future__ import annotations

import re

EditStore = tuple[str, int, str]  # (at: ov | mlp, layer, position: last | subject)
PATH_STORE = re.compile(r"(attention|mlp)(\d+)((?:_via_attention\d+)*)")  # probe.paths.Store.name


def stores(n_layers: int) -> list[EditStore]:
    """Every store an edit can be keyed at: (at, layer, position), block by block."""
    out = []
    for layer in range(n_layers):
        out += [("ov", layer, "last"), ("mlp", layer, "last")] + ([("mlp", layer, "subject")]
                                                                 if layer < n_layers - 1 else [])
    return out


def name(store: EditStore) -> str:
    """`attention L0`, `mlp L1`, `mlp L0 at subject` (layers are blocks, counted from 0)."""
    at, layer, position = store
    return f"{'attention' if at == 'ov' else 'mlp'} L{layer}" + (" at subject" if position == "subject" else "")


def written_at(path_store: str) -> EditStore | None:
    """The edit store of a locate_facts store name (attention0, mlp1, mlp0_via_attention1);
    None for a head's write moved by later heads. ValueError for a name that is no store."""
    match = PATH_STORE.fullmatch(path_store)
    if match is None:
        raise ValueError(f"{path_store!r} is not a store of locate_facts at depth (attention0, mlp0_via_attention1).")
    component, layer, moved = match.group(1), int(match.group(2)), bool(match.group(3))
    if component == "attention":
        return None if moved else ("ov", layer, "last")
    return ("mlp", layer, "subject" if moved else "last")


def lives_in(path_stores: str) -> tuple[EditStore, ...]:
    """The edit stores where a fact lives, from locate_facts' `stores` (';'-separated, '' for none),
    in its order, those with no edit store left out."""
    found = [written_at(s) for s in str(path_stores).split(";") if s and s != "nan"]
    return tuple(dict.fromkeys(s for s in found if s is not None))
