"""Attribution patching against activation patching on checkpoints: per checkpoint and
corruption (subject, relation), the agreement table of probe.attribution_patching.agreement
(per head, the MLP, and all pooled: correlation over facts, sign agreement, largest
difference), and the mean estimate for the residual input at the corrupted position
(activation patching restores 1 there by construction).

    .venv/bin/python scripts/attribution_agreement.py CKPT [CKPT ...] [--contexts 2] [--seed 0]
"""
import argparse

from models import load
from probe import columns
from probe.attribution_patching import agreement, attribution_patching
from probe.patching import activation_patching
from probe.prompts import FactPrompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpts", nargs="+")
    p.add_argument("--contexts", type=int, default=2, help="prompts per fact (default 2)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for ckpt in args.ckpts:
        model, task = load(ckpt, device="cpu", kind="factual_recall")
        prompts = FactPrompts.build(model, task, args.contexts, args.seed)
        for corrupt in ("subject", "relation"):
            attributed = attribution_patching(model, task, corrupt, prompts=prompts)
            table = agreement(activation_patching(model, task, corrupt, prompts=prompts), attributed, corrupt)
            resid = attributed[columns.attribution(corrupt, "resid")].mean()
            print(f"{ckpt}, {corrupt} swapped: residual at its position {resid:.3f} (activation patching: 1)")
            print(table.round(3).to_string(index=False), end="\n\n")


if __name__ == "__main__":
    main()
