"""python -m models.induction.train --preset cpu --out ckpt/induction : train models of the induction
family (Bietti et al. 2023) on the trigger task and write each as a checkpoint
(docs/checkpoint_format.md) that `models.load` opens as a TransformerLens model.

The task is a character-level text's bigrams with K triggers whose outputs change per sequence;
the model the authors' simplified two-layer model (--architecture simplified) or a generic one- or
two-layer transformer (--architecture generic --n-layers 1); training SGD with momentum and weight
decay (or --optimizer adam) on fresh batches. One model per --lr and --seed: one model is written
to --out, several to --out/lr<LR>_seed<SEED>/. While a run lasts, its training state is kept under
--out/train_state (the last evaluation's, and those of the snapshot steps); --resume continues an
interrupted run there, bit-identically, and the finished run removes it. A run that cannot fit in
memory is refused before anything is written.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from models import cli
from models.bridge import resolve_device
from models.checkpoint import complete_steps, write_json
from models.cli import override
from models.induction.config import (
    PRESETS,
    InductionModelConfig,
    InductionTaskConfig,
    InductionTrainConfig,
    preset,
)
from models.induction.fits import check_fits
from models.induction.trainer import train
from models.induction.weights import trainable_keys
from models.out_folder import FORCE_HELP, prepare_out
from models.training.result import TrainResult

RUN_FILE = "run.json"  # what a resumable run was asked to do
STATE = "train_state"  # the run's training state while it lasts
DEFAULT_PRESET = "cpu"


def parser() -> cli.Parser:
    p = cli.parser("python -m models.induction.train", __doc__)
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"{' | '.join(PRESETS)} (default cpu: under two minutes "
                   "on a 2-core CPU; paper: the authors' d = 256, T = 256, batch 512)")
    p.add_argument("--out", type=Path, default=None,
                   help="checkpoint directory to write (default ckpt/induction_PRESET)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--resume", type=Path, default=None, metavar="OUT",
                   help="continue the interrupted run at OUT (its settings are read from OUT/run.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    label = f"default, {DEFAULT_PRESET} preset"  # the values a run starts from without --preset
    for config_cls, title, base in zip((InductionTaskConfig, InductionModelConfig, InductionTrainConfig),
                                       ("task", "model", "training"), PRESETS[DEFAULT_PRESET]):
        cli.add_config_flags(p, config_cls, title, default_label=label, base=base)
    return p


def run_dir(out: Path, result: TrainResult, n_models: int) -> Path:
    t = result.training
    return out if n_models == 1 else out / f"lr{t['lr']:g}_seed{t['seed']}"


def read_run(out: Path) -> tuple[InductionTaskConfig, InductionModelConfig, InductionTrainConfig]:
    """The configs of the run models.induction.train started in `out` (its run.json); a folder
    another command started, or a damaged record, is refused in one line."""
    path = out / RUN_FILE
    if not path.is_file():
        raise ValueError(f"--resume {out}: no {RUN_FILE} there (not a run started by models.induction.train).")
    try:
        saved = json.loads(path.read_text())
        if isinstance(saved, dict) and "train" in saved and "training" not in saved:
            raise ValueError(f"--resume {out}: a run of the factual-recall family, not an induction one; resume it "
                             f"with `python -m models.train --resume {out}`.")
        return (InductionTaskConfig(**saved["task"]), InductionModelConfig(**saved["model"]),
                InductionTrainConfig(**{k: tuple(v) if isinstance(v, list) else v
                                        for k, v in saved["training"].items()}))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise ValueError(f"{path}: not a valid induction run description.") from None


def finished(out: Path) -> bool:
    """Whether the run in `out` wrote its checkpoints (its training state removed after them)."""
    written = (out / "config.json").is_file() or any(out.glob("lr*_seed*/config.json"))
    return written and not complete_steps(out / STATE)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.resume:
        out = args.resume
        task_cfg, model, cfg = read_run(out)
        if finished(out):
            print(f"{out} holds the finished run's checkpoints; nothing to resume.")
            return 0
        task = task_cfg.build()
    else:
        base = preset(args.preset)
        task_cfg = override(base[0], cli.given(args, InductionTaskConfig))
        model = override(base[1], cli.given(args, InductionModelConfig))
        cfg = override(base[2], cli.given(args, InductionTrainConfig))
        task = task_cfg.build()  # bad settings are refused before --out is touched
        out = args.out or Path("ckpt") / f"induction_{args.preset}"
    trainable_keys(model.section(task), cfg.frozen)  # an unknown --frozen weight too
    cfg.validate()
    check_fits(task, model, cfg, resolve_device(cfg.device))
    if not args.resume:
        if not args.force and (out / RUN_FILE).is_file() and not finished(out):
            raise ValueError(f"--out {out} holds an interrupted run; continue it with `python -m "
                             f"models.induction.train --resume {out}`, or pass --force to start again.")
        out = prepare_out(out, args.force)
        write_json(out / RUN_FILE, {"preset": args.preset, "task": asdict(task_cfg), "model": asdict(model),
                                    "training": asdict(cfg)})
    try:
        results = train(task_cfg, model, cfg, progress=not args.quiet, state_folder=out / STATE, task=task)
        print(f"task      {results[0].task}\nmodel     {model.name}: {results[0].section.shape}")
        for result in results:
            path = run_dir(out, result, len(results))
            result.save(path)
            t = result.training
            print(f"lr {t['lr']:g} seed {t['seed']}: in-context accuracy {t['final_in_context_accuracy']:.4f}, "
                  f"bigram loss {t['final_bigram_loss']:.3f} nats after {t['steps_run']} steps "
                  f"({t['seconds']:.0f} s) -> {path}/")
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"interrupted; the training state is saved at every evaluation: "
                                f"python -m models.induction.train --resume {out}") from None
    shutil.rmtree(out / STATE, ignore_errors=True)  # every checkpoint written: resume needs it no more
    return 0

if __name__ == "__main__":
    cli.run_cli(main)
