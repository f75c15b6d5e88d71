"""python -m models.aot.train association|distribution --out ckpt/aot : train one model of
the attention-only family (Dana, Pydi & Chevaleyre) on one memorisation task and write it as
a checkpoint (docs/checkpoint_format.md), which `models.load`, `analyses.visualize`-style
notebooks and the TransformerLens tools read like any other.

The task is N = --n-tokens tokens and sequences of S = --context of them; the model one
attention layer (--d-mlp > 0 adds an MLP); training Dana et al.'s recipe (per seed,
--batches batches drawn once, --epochs passes, Adam). The defaults train a model large enough
to memorise the paper's 2500 bigrams (N = 50, S = 2) in well under a minute on a CPU: d = 32,
H = 8, d_h = 32, lr 5e-3, 200 batches x 5 epochs. The paper's own models (d = d_h = 10, lr 1e-3,
1000 batches x 10 epochs) store a few hundred of them; every sweep of such models is
`python -m analyses.aot_capacity`, which starts from the paper's recipe; this trains one.
"""
from __future__ import annotations

import time
from pathlib import Path

from models import cli
from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.aot.trainer import train_aot
from models.bridge import resolve_device
from models.cli import override
from models.out_folder import FORCE_HELP, prepare_out
from tasks.association import AssociationTask, DistributionTask, SequenceTask

TASKS = {"association": AssociationTask, "distribution": DistributionTask}
# a model that memorises the 2500 bigrams of N = 50 in about 400 steps, and a recipe of 1000
MODEL = AoTModelConfig(d_model=32, n_heads=8, d_head=32)
TRAINING = AoTTrainConfig(lr=5e-3, batches=200, epochs=5, eval_every=100)


def parser() -> cli.Parser:
    p = cli.parser("python -m models.aot.train", __doc__)
    p.add_argument("task", choices=list(TASKS), help="association (one next token per sequence, cross-entropy) "
                   "or distribution (a target distribution per sequence, KL)")
    p.add_argument("--out", type=Path, default=None, help="checkpoint directory to write (default ckpt/aot_TASK)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    task = p.add_argument_group("task")
    task.add_argument("--n-tokens", type=int, default=50, help="N, tokens of the vocabulary (default 50)")
    task.add_argument("--context", type=int, default=2, help="S, tokens per sequence (default 2)")
    task.add_argument("--task-seed", type=cli.seed, default=0,
                      help="seed of the association table, or of the target distributions (default 0)")
    task.add_argument("--concentration", type=float, default=None,
                      help="distribution task: pi_t = softmax(concentration * g_t) (default 1)")
    p.add_argument("--seed", type=cli.seed, default=0, help="seed of the initial weights and the data set (default 0)")
    cli.add_config_flags(p, AoTModelConfig, "model", default_label="default", base=MODEL)
    cli.add_config_flags(p, AoTTrainConfig, "training (the paper's recipe: --lr 1e-3 --batches 1000 --epochs 10)",
                         default_label="default", base=TRAINING)
    return p


def build_task(args) -> SequenceTask:
    """The task the flags name; --concentration belongs to the distribution task only."""
    if args.task == "association":
        if args.concentration is not None:
            raise ValueError("--concentration is a setting of the distribution task, not of association.")
        return AssociationTask(args.n_tokens, args.context, args.task_seed)
    return DistributionTask(args.n_tokens, args.context, args.task_seed,
                            1.0 if args.concentration is None else args.concentration)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    task = build_task(args)
    model = override(MODEL, cli.given(args, AoTModelConfig))
    train = override(TRAINING, cli.given(args, AoTTrainConfig))
    model.validate()
    train.validate()  # bad settings are refused before --out is touched
    out = prepare_out(args.out or Path("ckpt") / f"aot_{args.task}", args.force)
    start = time.perf_counter()
    result = train_aot(task, [(model, args.seed)], train, progress=not args.quiet)[0]
    seconds = time.perf_counter() - start
    result.save(out)
    t, device = result.training, resolve_device(train.device)
    print(f"task      {task}\n"
          f"model     {model.name} ({model.parameters(task)} parameters, {model.head_layout} heads)\n"
          f"trained   {t['steps']} steps ({train.batches} batches x {train.epochs} epochs) in {seconds:.1f} s "
          f"on {device}\n"
          f"final     accuracy {result.accuracy:.4f} on all {task.n_sequences} sequences, loss {result.loss:.4f} "
          f"nats ({'cross-entropy' if args.task == 'association' else 'KL'})\n"
          f"wrote     {out}/")
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
