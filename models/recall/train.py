"""python -m models.train --preset tiny --out ckpt/ : train one-layer models on the
factual-recall task and write the best as a checkpoint (docs/checkpoint_format.md).

Every task, model and training field of the preset can be overridden by a flag; comma
lists in --lr and --seed train one model per (lr, seed) at once and keep the best.
The attention-only models of the association and distribution tasks train with
`python -m models.aot.train`.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from models import cli
from models.bridge import resolve_device
from models.checkpoint import interrupted_run, load_checkpoint, write_json
from models.cli import override
from models.out_folder import FORCE_HELP, prepare_out
from models.recall.config import (
    HopsConfig,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    TwoHopTaskConfig,
    run_record,
    with_hops,
)
from models.recall.fits import check_fits
from models.recall.presets import PRESETS, preset
from models.recall.trainer import best_so_far, train
from models.recall.weights import parameter_count
from models.text import count
from models.training.graphed import use_cuda_graph
from models.training.train_state import state_dir

DEFAULT_PRESET = "tiny"
MOVABLE = ("device", "cuda_graph")  # where a run computes, not what: a resume may change them


def parser() -> cli.Parser:
    p = cli.parser("python -m models.train", __doc__)
    p.add_argument("--preset", default=None,
                   help=f"starting configuration: {', '.join(PRESETS)} or shape:ALPHA,BETA,H,D "
                        f"(default {DEFAULT_PRESET})")
    p.add_argument("--out", type=Path, default=None, help="checkpoint directory to write (default ckpt/PRESET)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--reuse", action="store_true",
                   help="keep the checkpoint at --out if it was trained with these same settings (one that was "
                        "interrupted is resumed) instead of training again; with --force, replace it otherwise")
    p.add_argument("--resume", type=Path, metavar="CKPT", default=None,
                   help="continue an interrupted run in CKPT from its last complete snapshot (its own settings; "
                        "--device and --cuda-graph may move it, e.g. from the CPU to CUDA, with --sampler counter)")
    p.add_argument("--wandb", metavar="PROJECT", default=None,
                   help="log to Weights & Biases (offline unless WANDB_MODE=online)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    cli.add_config_flags(p, TaskConfig, "task")
    cli.add_config_flags(p, HopsConfig, "two-hop recall", default_label="default")
    cli.add_config_flags(p, ModelConfig, "model")
    cli.add_config_flags(p, TrainConfig, "training")
    return p


def run_config(args: argparse.Namespace) -> RunConfig:
    base = preset(args.preset or DEFAULT_PRESET)
    return RunConfig(task=with_hops(override(base.task, cli.given(args, TaskConfig)), cli.given(args, HopsConfig)),
                     model=override(base.model, cli.given(args, ModelConfig)),
                     train=override(base.train, cli.given(args, TrainConfig)))


def summary(result, out: Path) -> str:
    t, task = result.training, result.task
    section = result.section
    counts = parameter_count(section)
    lines = [
        f"task      {task}  ({task.n_facts} facts)",
        f"model     {section.shape} ({counts['attention']} attention + {counts['mlp']} MLP parameters)",
        f"trained   {count(len(t['runs']), 'model')} for {_ran(result.session, t)} on {t['device']}",
    ]
    dropped = {d["model"]: d for d in t.get("dropped", [])}
    if len(t["runs"]) > 1:
        lines += [f"          lr={r['lr']:g} seed={r['seed']}: " +
                  (f"dropped at step {dropped[k]['step']} ({dropped[k]['reason']})" if k in dropped else
                   f"accuracy {r['accuracy']:.3f}, loss {r['loss']:.3f}") for k, r in enumerate(t["runs"])]
    lines += [f"kept      lr={t['lr']:g} seed={t['seed']}: held-out accuracy {t['final_accuracy']:.4f}, "
              f"loss {t['final_loss']:.4f}" + ("" if t["reached_target"] or t["target_accuracy"] > 1 else
                                             f"  (target {t['target_accuracy']} not reached)")]
    last = result.metrics[-1]
    if "two_hop" in last:  # the kept model's accuracy on each kind of prompt at the last evaluation
        held = "none held out" if last.get("held_out") is None else f"{last['held_out']:.4f}"
        lines.append(f"two-hop   one-hop facts {last['one_hop']:.4f}, trained compositions {last['two_hop']:.4f}, "
                     f"held-out compositions {held}")
    if t["stopped_by"].startswith("milestones"):
        best = best_so_far(result.metrics)
        fraction, accuracy = TrainConfig(steps=t["steps"], give_up="milestones").missed_milestone(t["steps_run"], best)
        lines.append(f"stopped   by the milestone rule (--give-up milestones) at step {t['steps_run']} of "
                     f"{t['steps']}: best held-out accuracy {best:.4f}, below {accuracy:g} at {fraction:g} of the "
                     "steps")
    lines.append(f"wrote     {out}/")
    return "\n".join(lines)


def _ran(session: dict | None, training: dict) -> str:
    """'1500 steps in 17.9 s', or for a resumed run what this call ran and the run's totals:
    '476 steps (1024 to 1500) in 9.1 s; the run: 1500 steps in 17.9 s'."""
    total = f"{count(training['steps_run'], 'step')} in {training['seconds']:.1f} s"
    if not session or session["from_step"] == 0:
        return total
    return (f"{count(session['steps'], 'step')} ({session['from_step']} to {training['steps_run']}) in "
            f"{session['seconds']:.1f} s; the run: {total}")


def read_run(ckpt: Path) -> tuple[RunConfig, str]:
    """The RunConfig and preset name an interrupted run in `ckpt` was started with."""
    path = ckpt / "run.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing; {ckpt} is not a run started by models.train, nothing to resume.")
    try:
        saved = json.loads(path.read_text())
        if isinstance(saved, dict) and "training" in saved and "train" not in saved:
            other_family(ckpt, "induction")  # models.induction.train's run.json
        train_cfg = {"sampler": "generator",  # runs started before the sampler was a setting drew with generators
                     **saved["train"], "lr": tuple(saved["train"]["lr"]), "seed": tuple(saved["train"]["seed"])}
        task_cls = TwoHopTaskConfig if "hops" in saved["task"] else TaskConfig
        run = RunConfig(task_cls(**saved["task"]), ModelConfig(**saved["model"]), TrainConfig(**train_cfg))
        return run, saved["preset"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{path}: not a valid run description.") from None


def other_family(ckpt: Path, kind: str) -> None:
    """Refuse (one line) to resume a run of another family than factual recall, naming its command."""
    if kind == "induction":
        raise ValueError(f"--resume {ckpt}: a run of the induction family, not a factual-recall one; resume it with "
                         f"`python -m models.induction.train --resume {ckpt}`.")
    if kind != "factual_recall":
        raise ValueError(f"--resume {ckpt}: a checkpoint of the {kind} task, not a factual-recall one; "
                         "models.train resumes factual-recall runs only.")


def same_settings(out: Path, run: RunConfig) -> bool:
    """Whether `out` holds a run started (run.json) with the settings of `run`, where it
    computes aside (MOVABLE). A setting the record lacks counts as different."""
    try:
        saved = json.loads((out / "run.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False

    def what(settings: dict) -> dict:
        return {**settings, "train": {k: v for k, v in settings["train"].items() if k not in MOVABLE}}
    wanted = what(json.loads(json.dumps(run_record(run))))
    return isinstance(saved, dict) and isinstance(saved.get("train"), dict) and \
        what({k: saved.get(k) for k in wanted}) == wanted


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.resume:
        overrides = [name for cls in (TaskConfig, HopsConfig, ModelConfig, TrainConfig) for name in cli.given(args, cls)
                     if name not in MOVABLE]
        overrides += [name for name in ("preset", "out", "force", "reuse") if getattr(args, name)]
        if overrides:
            flags = ", ".join("--" + n.replace("_", "-") for n in overrides)
            raise ValueError(f"--resume continues with the run's own settings; drop {flags}.")
        out = args.resume
        if (out / "config.json").is_file():
            other_family(out, load_checkpoint(out).task.kind)  # a damaged checkpoint is refused, not called complete
            print(f"{out} is a complete checkpoint; nothing to resume.")
            return 0
        run, preset_name = read_run(out)
        moved = {k: v for k, v in cli.given(args, TrainConfig).items() if k in MOVABLE}
        run = replace(run, train=override(run.train, moved))  # run.json keeps the device the run started on
        use_cuda_graph(run.train.cuda_graph, resolve_device(run.train.device), run.train.sampler)
    else:
        run, preset_name = run_config(args), args.preset or DEFAULT_PRESET
        run.train.validate()
        check_fits(run, resolve_device(run.train.device))  # from the configs: before the task is built
        section = run.model.checkpoint_section(run.task.build())  # refuse a bad task, model or device before --out
        use_cuda_graph(run.train.cuda_graph, resolve_device(run.train.device), run.train.sampler)  # `on` it can honour
        out = args.out or Path("ckpt") / preset_name.replace(":", "_").replace(",", "_")
        if args.reuse and same_settings(out, run) and (out / "config.json").is_file():
            kept = load_checkpoint(out).config["training"]  # a damaged checkpoint is refused, not kept
            print(f"{out} holds a checkpoint trained with these settings (held-out accuracy "
                  f"{kept['final_accuracy']:.4f}); kept it (drop --reuse to train again).")
            return 0
        if args.reuse and same_settings(out, run):
            print(f"{out} holds an interrupted run of these settings; resuming it.")
        else:
            out = prepare_out(out, args.force)
            write_json(out / "run.json", {"preset": preset_name, **run_record(run)})
        warning = run.train.milestones_warning(section.d_model)
        if warning:  # the rule outside the runs it was validated on: said before the run it may stop
            print(warning, file=sys.stderr)
    try:
        result = train(run, progress=not args.quiet, wandb_project=args.wandb, preset_name=preset_name,
                       state_folder=state_dir(out))
        result.save(out)
    except KeyboardInterrupt:  # Ctrl-C: say what was saved and how to go on
        raise KeyboardInterrupt(interrupted_run(out)) from None
    print(summary(result, out))
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
