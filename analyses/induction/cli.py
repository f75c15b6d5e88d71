"""python -m analyses.induction layers|probes|circuit|location|reproduce : in-context associations and
the induction head (Bietti et al. 2023; Bietti's talk, "Application to Transformers I").

  layers            one layer against two: the generic transformer (layer norm, MLPs, Adam, loss on every
                    token) with 1 and 2 layers; in-context accuracy over training (the talk: ~55% vs ~99%)
  probes            the memory recall probes over training of the simplified model (W_KQ^1, W_KQ^2, W_OV^2
                    trained, loss on the in-context outputs): their learning order, and each memory learned
                    alone with the others frozen at their target against all three together
  circuit CKPT      the previous-token and induction heads by their attention scores; circuitsvis views
                    on an offline HTML page
  location CKPT     where global and in-context knowledge live: the last MLP ablated, truncated to low
                    rank, or the induction head ablated (and the MLP's bigram KL over its snapshots)
  reproduce         all of it at a preset's size into --out (layers, probes, a simplified model with a final
                    MLP trained on every token, its circuit and location), with summary.json

Sizes come from the models.induction presets (cpu: d = 64, T = 64, batch 64, K = 3; paper: d = 256,
T = 256, batch 512, K = 5); --steps overrides the preset's steps. Every command writes CSV, PNG and
summary.json under --out and prints its table.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from analyses.induction import studies
from analyses.induction.figures import layers_figure, location_figure, probes_figure
from analyses.induction.report import circuit_page
from analyses.sweeps import cli
from analyses.sweeps.output import write_csv, write_summary
from models import load
from models.checkpoint import write_text
from models.induction.config import PRESETS, InductionModelConfig, preset
from models.induction.trainer import train
from probe.induction import knowledge_location, memory_recall

TALK = {"one_layer": 0.55, "two_layers": 0.99}  # in-context accuracy: the talk's "Transformers on the bigram task"


def recipes(args):
    """(task, simplified model, its training, generic model, its training) of the preset, with the
    sizes the flags override."""
    task, model, cfg = preset(args.preset)
    task = replace(task, **{k: getattr(args, k) for k in ("n_triggers", "seq_len") if getattr(args, k)})
    model = replace(model, d_model=args.d_model or model.d_model)
    cfg = replace(cfg, seed=(args.seed,), device=args.device, steps=args.steps or cfg.steps,
                  batch_size=args.batch_size or cfg.batch_size, lr=(args.lr,) if args.lr else cfg.lr)
    generic = InductionModelConfig("generic", 2, model.d_model, 1, 4 * model.d_model, True)
    adam = replace(cfg, optimizer="adam", lr=(1e-3,), loss="all")
    return task, model, replace(cfg, snapshot_every=cfg.eval_every), generic, adam


def run_layers(args, out: Path) -> dict:
    task, _, _, generic, adam = recipes(args)
    curves, _ = studies.one_against_two_layers(task, generic, adam, not args.quiet)
    write_csv(out / "layers.csv", curves)
    layers_figure(curves, out / "layers.png")
    final = curves.groupby("layers").last()
    summary = {"one_layer": final.loc[1, "in_context_accuracy"], "two_layers": final.loc[2, "in_context_accuracy"],
               "talk": TALK, "steps": int(final.loc[2, "step"])}
    print(f"in-context accuracy after {summary['steps']} steps: one layer {summary['one_layer']:.3f} (talk ~0.55), "
          f"two layers {summary['two_layers']:.3f} (talk ~0.99)")
    return summary


def run_probes(args, out: Path) -> dict:
    task, model, cfg, _, _ = recipes(args)
    curves = studies.joint_against_alone(task, model, cfg, not args.quiet)
    write_csv(out / "probes.csv", curves)
    probes_figure(curves, out / "probes.png")
    order = studies.learning_order(curves[curves["mode"] == "joint"])
    learned = studies.steps_to_learn(curves)
    write_csv(out / "order.csv", order)
    write_csv(out / "joint_alone.csv", learned)
    print("learning order (first step with recall >= 0.9, joint training):\n" + order.to_string(index=False))
    print("steps to recall >= 0.9, joint against alone (others at their target):\n" + learned.to_string(index=False))
    return {"sizes": {"K": task.n_triggers, "T": task.seq_len, "d": model.d_model, "batch": cfg.batch_size,
                      "lr": cfg.lr[0], "steps": cfg.steps},
            "order": order.probe.tolist(), "first_step": dict(zip(order.probe, order.first_step)),
            "talk_order": ["wo1", "wk1", "wk0"], "joint_alone": learned.to_dict("records")}


def run_circuit(model, task, out: Path, title: str) -> dict:
    html, scores = circuit_page(model, task, title)
    write_text(out / "circuit.html", html)
    write_csv(out / "heads.csv", scores)
    print(scores.to_string(index=False, float_format="%.3f"))
    return {"heads": scores.to_dict("records")}


def run_location(model, task, out: Path, ranks: tuple[int, ...], ckpt: Path | None = None) -> dict:
    table = knowledge_location(model, task, ranks=ranks)
    write_csv(out / "location.csv", table.reset_index())
    location_figure(table, out / "location.png")
    print(table.to_string(float_format="%.3f"))
    summary = {"location": table.reset_index().to_dict("records")}
    recall = memory_recall(model, task)
    if "ff1" in set(recall.probe):
        summary["ff1_kl"] = float(recall.loc[recall.probe == "ff1", "value"].iloc[0])
    return summary


def parser() -> cli.Parser:
    p = cli.parser("python -m analyses.induction", __doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=cli.Parser)
    for name, what in (("layers", "one layer against two"), ("probes", "memory recall probes over training"),
                       ("reproduce", "every study at a preset's size")):
        s = sub.add_parser(name, help=what, description=what)
        s.add_argument("--preset", default="cpu", choices=list(PRESETS), help="sizes (default cpu)")
        s.add_argument("--steps", type=int, default=None, help="training steps (default: the preset's)")
        s.add_argument("--n-triggers", type=int, default=None, help="K (default: the preset's)")
        s.add_argument("--seq-len", type=int, default=None, help="T (default: the preset's)")
        s.add_argument("--d-model", type=int, default=None, help="d (default: the preset's)")
        s.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the preset's)")
        s.add_argument("--lr", type=float, default=None,
                       help="the simplified model's SGD learning rate (default: the preset's; layers: AdamW 1e-3)")
        s.add_argument("--seed", type=int, default=0, help="seed of the weights and data (default 0)")
        cli.add_out(s, f"induction_{name}")
        cli.add_device(s)
        s.add_argument("--threads", type=int, default=None, help="torch threads (default torch's)")
        cli.add_quiet(s)
    for name, what in (("circuit", "the heads by their attention, circuitsvis views"),
                       ("location", "where global and in-context knowledge live")):
        s = sub.add_parser(name, help=what, description=what)
        cli.add_checkpoint(s)
        cli.add_out(s, f"CKPT/analysis/induction_{name}")
        cli.add_device(s)
        cli.add_quiet(s)
        if name == "location":
            s.add_argument("--ranks", type=cli.comma_list(int), default=(1, 4, 16),
                           help="ranks the last MLP's output matrix is truncated to (default 1,4,16)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    for flag in ("steps", "n_triggers", "seq_len", "d_model", "batch_size"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}.")
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command in ("circuit", "location"):
        model, task = load(args.ckpt, args.device, kind="induction")
        out = args.out or Path(args.ckpt) / "analysis" / f"induction_{args.command}"
        out.mkdir(parents=True, exist_ok=True)
        summary = (run_circuit(model, task, out, f"The induction circuit of {args.ckpt}") if args.command == "circuit"
                   else run_location(model, task, out, args.ranks))
    else:
        out = args.out or Path(f"induction_{args.command}")
        out.mkdir(parents=True, exist_ok=True)
        summary = {"preset": args.preset, "seed": args.seed}
        if args.command in ("layers", "reproduce"):
            summary["layers"] = run_layers(args, out)
        if args.command in ("probes", "reproduce"):
            summary["probes"] = run_probes(args, out)
        if args.command == "reproduce":
            summary.update(reproduce_location(args, out))
    write_summary(out / "summary.json", summary)
    print(f"wrote {out}/")
    return 0


def reproduce_location(args, out: Path) -> dict:
    """The simplified model with a final MLP (width 4d), trained on every token: its circuit, where its
    knowledge lives, and its MLP's bigram KL over training."""
    task, model, cfg, _, _ = recipes(args)
    result = train(task, replace(model, d_mlp=4 * model.d_model), replace(cfg, loss="all"), not args.quiet)[0]
    result.save(out / "model")
    ff1 = studies.ff1_over_training(result)
    curve = studies.curve_table(result)
    write_csv(out / "mlp_model_curve.csv", pd.merge(curve, ff1, on="step", how="left"))
    loaded, built = load(out / "model", args.device, kind="induction")
    return {"mlp_model": {"final": {k: v for k, v in result.metrics[-1].items() if isinstance(v, float)},
                          "ff1_kl_first_last": [float(ff1.ff1_kl.iloc[0]), float(ff1.ff1_kl.iloc[-1])]},
            **run_circuit(loaded, built, out, "The induction circuit of the simplified model with a final MLP"),
            **run_location(loaded, built, out, (1, 4, 16))}
