"""python scripts/hops_subject_order.py CKPT [CKPT ...] : is the subject position's early effect hop 1?

The models are causal: the subject's position can hold the bridge r1(s) only when the r1 token comes
before it. This traces (probe.causal_tracing.trace_prompts, the subject corrupted) 32 trained
compositions of a two-hop checkpoint on the prompts of analyses.hops (2 contexts, seed 0), once with
r1 put before s in every prompt and once after (the two tokens' positions swapped where needed), and
prints per order and noise the mean indirect effect of restoring block 0's MLP output and the hidden
state after block 0 at the subject's position, and the last block's MLP output at the last position.
The same effect in both orders reads the subject, not the bridge. Prints only; writes nothing.
"""
from __future__ import annotations

import sys

import torch

from models import load
from probe import hops
from probe.causal_tracing import NOISE_SCALE, embedding_std, trace_prompts
from tasks.two_hop import TwoHopBatch


def ordered(batch: TwoHopBatch, r1_first: bool) -> TwoHopBatch:
    """`batch` with s and r1 swapped wherever r1 is not (is) before s."""
    p, q = batch.positions, batch.positions.clone()
    swap = (p[:, 1] < p[:, 0]) != r1_first
    q[swap, 0], q[swap, 1] = p[swap, 1], p[swap, 0]
    rows, tokens = torch.arange(len(batch)), batch.tokens.clone()
    tokens[rows, q[:, 0]], tokens[rows, q[:, 1]] = batch.tokens[rows, p[:, 0]], batch.tokens[rows, p[:, 1]]
    return TwoHopBatch(tokens, batch.subjects, batch.relations, batch.bridges, batch.answers, batch.hops, q)


def main(ckpt: str) -> None:
    model, task = load(ckpt, "cpu", kind="two_hop")
    order = torch.randperm(len(task.trained), generator=torch.Generator().manual_seed(0))[:32]
    batch, index = hops.composition_prompts(task, task.trained[order].sort().values, 2, 0)
    last = model.cfg.n_layers
    for name, r1_first in (("r1 before s", True), ("s before r1", False)):
        chosen = ordered(batch, r1_first)
        for noise in ("gaussian", "resample"):
            corruption = (NOISE_SCALE * embedding_std(model, hops.role_tokens(task, "subject")) if noise == "gaussian"
                          else hops.resample(task, "subject"))
            effects = trace_prompts(model, chosen, index, hops.roles(chosen), "subject", corruption,
                                    torch.Generator().manual_seed(1), 3)
            mean = effects.groupby(["component", "layer", "position"])["indirect_effect"].mean()
            first = effects.drop_duplicates("fact")
            print(f"{ckpt} {name}, {noise}: P clean {first['clean_probability'].mean():.3f}, corrupted "
                  f"{first['corrupted_probability'].mean():.3f}; block 0 MLP at the subject "
                  f"{mean[('mlp', 1, 'subject')]:.3f}, hidden state after block 0 at the subject "
                  f"{mean[('resid', 1, 'subject')]:.3f}, block {last - 1} MLP at the last position "
                  f"{mean[('mlp', last, 'last')]:.3f}", flush=True)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        main(path)
