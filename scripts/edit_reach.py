"""Why a write below the last block fails with ROME's v*: for each fact of an edit study (its
study.csv), ROME's value delta at one block's store (probe/edit_values.py) is tried on the fact's 8
held-out prompts three ways, with no doubling: delta alone added to the store's output at the
key's position (can a change of that output there give the new answer?); the rank-one write
(edit_keys.write) at every position of the prompt, as a changed weight acts; and the same write at
the key's position only. `share` is the part of delta the write delivers at a held-out key,
(k C^-1 k*) / (k* C^-1 k*); `kept` counts the other facts' held-out prompts whose top answer
the write (at every position) leaves; a store whose key for the fact is empty is refused
(`refused`, no counts), as the editor refuses it. --clamp, --steps and --weight-decay replace ROME's settings;
--every-position takes C from the keys at every position (as the study does at the subject's)
for a last-position write too.

usage: python scripts/edit_reach.py CKPT STUDY_CSV --layer L --out CSV [--stores mlp:last,ov:last]
       [--clamp X --steps N --weight-decay X] [--every-position]
The new answers are drawn with --seed (not the study's: it does not record them).
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import pandas as pd
import torch

from models import load
from models.checkpoint import atomic_write
from models.out_folder import refuse_inside_checkpoint
from probe import edit_keys, edit_values
from probe.edit_effects import HELD_OUT
from probe.prompts import fact_batch

CONTEXTS = 8


def tried(model, task, fit, held, before, s: int, r: int, new: int, store: str, head, layer: int, position: str,
          every: bool = False) -> dict:
    """One fact's counts (k of CONTEXTS held-out prompts) at one store; `kept`: the other facts'
    held-out prompts whose top answer the write (at every position) leaves, of `before` [F * 8]."""
    T, R = fit.tokens.shape[1], task.n_relations
    row = s * R + r
    at = None if position == "last" else fit.subject_pos
    keys = edit_keys.store_keys(model, fit.tokens, store, head, layer, at)  # [F * 8, d_key]
    C = edit_keys.second_moment(keys if at is None and not every else
                                edit_keys.store_keys(model, fit.tokens, store, head, layer, "all"))
    k_star = edit_keys.fact_keys(keys, CONTEXTS)[[row]]  # [1, d_key]
    if edit_keys.empty_keys(k_star, keys)[0].any():  # the store does not read the fact: as the editor refuses it
        return {"refused": "no key"}
    last = torch.full((len(fit.tokens),), T - 1)
    where = fit.subject_pos if at is not None else last  # [F * 8]
    fact = torch.arange(row * CONTEXTS, (row + 1) * CONTEXTS)
    others = torch.tensor([(s * R + q) * CONTEXTS + c for q in range(R) if q != r for c in range(CONTEXTS)])
    delta = edit_values.optimised_value(model, fit.tokens[fact], where[fact], new, fit.tokens[others],
                                        where[others], store, head, layer)  # [d_model]
    dW = edit_keys.write(C, k_star, delta[None])  # [d_key, d_model]
    tokens = held.tokens[fact]
    pos = held.subject_pos[fact] if at is not None else last[:CONTEXTS]  # [8]
    name = edit_keys.hook_name(store, layer)
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    k_all = (cache[name] if store == "mlp" else cache[name][:, :, head]).float()  # [8, T, d_key]
    n = torch.arange(CONTEXTS)
    k_held = k_all[n, pos]  # [8, d_key]
    Ck = torch.linalg.solve(C, k_star.T)  # [d_key, 1]
    share = (k_held @ Ck / (k_star @ Ck)).squeeze(-1)  # [8]

    def wins(change) -> int:
        def add(x, hook):
            return x + change.to(x.dtype)
        with torch.inference_mode():
            logits = model.run_with_hooks(tokens, fwd_hooks=[(edit_values.output_hook(store, layer), add)])[:, -1]
        return int((logits.argmax(-1) == new).sum())
    at_key = torch.zeros(CONTEXTS, T, delta.shape[0])  # [8, T, d_model]
    at_key[n, pos] = delta
    written_at_key = torch.zeros_like(at_key)
    written_at_key[n, pos] = k_held @ dW
    everywhere = edit_keys.store_keys(model, held.tokens, store, head, layer, "all") @ dW  # [F * 8 * T, d_model]

    def add(x, hook):
        return x + everywhere.reshape(x.shape).to(x.dtype)
    with torch.inference_mode():
        after = model.run_with_hooks(held.tokens, fwd_hooks=[(edit_values.output_hook(store, layer), add)])[:, -1]
    others = torch.ones(len(held.tokens), dtype=torch.bool)
    others[fact] = False
    kept = int((after.argmax(-1) == before)[others].sum())
    return {"kept": kept, "kept_n": int(others.sum()),
            "delta": wins(at_key), "write": wins(k_all @ dW), "write_at_key": wins(written_at_key), "n": CONTEXTS,
            "share_mean": float(share.mean()), "share_min": float(share.min()), "share_max": float(share.max()),
            "delta_norm": float(delta.norm())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ckpt")
    p.add_argument("study", type=Path)
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--stores", default="mlp:last,ov:last,mlp:subject")
    p.add_argument("--clamp", type=float, default=edit_values.CLAMP)
    p.add_argument("--steps", type=int, default=edit_values.STEPS)
    p.add_argument("--weight-decay", type=float, default=edit_values.WEIGHT_DECAY)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--every-position", action="store_true",
                   help="C from the keys at every position for a last-position write too (as at the subject's)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    stores = [tuple(x.split(":")) for x in args.stores.split(",")]
    if any(len(x) != 2 or x[0] not in ("mlp", "ov") or x[1] not in ("last", "subject") or x == ("ov", "subject")
           for x in stores):
        print(f"error: --stores takes mlp:last, mlp:subject or ov:last, comma-separated; got {args.stores!r}",
              file=sys.stderr)
        return 2
    if not args.study.is_file():
        print(f"error: no study.csv at {args.study}", file=sys.stderr)
        return 2
    if args.out.exists():
        print(f"error: --out {args.out} exists; give a new file (nothing is written over)", file=sys.stderr)
        return 2
    try:  # a file is the checkpoint's own result only in its analysis/
        refuse_inside_checkpoint(args.out, ckpt=args.ckpt)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    edit_values.CLAMP, edit_values.STEPS, edit_values.WEIGHT_DECAY = args.clamp, args.steps, args.weight_decay
    try:
        model, task = load(args.ckpt, "cpu", kind="factual_recall")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not 0 <= args.layer < model.cfg.n_layers - 1:
        print(f"error: --layer is a block below the last (0 to {model.cfg.n_layers - 2}); got {args.layer}",
              file=sys.stderr)
        return 2
    fit, held = fact_batch(task, CONTEXTS, 0), fact_batch(task, CONTEXTS, HELD_OUT)
    with torch.inference_mode():
        before = model(held.tokens)[:, -1].argmax(-1)  # [F * 8] the top answers before any write
    study, rng, rows = pd.read_csv(args.study), random.Random(args.seed), []
    for (s, r), part in study.groupby(["subject", "relation"], sort=False):
        old = int(task.facts[s, r])
        new = rng.choice([a for a in task.relation_answers(r) if a != old])
        head = int(part[part["store"] == f"attention L{args.layer}"]["head"].iloc[0])  # the study's head
        for store, position in stores:
            rows.append({"subject": s, "relation": r, "new": new, "layer": args.layer, "store": store,
                         "position": position, "head": head if store == "ov" else None, "clamp": args.clamp,
                         "steps": args.steps, "weight_decay": args.weight_decay, "every_position": args.every_position,
                         **tried(model, task, fit, held, before, s, r, new, store, head if store == "ov" else None,
                                 args.layer, position, args.every_position)})
    frame = pd.DataFrame(rows)
    atomic_write(args.out, lambda tmp: frame.to_csv(tmp, index=False))
    counts = ["delta", "write", "write_at_key", "n", "kept", "kept_n"]
    print(frame.groupby(["store", "position"])[[c for c in counts if c in frame]].sum().to_string())
    shares = [c for c in ("share_mean", "share_min", "share_max", "delta_norm") if c in frame]
    print(frame.groupby(["store", "position"])[shares].median().to_string(float_format="%.3g"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
