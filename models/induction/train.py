"""python -m models.induction.train --preset cpu --out ckpt/induction : train models of the induction
family (Bietti et al. 2023) on the trigger task and write each as a checkpoint
(docs/checkpoint_format.md) that `models.load` opens as a TransformerLens model.

The task is a character-level text's bigrams with K triggers whose outputs change per sequence;
the model the authors' simplified two-layer model (--architecture simplified) or a generic one- or
two-layer transformer (--architecture generic --n-layers 1); training SGD with momentum and weight
decay (or --optimizer adam) on fresh batches. One model per --lr and --seed: one model is written
to --out, several to --out/lr<LR>_seed<SEED>/. The training state is kept under --out/train_state
at every evaluation; --resume continues an interrupted run there, bit-identically.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from models import cli
from models.cli import override
from models.induction.config import (
    PRESETS,
    InductionModelConfig,
    InductionTaskConfig,
    InductionTrainConfig,
    preset,
)
from models.induction.trainer import train
from models.induction.weights import trainable_keys
from models.out_folder import FORCE_HELP, prepare_out
from models.training.result import TrainResult

RUN_FILE = "run.json"  # what a resumable run was asked to do


def parser() -> cli.Parser:
    p = cli.parser("python -m models.induction.train", __doc__)
    p.add_argument("--preset", default="cpu", help=f"{' | '.join(PRESETS)} (default cpu: under two minutes on a "
                   "2-core CPU; paper: the authors' d = 256, T = 256, batch 512)")
    p.add_argument("--out", type=Path, default=None,
                   help="checkpoint directory to write (default ckpt/induction_PRESET)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--resume", type=Path, default=None, metavar="OUT",
                   help="continue the interrupted run at OUT (its settings are read from OUT/run.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    cli.add_config_flags(p, InductionTaskConfig, "task")
    cli.add_config_flags(p, InductionModelConfig, "model")
    cli.add_config_flags(p, InductionTrainConfig, "training")
    return p


def run_dir(out: Path, result: TrainResult, n_models: int) -> Path:
    t = result.training
    return out if n_models == 1 else out / f"lr{t['lr']:g}_seed{t['seed']}"


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.resume:
        out = args.resume
        if not (out / RUN_FILE).is_file():
            raise ValueError(f"--resume {out}: no {RUN_FILE} there (not a run started by models.induction.train).")
        saved = json.loads((out / RUN_FILE).read_text())
        task_cfg, model, cfg = (InductionTaskConfig(**saved["task"]), InductionModelConfig(**saved["model"]),
                                InductionTrainConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                        for k, v in saved["training"].items()}))
    else:
        base = preset(args.preset)
        task_cfg = override(base[0], cli.given(args, InductionTaskConfig))
        model = override(base[1], cli.given(args, InductionModelConfig))
        cfg = override(base[2], cli.given(args, InductionTrainConfig))
        task = task_cfg.build()  # bad settings are refused before --out is touched
        trainable_keys(model.section(task), cfg.frozen)  # an unknown --frozen weight too
        cfg.validate()
        out = prepare_out(args.out or Path("ckpt") / f"induction_{args.preset}", args.force)
        (out / RUN_FILE).write_text(json.dumps({"preset": args.preset, "task": asdict(task_cfg),
                                                "model": asdict(model), "training": asdict(cfg)}, indent=1))
    try:
        results = train(task_cfg, model, cfg, progress=not args.quiet, state_folder=out / "train_state")
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"interrupted; the training state is saved at every evaluation: "
                                f"python -m models.induction.train --resume {out}") from None
    print(f"task      {results[0].task}\nmodel     {model.name}: {results[0].section.shape}")
    for result in results:
        path = run_dir(out, result, len(results))
        result.save(path)
        t = result.training
        print(f"lr {t['lr']:g} seed {t['seed']}: in-context accuracy {t['final_in_context_accuracy']:.4f}, "
              f"bigram loss {t['final_bigram_loss']:.3f} nats after {t['steps_run']} steps ({t['seconds']:.0f} s) "
              f"-> {path}/")
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
