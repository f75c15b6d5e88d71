"""python -m analyses.causal_tracing CKPT/ : causal tracing (ROME) of every fact.

Corrupts the subject's (--corrupt relation: the relation's) embedding with Gaussian noise
of 3 times the embeddings' standard deviation (--noise resample: another subject's token),
restores each hidden state, MLP output and attention output at each layer and position
from the clean run, and records the indirect effect on the answer's probability, averaged
over --draws noise draws and the prompts' contexts (probe/causal_tracing.py). Writes
effects.csv (fact, layer, position, component, indirect_effect and the clean and corrupted
probabilities), peaks.csv (per fact, the output with the largest effect and the severed
variant's reading), summary.json and one layer x position heat map per component to DIR
(default CKPT/analysis/causal_tracing; other settings in a folder inside it named after
them, e.g. corrupt-relation_draws-4). Positions are named by role: subject, relation,
noise (the mean over noise positions), last.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from analyses import recorded
from analyses.locate_facts import facts_folder
from analyses.sweeps import cli
from analyses.sweeps.output import save_figure, subplots, write_csv, write_summary
from analyses.visualize import parse_facts
from models import load
from models.training.progress import progress_bar
from probe.causal_tracing import COMPONENTS, CORRUPT, NOISE, ROLES, causal_trace, n_steps, peaks, severed_stores
from probe.hooks import model_device

OUTPUTS = "effects.csv, peaks.csv, summary.json, heat maps"


@dataclass(frozen=True)
class TracingSettings:
    """How causal_tracing corrupts and on how many prompts it measures each fact."""

    contexts: int = field(default=2, metadata={"help": "prompts per fact"})
    draws: int = field(default=10, metadata={"help": "noise draws per prompt"})
    corrupt: str = field(default="subject", metadata={"help": "the token corrupted", "choices": CORRUPT})
    noise: str = field(default="gaussian", metadata={"help": "gaussian noise, or resample another token",
                                                      "choices": NOISE})

    def __post_init__(self):
        cli.at_least(self, contexts=1, draws=1)
        cli.require(self, "corrupt", self.corrupt in CORRUPT, " or ".join(CORRUPT))
        cli.require(self, "noise", self.noise in NOISE, " or ".join(NOISE))


def trace(model, task, settings: TracingSettings = TracingSettings(), seed: int = 0, facts=None,
          progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(effects, peaks) of `facts` (every fact when None) on a TransformerBridge `model`."""
    n_facts = task.n_facts if facts is None else len(facts)
    bar = progress_bar(total=n_steps(n_facts, settings.contexts, settings.draws), desc="causal tracing",
                       unit="draw", disable=not progress)
    generator = torch.Generator(device=model_device(model)).manual_seed(seed + 1)
    effects = causal_trace(model, task, generator, settings.contexts, seed, facts, settings.draws, settings.corrupt,
                           settings.noise, progress=lambda: bar.update(1))
    bar.close()
    top = peaks(effects).join(severed_stores(effects, settings.corrupt))
    return effects, top


def summary(effects: pd.DataFrame, top: pd.DataFrame, settings: TracingSettings, seconds: float) -> dict:
    """The numbers summary.json records: mean probabilities, mean effect per component and
    position, and how many facts each store holds the peak of."""
    per_fact = effects.drop_duplicates("fact")
    means = effects.groupby(["component", "layer", "position"])["indirect_effect"].mean()
    return {"n_facts": len(per_fact), "settings": asdict(settings),
            "clean_probability": float(per_fact["clean_probability"].mean()),
            "corrupted_probability": float(per_fact["corrupted_probability"].mean()),
            "mean_effects": {f"{c}/{layer}/{p}": float(v) for (c, layer, p), v in means.items()},
            "peak_stores": top["store"].value_counts().to_dict(),
            "severed_stores": top["severed_store"].value_counts().to_dict(), "seconds": seconds}


def heatmap(effects: pd.DataFrame, component: str, path: Path | None = None):
    """Layer x position (role) heat map of one component's mean indirect effect."""
    table = (effects[effects["component"] == component].groupby(["layer", "position"])["indirect_effect"].mean()
             .unstack().reindex(columns=[r for r in ROLES if r in set(effects["position"])]))
    fig, ax = subplots(figsize=(4.5, 1.2 + 0.45 * len(table)))
    image = ax.imshow(table.to_numpy(), aspect="auto", cmap="magma", vmin=0)
    ax.set_xticks(range(table.shape[1]), table.columns)
    ax.set_yticks(range(len(table)), [f"layer {layer}" for layer in table.index])
    ax.set_title(f"causal tracing: {component}")
    fig.colorbar(image, ax=ax, label="indirect effect (probability)")
    return save_figure(fig, path)


def write(effects: pd.DataFrame, top: pd.DataFrame, facts: dict, out: Path) -> None:
    write_csv(out / "effects.csv", effects)
    write_csv(out / "peaks.csv", top.reset_index())
    for component in COMPONENTS:
        if component in set(effects["component"]):
            heatmap(effects, component, out / f"heatmap_{component}.png")
    write_summary(out / "summary.json", facts)


def report(facts: dict, ckpt: str, out: Path) -> str:
    lines = [f"{ckpt}: {facts['n_facts']} facts, P(answer) clean {facts['clean_probability']:.3f}, "
             f"corrupted {facts['corrupted_probability']:.3f}",
             "peak of the indirect effect (MLP or attention output): "
             + ", ".join(f"{k} {v}" for k, v in facts["peak_stores"].items()),
             "severed (share of the effect through the MLPs): "
             + ", ".join(f"{k} {v}" for k, v in facts["severed_stores"].items()),
             *([f"against the storage rule (locate_facts): the peak agrees on {agreed['peak_agrees']} of "
                f"{agreed['of']} facts, the severed reading on {agreed['severed_agrees']}"]
               if (agreed := facts.get("storage_rule_agreement")) else []),
             *([f"against the construction's known stores: the peak names the component on "
                f"{known['peak_component_agrees']} of {known['of']} facts (also the layer and position on "
                f"{known['peak_place_agrees']}), the severed reading on {known['severed_agrees']}"]
               if (known := facts.get("known_store_agreement")) else []),
             f"wrote {out}/ ({OUTPUTS}) in {facts['seconds']:.1f} s"]
    return "\n".join(lines)


def with_storage_rule(top: pd.DataFrame, ckpt: str | Path, weights_sha256: str) -> pd.DataFrame:
    """`top` with the storage rule's label of each fact (column `rule`) from locate_facts'
    default results of the same weights, when CKPT/analysis/locate_facts holds them."""
    folder = Path(ckpt) / "analysis" / "locate_facts"
    if not (folder / "facts.csv").is_file() or recorded.differences(folder, {recorded.HASH: weights_sha256}):
        return top
    rule = pd.read_csv(folder / "facts.csv")
    labels = dict(zip(rule["subject"].astype(str) + ":" + rule["relation"].astype(str), rule["label"]))
    return top.assign(rule=[labels.get(fact) for fact in top.index])


def with_known_stores(top: pd.DataFrame, ckpt: str | Path) -> pd.DataFrame:
    """`top` with each fact's known store (columns `known`, `known_layer`, `known_position`) when the
    checkpoint is a construction that records them (config.json's training.stores): block b's
    output is tracing's layer b + 1; a store moved by later heads sits at the subject's position."""
    config = json.loads((Path(ckpt) / "config.json").read_text()) if (Path(ckpt) / "config.json").is_file() else {}
    stores = (config.get("training") or {}).get("stores")
    if not stores:
        return top
    known = {f"{s['s']}:{s['r']}": s for s in stores}
    rows = [known.get(fact, {"component": "none", "layer": None, "route": None}) for fact in top.index]
    return top.assign(known=[row["component"] for row in rows],
                      known_layer=[None if row["layer"] is None else row["layer"] + 1 for row in rows],
                      known_position=["last" if row["route"] == "direct" else "subject" for row in rows])


def known_agreement(top: pd.DataFrame) -> dict:
    """How many facts' peak names the known store (component; also layer and position) and
    how many severed readings name its component."""
    if "known" not in top:
        return {}
    component = top["store"] == top["known"]
    place = component & (top["layer"] == top["known_layer"]) & (top["position"] == top["known_position"])
    return {"of": len(top), "known_stores": top["known"].value_counts().to_dict(),
            "peak_component_agrees": int(component.sum()), "peak_place_agrees": int(place.sum()),
            "severed_agrees": int((top["severed_store"] == top["known"]).sum())}


def agreement(top: pd.DataFrame) -> dict:
    """How many facts' tracing store (peak, severed) is the storage rule's label."""
    if "rule" not in top:
        return {}
    return {"of": len(top), "rule_labels": top["rule"].value_counts().to_dict(),
            "peak_agrees": int((top["store"] == top["rule"]).sum()),
            "severed_agrees": int((top["severed_store"] == top["rule"]).sum())}


def parser():
    p = cli.checkpoint_parser("causal_tracing", __doc__, "the prompts and the noise")
    p.add_argument("--facts", default=None, metavar="S:R,...", help="trace these facts only, e.g. 3:1,7:0")
    cli.add_settings(p, TracingSettings, "what is measured")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings = cli.settings(args, TracingSettings)
    model, task = load(args.ckpt, args.device, args.step, kind="factual_recall")
    facts = None if args.facts is None else parse_facts(args.facts, task)
    out = cli.out_dir(args, "CKPT/analysis/causal_tracing")
    if args.out is None:  # beside the default settings' results, never over them
        extra = recorded.settings_folder(settings)
        out = out / extra / (facts_folder(facts) if facts is not None else "")
    origin = recorded.source(args.ckpt, args.step)
    measured = {**asdict(settings), "seed": args.seed, **({} if facts is None else {"facts": [list(f) for f in facts]})}
    wanted = {"step": args.step, recorded.HASH: origin[recorded.HASH], "settings": measured}
    recorded.refuse_other_results("causal_tracing", out, wanted, args.ckpt, "causal_tracing")
    start = time.perf_counter()
    effects, top = trace(model, task, settings, args.seed, facts, progress=not args.quiet)
    top = with_known_stores(with_storage_rule(top, args.ckpt, origin[recorded.HASH]), args.ckpt)
    numbers = summary(effects, top, settings, round(time.perf_counter() - start, 2))
    numbers["storage_rule_agreement"] = agreement(top)
    numbers["known_store_agreement"] = known_agreement(top)
    numbers.update({**origin, "settings": {**measured, "device": str(model_device(model))}})
    write(effects, top, numbers, out)
    print(report(numbers, args.ckpt, out))
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
