"""python scripts/aot_unscaled_scores.py [aot_capacity arguments]

analyses.aot_capacity with attention scores NOT divided by sqrt(d_head): Dana et al.'s
Eq. (1) scores (e + pos)^T W_QK (e + pos) with no scale, TransformerLens divides by
sqrt(d_head). A one-off check of whether that scale explains why our accuracy grows slower
than linearly in d_head (docs/aot_capacity.md). Training only: the
checkpoints it writes are read back with the scale, so run it with --skip-instruments and
keep its --out apart from real results.
"""
import sys

import torch

import analyses.aot_capacity
import models.aot.trainer
import models.aot.weights
from models.cli import run_cli

_stack_models = models.aot.weights.stack_models


def unscaled_stack(weights, sections):
    stack = _stack_models(weights, sections)
    stack.score_scale = torch.ones_like(stack.score_scale)
    return stack


if __name__ == "__main__":
    if "--skip-instruments" not in sys.argv:
        print("error: pass --skip-instruments (this script's checkpoints read back with the scale).", file=sys.stderr)
        sys.exit(2)
    models.aot.trainer.stack_models = unscaled_stack
    run_cli(analyses.aot_capacity.main)
