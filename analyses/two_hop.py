"""python -m analyses.two_hop CKPT/ : the two-hop study of a model trained with --hops 2.

Reads the run's accuracy over training (one-hop facts, trained compositions, held-out
compositions: the metrics log) and, on --prompts two-hop prompts of the trained and of the
held-out compositions, where the bridge entity r1(s) is readable at the last position, per
layer: the logit lens (the bridge's rank among the entities) and a linear probe fitted on
half of the prompts (probe/bridge.py). Writes training.csv, bridge_layers.csv (per prompt set
and layer), bridge_prompts.csv (per prompt: the first layer whose lens puts the bridge on
top), summary.json and two_hop.png to DIR (default CKPT/analysis/two_hop).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from analyses import recorded
from analyses.sweeps import cli
from analyses.sweeps.output import save_figure, subplots, write_csv, write_summary
from models import load
from models.checkpoint import read_metrics
from probe.bridge import bridge_readout, resolution_by_outcome, shortcuts

SETS = {"two_hop": "trained compositions", "held_out": "held-out compositions"}
CURVES = {"one_hop": "one-hop facts", **SETS}
READABLE = 0.9  # the probe reads the bridge at a layer where its held-out accuracy reaches this


@dataclass(frozen=True)
class TwoHopSettings:
    """On how many prompts the bridge is read."""

    prompts: int = field(default=2000, metadata={"help": "two-hop prompts per set (trained, held-out compositions)"})

    def __post_init__(self):
        cli.at_least(self, prompts=4)


def curves(ckpt: str | Path) -> pd.DataFrame:
    """The kept model's accuracy per evaluation step: the held-out mix and each prompt set."""
    rows = [{"step": row["step"], "accuracy": row["accuracy"], **{k: row.get(k) for k in CURVES}}
            for row in read_metrics(ckpt)]
    return pd.DataFrame(rows, columns=["step", "accuracy", *CURVES])


def first_layer(values: pd.Series, at_least: float) -> int | None:
    """The first layer whose value reaches `at_least` (None: none does)."""
    reached = values[values >= at_least]
    return int(reached.index[0]) if len(reached) else None


def baselines(task) -> dict[str, float]:
    """Accuracy on the held-out compositions of answers that need no composition: relation r2's
    commonest output over all entities (ties: a guess among the tied ones, its expected accuracy),
    r2(s) (the first hop skipped), the bridge r1(s)."""
    if len(task.held_out) == 0:
        return {}
    s, _, r2, bridge, answer = task.composition(task.held_out)  # [n] each
    counts = torch.nn.functional.one_hot(task.facts, task.n_subjects).sum(0)  # [R, S] outputs of each relation
    commonest = counts == counts.max(-1, keepdim=True).values  # [R, S]
    guess = commonest[r2, answer].double() / commonest.sum(-1)[r2].double()  # [n] P(a tied guess is right)
    return {"r2_commonest": float(guess.double().mean()),
            **{name: float((value == answer).double().mean()) for name, value in
               (("first_hop_skipped", task.facts[s, r2]), ("bridge", bridge))}}


def study(model, task, n_prompts: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per set and layer, per prompt, numbers) of the bridge readouts on each prompt set."""
    layers, prompts, numbers = [], [], {}
    for i, (name, label) in enumerate(SETS.items()):
        if name == "held_out" and len(task.held_out) == 0:
            continue
        batch = task.eval_set(n_prompts, seed + i, mode=name)
        per_layer, per_prompt = bridge_readout(model, batch, seed)
        layers.append(per_layer.reset_index().assign(prompts=name))
        prompts.append(per_prompt.assign(prompts=name))
        numbers[name] = {"label": label, "accuracy": float(per_prompt["correct"].mean()),
                         "probe_layer": first_layer(per_layer["probe_accuracy"], READABLE),
                         "lens_layer": first_layer(per_layer["bridge_top1"], 0.5),
                         "by_outcome": resolution_by_outcome(per_prompt).to_dict(orient="index"),
                         "predicted": shortcuts(per_prompt, task.facts)}
    return pd.concat(layers, ignore_index=True), pd.concat(prompts, ignore_index=True), numbers


def figure(training: pd.DataFrame, layers: pd.DataFrame, path: Path | None = None):
    fig, (left, right) = subplots(1, 2, figsize=(9, 3.4))
    for name, label in CURVES.items():
        if training[name].notna().any():
            left.plot(training["step"], training[name], label=label)
    chance = float(layers["chance"].iloc[0])
    for ax in (left, right):
        ax.axhline(chance, ls=":", color="grey", label="chance (1/S)")
    left.set(xlabel="training step", ylabel="accuracy", title="accuracy over training", ylim=(-0.02, 1.02))
    left.legend(fontsize=8)
    for name, group in layers.groupby("prompts", sort=False):
        right.plot(group["layer"], group["probe_accuracy"], marker="o", label=f"probe, {SETS[name]}")
        right.plot(group["layer"], group["bridge_top1"], marker="x", ls="--", label=f"lens top-1, {SETS[name]}")
    right.set(xlabel="layer (0 = embedding)", ylabel="bridge read", title="the bridge r1(s) at the last position",
              ylim=(-0.02, 1.02))
    right.set_xticks(sorted(set(layers["layer"])))
    right.legend(fontsize=7)
    return save_figure(fig, path)


def report(numbers: dict, training: pd.DataFrame, out: Path) -> str:
    last = training.iloc[-1]
    lines = [f"{numbers['checkpoint']}: L = {numbers['n_layers']}, at step {int(last['step'])} one-hop "
             f"{last['one_hop']:.3f}, trained compositions {last['two_hop']:.3f}, held-out compositions "
             + ("none" if pd.isna(last["held_out"]) else f"{last['held_out']:.3f}")]
    if numbers["baselines"]:
        lines.append("held-out compositions without composing: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.3f}" for k, v in numbers["baselines"].items()))
    for found in numbers["sets"].values():
        lines.append(f"{found['label']}: answered {found['accuracy']:.3f}; the probe reads the bridge from layer "
                     f"{found['probe_layer']}, the lens from layer {found['lens_layer']}")
    lines.append(f"wrote {out}/ in {numbers['seconds']:.1f} s")
    return "\n".join(lines)


def parser():
    p = cli.checkpoint_parser("two_hop", __doc__, "the prompts and the probe's split")
    cli.add_settings(p, TwoHopSettings, "what is measured")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings = cli.settings(args, TwoHopSettings)
    out = cli.out_dir(args, "CKPT/analysis/two_hop")
    origin = recorded.source(args.ckpt, args.step)
    wanted = {"step": args.step, recorded.HASH: origin[recorded.HASH],
              "settings": {**asdict(settings), "seed": args.seed}}
    recorded.refuse_other_results("two_hop", out, wanted, args.ckpt, "two_hop")
    model, task = load(args.ckpt, args.device, args.step, kind="two_hop")
    start = time.perf_counter()
    training = curves(args.ckpt)
    layers, prompts, sets = study(model, task, settings.prompts, args.seed)
    numbers = {**origin, "settings": wanted["settings"], "n_layers": model.cfg.n_layers,
               "held_out_compositions": len(task.held_out), "baselines": baselines(task),
               "final": training.iloc[-1].to_dict(), "sets": sets,
               "seconds": round(time.perf_counter() - start, 2)}
    write_csv(out / "training.csv", training)
    write_csv(out / "bridge_layers.csv", layers)
    write_csv(out / "bridge_prompts.csv", prompts)
    figure(training, layers, out / "two_hop.png")
    write_summary(out / "summary.json", numbers)
    print(report(numbers, training, out))
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
