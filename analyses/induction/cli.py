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

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import torch

from analyses import recorded
from analyses.induction import studies
from analyses.induction.figures import layers_figure, location_figure, probes_figure
from analyses.induction.folders import kept_studies, study_folder
from analyses.induction.report import circuit_page
from analyses.sweeps import cli
from analyses.sweeps.output import write_csv, write_summary
from models import load
from models.bridge import resolve_device
from models.checkpoint import read_envelope, write_json, write_text
from models.induction.config import PRESETS, InductionModelConfig, preset
from models.induction.fits import check_fits
from models.induction.trainer import train
from models.out_folder import claim
from probe.induction import knowledge_location, memory_recall
from tasks.induction import TRIGGERS

ALONE_TEXT = {"target": "frozen at the construction's memories",
              "init": "frozen at their random initial values until step {until}, then trained",
              "none": ""}
TALK = {"one_layer": 0.55, "two_layers": 0.99}  # in-context accuracy: the talk's "Transformers on the bigram task"
RUN_FILE = "run.json"  # what the probes study's interrupted joint run was asked to do
ADAM_LR = 1e-3  # the layers study's AdamW learning rate
DEFAULT_RANKS = (1, 4, 16)  # location: the ranks W_out is truncated to, those the MLP has


def recipes(args):
    """(task, simplified model, its training, generic model, its training) of the preset, with the
    sizes the flags override."""
    task, model, cfg = preset(args.preset)
    task = replace(task, **{k: getattr(args, k) for k in ("n_triggers", "seq_len", "triggers") if getattr(args, k)})
    model = replace(model, d_model=args.d_model or model.d_model)
    layers = args.command == "layers"  # there --lr is the generic models' AdamW one
    cfg = replace(cfg, seed=(args.seed,), device=args.device, steps=args.steps or cfg.steps,
                  batch_size=args.batch_size or cfg.batch_size, lr=(args.lr,) if args.lr and not layers else cfg.lr)
    generic = InductionModelConfig("generic", 2, model.d_model, 1, 4 * model.d_model, True)
    adam = replace(cfg, optimizer="adam", lr=(args.lr if args.lr and layers else ADAM_LR,), loss="all")
    return task, model, replace(cfg, snapshot_every=cfg.eval_every), generic, adam


def run_layers(args, out: Path) -> dict:
    task, _, _, generic, adam = recipes(args)
    curves, _ = studies.one_against_two_layers(task, generic, adam, not args.quiet)
    write_csv(out / "layers.csv", curves)
    layers_figure(curves, out / "layers.png")
    return layers_summary(curves)


def layers_summary(curves: pd.DataFrame) -> dict:
    """The layers study's part of summary.json from its curves (layers.csv), printed."""
    final = curves.groupby("layers").last()
    summary = {"one_layer": final.loc[1, "in_context_accuracy"], "two_layers": final.loc[2, "in_context_accuracy"],
               "talk": TALK, "steps": int(final.loc[2, "step"])}
    print(f"in-context accuracy after {summary['steps']} steps: one layer {summary['one_layer']:.3f} (talk ~0.55), "
          f"two layers {summary['two_layers']:.3f} (talk ~0.99)")
    return summary


def run_probes(args, out: Path) -> dict:
    task, model, cfg, _, _ = recipes(args)
    every = args.probe_every or cfg.eval_every
    cfg = replace(cfg, eval_every=every, snapshot_every=every)
    until = args.until if args.until is not None else round(0.3 * cfg.steps / every) * every
    state = out / "train_state"  # the joint run's, so an interrupted study continues; removed when done
    run = {"task": asdict(task), "model": asdict(model), "training": asdict(cfg)}
    if (state / RUN_FILE).is_file() and json.loads((state / RUN_FILE).read_text()) != json.loads(json.dumps(run)):
        raise ValueError(f"{state} holds the training state of another probes run; remove it, or choose another --out.")
    state.mkdir(parents=True, exist_ok=True)
    write_json(state / RUN_FILE, run)
    probes, curves, joint = studies.joint_against_alone(task, model, cfg, not args.quiet, alone=args.alone,
                                                        until=until, state=state)
    replace(joint, snapshots={}).save(out / "probes_model")  # the joint run's final weights (circuit, location)
    shutil.rmtree(state, ignore_errors=True)
    write_csv(out / "probes.csv", probes)
    write_csv(out / "probes_curves.csv", curves)
    probes_figure(probes, curves, out / "probes.png")
    return probes_summary(args, run, until, probes, curves, out)


def probes_summary(args, run: dict, until: int, probes: pd.DataFrame, curves: pd.DataFrame, out: Path) -> dict:
    """The probes study's part of summary.json from its tables (probes.csv, probes_curves.csv) and what
    the run was asked to do (`run`); writes order.csv and joint_alone.csv and prints them."""
    task, model, cfg = (run[k] for k in ("task", "model", "training"))
    order = studies.learning_order(probes[probes["mode"] == "joint"])
    learned = studies.steps_to_learn(probes)
    accuracy = studies.accuracy_to_learn(curves)
    write_csv(out / "order.csv", order)
    print("learning order (first step with recall >= 0.9, joint training):\n" + steps_text(order))
    summary = {"sizes": {"K": task["n_triggers"], "triggers": task["triggers"], "T": task["seq_len"],
                         "d": model["d_model"], "batch": cfg["batch_size"], "lr": cfg["lr"][0],
                         "momentum": cfg["momentum"], "weight_decay": cfg["weight_decay"], "steps": cfg["steps"],
                         "probe_every": cfg["eval_every"]},
               "order": order.probe.tolist(), "first_step": dict(zip(order.probe, order.first_step)),
               "talk_order": ["wo1", "wk1", "wk0"], "alone": args.alone, "in_context_accuracy_0.9": accuracy,
               "run": run}
    if args.alone != "none":
        write_csv(out / "joint_alone.csv", learned)
        print(f"steps to recall >= 0.9, joint against alone (others {ALONE_TEXT[args.alone].format(until=until)}):"
              f"\n{steps_text(learned)}")
        summary.update(joint_alone=learned.to_dict("records"), until=until if args.alone == "init" else None)
    joint = curves[curves["mode"] == "joint"]
    summary["joint_final"] = joint.iloc[-1].drop(["mode", "trained_alone"]).to_dict()
    return summary


def steps_text(table: pd.DataFrame) -> str:
    """A table of first steps to print: whole numbers, and `never` where a memory was not learned."""
    steps = [c for c in ("first_step", "joint", "alone") if c in table]
    return table.astype({c: object for c in steps}).assign(
        **{c: [("never" if pd.isna(v) else int(v)) for v in table[c]] for c in steps}).to_string(index=False)


def run_circuit(model, task, out: Path, title: str) -> dict:
    html, scores = circuit_page(model, task, title)
    write_text(out / "circuit.html", html)
    write_csv(out / "heads.csv", scores)
    print(scores.to_string(index=False, float_format="%.3f"))
    return {"heads": scores.to_dict("records")}


def run_location(model, task, out: Path, ranks: tuple[int, ...]) -> dict:
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
        s.add_argument("--triggers", default=None, choices=TRIGGERS,
                       help="fixed (the K most frequent characters, the authors' fixed_special_toks) or random (drawn "
                            "per sequence from the marginals); default: the preset's (fixed)")
        s.add_argument("--d-model", type=int, default=None, help="d (default: the preset's)")
        s.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the preset's)")
        s.add_argument("--lr", type=float, default=None,
                       help="the generic models' AdamW learning rate (default 1e-3)" if name == "layers" else
                       "the simplified model's SGD learning rate (default: the preset's; the layers study: AdamW "
                       "1e-3)")
        s.add_argument("--seed", type=int, default=0, help="seed of the weights and data (default 0)")
        if name != "layers":
            s.add_argument("--probe-every", type=int, default=None,
                           help="probes: steps between snapshots and evaluations (default: the preset's eval_every; "
                                "the authors probe every 5)")
            s.add_argument("--alone", default="target", choices=studies.ALONE,
                           help="probes: how the other two memories are held while one trains alone: target (frozen "
                                "at the construction's), init (the authors' freeze_until: frozen at their random init "
                                "until --until, then trained), none (the joint run only); default target")
            s.add_argument("--until", type=int, default=None,
                           help="probes with --alone init: the step the others join training (default 30%% of the "
                                "steps, the authors' 300 of 1000)")
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
        cli.add_step(s)
        cli.add_quiet(s)
        if name == "location":
            s.add_argument("--ranks", type=cli.comma_list(int), default=None,
                           help="ranks the last MLP's output matrix is truncated to, each in 1..min(d_mlp, d_model) "
                                "(default 1,4,16: those in that range; none without an MLP)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    for flag in ("steps", "n_triggers", "seq_len", "d_model", "batch_size", "probe_every"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}.")
    for flag in ("lr", "threads"):
        if getattr(args, flag, None) is not None and not getattr(args, flag) > 0:
            raise ValueError(f"--{flag} must be > 0, got {getattr(args, flag)}.")
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command in ("circuit", "location"):
        out, summary = checkpoint_analysis(args)
    else:
        out = claim(args.out or Path(f"induction_{args.command}"), study_folder)
        fits(args)
        out.mkdir(parents=True, exist_ok=True)
        summary = {"preset": args.preset, "seed": args.seed, "settings": study_settings(args), "studies": []}
        if args.command == "reproduce":
            summary = kept_studies(out / "summary.json", summary)
        for name in STUDIES[args.command]:
            if name in summary["studies"]:
                print(f"{name}: kept, finished by an earlier run of these settings ({out}/summary.json)")
                continue
            try:
                summary.update(STUDY_RUNS[name](args, out))
            except KeyboardInterrupt:  # say what a rerun does
                kept = " (the studies finished before it are kept)" if args.command == "reproduce" else ""
                raise KeyboardInterrupt(f"interrupted in the {name} study; the same command continues{kept}: "
                                        + RERUN[name].format(state=out / "train_state")) from None
            summary["studies"].append(name)
            write_summary(out / "summary.json", summary)  # after each study: an interrupted run keeps it
    write_summary(out / "summary.json", summary)
    print(f"wrote {out}/")
    return 0


def fits(args) -> None:
    """Refuse (one line) a command whose training runs cannot fit in memory, before --out is made."""
    task, model, cfg, generic, adam = recipes(args)
    built = task.build()
    runs = {"layers": [(generic, adam)], "probes": [(model, cfg)],
            "mlp_model": [(replace(model, d_mlp=4 * model.d_model), replace(cfg, loss="all"))]}
    for name in STUDIES[args.command]:
        for model, cfg in runs[name]:
            check_fits(built, model, cfg, resolve_device(cfg.device))


def location_ranks(args, section: dict) -> tuple[int, ...]:
    """The ranks the location analysis truncates the last MLP's W_out [m, d] to: --ranks, each in
    1..min(m, d) (refused otherwise, and where the model has no MLP), or the defaults in that range.
    `section`: the checkpoint's model section (config.json's "model")."""
    most = 0 if section.get("mlp_layers", "none") == "none" else min(section["d_mlp"], section["d_model"])
    if args.ranks is None:
        return default_ranks(most)
    if not most:
        raise ValueError(f"--ranks: {args.ckpt} has no MLP to truncate; leave --ranks out.")
    wrong = [r for r in args.ranks if not 1 <= r <= most]
    if wrong:
        raise ValueError(f"--ranks must each be in 1..{most} (the last MLP's W_out is "
                         f"{section['d_mlp']} x {section['d_model']}), got {wrong[0]}.")
    return tuple(args.ranks)


def default_ranks(most: int) -> tuple[int, ...]:
    """The default ranks a W_out of rank at most `most` has."""
    return tuple(r for r in DEFAULT_RANKS if r <= most)


def study_settings(args) -> dict:
    """The flags that decide a training study's results (not where or how fast it runs)."""
    return {k: getattr(args, k) for k in ("preset", "steps", "n_triggers", "seq_len", "triggers", "d_model",
                                          "batch_size", "lr", "seed", "probe_every", "alone", "until")
            if hasattr(args, k)}


def checkpoint_analysis(args) -> tuple[Path, dict]:
    """circuit or location on a checkpoint (its final weights or snapshot --step): (the folder, the
    summary). The summary records its source (checkpoint, step, weights_sha256) and settings; a
    folder holding other results, or inside another checkpoint, is refused (analyses.recorded)."""
    name = f"induction_{args.command}"
    section = read_envelope(args.ckpt)["model"]  # a checkpoint of this toolkit; its kind is checked as it loads
    out = cli.out_dir(args, f"CKPT/analysis/{name}")
    origin = recorded.source(args.ckpt, args.step)
    ranks = location_ranks(args, section) if args.command == "location" else ()
    settings = {"ranks": list(ranks)} if args.command == "location" else {}
    wanted = {"step": args.step, recorded.HASH: origin[recorded.HASH], "settings": settings}
    recorded.refuse_other_results(name, out, wanted, args.ckpt, f"the induction {args.command} analysis")
    model, task = load(args.ckpt, args.device, args.step, kind="induction")  # --out is refused before it loads
    out.mkdir(parents=True, exist_ok=True)
    what = f"{args.ckpt}" + (f" at step {args.step}" if args.step is not None else "")
    found = (run_circuit(model, task, out, f"The induction circuit of {what}") if args.command == "circuit"
             else run_location(model, task, out, ranks))
    return out, {**origin, "settings": settings, **found}


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
    return {"mlp_model": {"source": recorded.source(out / "model"),
                          "final": {k: v for k, v in result.metrics[-1].items() if isinstance(v, float)},
                          "ff1_kl_first_last": [float(ff1.ff1_kl.iloc[0]), float(ff1.ff1_kl.iloc[-1])]},
            **run_circuit(loaded, built, out, "The induction circuit of the simplified model with a final MLP"),
            **run_location(loaded, built, out, default_ranks(min(loaded.cfg.d_mlp, loaded.cfg.d_model)))}


# each training study by name: what it adds to summary.json; the studies of each command, in order;
# what a rerun of an interrupted one does
RERUN = {"layers": "the layers study trains again from its start",
         "probes": "the joint run goes on from its last evaluation (its state in {state}), the runs of one memory "
                   "alone train again",
         "mlp_model": "the model with a final MLP trains again from its start"}
STUDY_RUNS = {"layers": lambda args, out: {"layers": run_layers(args, out)},
              "probes": lambda args, out: {"probes": run_probes(args, out)},
              "mlp_model": lambda args, out: reproduce_location(args, out)}
STUDIES = {"layers": ["layers"], "probes": ["probes"], "reproduce": ["layers", "probes", "mlp_model"]}
