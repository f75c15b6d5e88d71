"""python -m analyses.hops CKPT/ : where each hop of two-hop recall lives, in a model trained with --hops 2.

Hop 1 and the one-hop facts: every one-hop fact r(s), with either of r's tokens, on --contexts prompts,
its last-position logits split into paths (a layer's attention OV write or MLP output, and the later
heads that moved it) and judged store by store by the storage rule (probe/paths.py, probe/storage.py,
as locate_facts does at depth). Hop 2: every composition (s, r1, r2) on two-hop prompts, judged the
same way, and whether a store keeping it also keeps the one-hop fact (b, r2), b = r1(s) (the model
reuses its memory of b:r2) or not (it memorised the composition); trained against held-out
compositions, right against wrong. Causal tracing (ROME) of --trace-compositions compositions of each
set: the subject, the r1 token and the r2 token corrupted in turn (Gaussian noise of 3 sigma, and
resampling), each (layer, role, component) restored (probe/hops.py). Writes one_hop_facts.csv,
compositions.csv, tracing.csv, summary.json and hops.png to DIR (default CKPT/analysis/hops).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from analyses import recorded
from analyses.hops_summary import figure, report, summarise
from analyses.sweeps import cli
from analyses.sweeps.output import write_csv, write_summary
from models import load
from models.training.progress import progress_bar
from probe import columns
from probe.causal_tracing import NOISE, n_steps
from probe.hooks import model_device
from probe.hops import ROLES, composition_prompts, located, one_hop_prompts, reuse, trace_compositions
from probe.storage import StorageRule

SETS = ("trained", "held_out")


@dataclass(frozen=True)
class HopsSettings:
    """On how many prompts each hop is located and traced."""

    contexts: int = field(default=8, metadata={"help": "prompts per fact and per composition for the storage rule"})
    trace_compositions: int = field(default=32, metadata={"help": "compositions of each set (trained, held-out) "
                                                                  "causal tracing measures"})
    trace_contexts: int = field(default=2, metadata={"help": "prompts per composition for causal tracing"})
    draws: int = field(default=3, metadata={"help": "noise draws per prompt for causal tracing"})

    def __post_init__(self):
        cli.at_least(self, contexts=2, trace_compositions=0, trace_contexts=1, draws=1)


def traced_triples(task, count: int, seed: int) -> dict[str, torch.Tensor]:
    """Per set, `count` compositions drawn with `seed` (all of them when fewer), sorted."""
    pools = {"trained": task.trained, "held_out": task.held_out}
    generator = torch.Generator().manual_seed(seed)
    return {name: pool[torch.randperm(len(pool), generator=generator)[:count]].sort().values
            for name, pool in pools.items() if len(pool)}


def locate_hops(model, task, contexts: int, seed: int,
                rule: StorageRule = StorageRule()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per one-hop fact, per composition) the storage rule's stores; compositions with REUSES."""
    batch, index = one_hop_prompts(task, contexts, seed)
    one_hop, _ = located(model, task, batch.to(model_device(model)), index, contexts, seed, rule)
    triples = torch.arange(task.n_subjects * task.n_relations ** 2)
    batch, index = composition_prompts(task, triples, contexts, seed)
    two_hop, _ = located(model, task, batch.to(model_device(model)), index, contexts, seed, rule)
    two_hop = reuse(task, one_hop, two_hop)
    return one_hop, two_hop.assign(right=two_hop[columns.ACCURACY] >= rule.known)


def trace_hops(model, task, settings: HopsSettings, seed: int, progress: bool = True) -> pd.DataFrame:
    """Causal tracing of each set's traced compositions, each role corrupted by each noise: one row per
    (set, corrupted role, noise, composition, layer, position, component)."""
    chosen = traced_triples(task, settings.trace_compositions, seed)
    runs = [(name, corrupt, noise) for name in chosen for corrupt in ROLES for noise in NOISE]
    per_run = n_steps(settings.trace_compositions, settings.trace_contexts, settings.draws)
    bar = progress_bar(total=per_run * len(runs), desc="causal tracing", unit="draw",
                       disable=not progress or not settings.trace_compositions)
    frames = []
    for i, (name, corrupt, noise) in enumerate(runs):
        if not len(chosen[name]):
            continue
        generator = torch.Generator(device=model_device(model)).manual_seed(seed + 1 + i)
        effects = trace_compositions(model, task, chosen[name], generator, settings.trace_contexts, seed, corrupt,
                                     noise, settings.draws, progress=lambda: bar.update(1))
        frames.append(effects.assign(set=name, corrupt=corrupt, noise=noise))
    bar.close()
    if not frames:
        return pd.DataFrame(columns=["set", "corrupt", "noise", "fact", "layer", "position", "component",
                                     "indirect_effect", "clean_probability", "corrupted_probability"])
    effects = pd.concat(frames, ignore_index=True)
    return effects[["set", "corrupt", "noise", *effects.columns[:-3]]]


def parser():
    p = cli.checkpoint_parser("hops", __doc__, "the prompts, the traced compositions and the noise")
    cli.add_settings(p, HopsSettings, "what is measured")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings = cli.settings(args, HopsSettings)
    out = cli.out_dir(args, "CKPT/analysis/hops")
    if args.out is None:  # beside the default settings' results, never over them
        out = out / recorded.settings_folder(settings)
    origin = recorded.source(args.ckpt, args.step)
    wanted = {"step": args.step, recorded.HASH: origin[recorded.HASH],
              "settings": {**asdict(settings), "seed": args.seed, "rule": asdict(StorageRule())}}
    recorded.refuse_other_results("hops", out, wanted, args.ckpt, "hops")
    model, task = load(args.ckpt, args.device, args.step, kind="two_hop")
    start = time.perf_counter()
    one_hop, two_hop = locate_hops(model, task, settings.contexts, args.seed)
    effects = trace_hops(model, task, settings, args.seed, progress=not args.quiet)
    numbers = {**origin, "settings": {**wanted["settings"], "device": str(model_device(model))},
               "n_layers": model.cfg.n_layers,
               **summarise(one_hop, two_hop, effects), "seconds": round(time.perf_counter() - start, 2)}
    write_csv(out / "one_hop_facts.csv", one_hop.reset_index())
    write_csv(out / "compositions.csv", two_hop.reset_index())
    write_csv(out / "tracing.csv", effects)
    figure(effects, out / "hops.png")
    write_summary(out / "summary.json", numbers)
    print(report(numbers, args.ckpt, out))
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
