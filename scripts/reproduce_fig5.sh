#!/usr/bin/env bash
# Figure 5 of the paper: train the three presets with their full settings, then follow every
# snapshot with analyses.hallucination; results (CSV, summary.json, figures) in results/hallucination/.
# Run again, a checkpoint trained with the same settings is kept (--reuse), not trained again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
for preset in fig5-linear fig5-softmax-gd fig5-softmax-adam; do
  .venv/bin/python -m models.train --preset "$preset" --out "ckpt/$preset" --reuse --force --quiet
  .venv/bin/python -m analyses.hallucination "ckpt/$preset" --out "results/hallucination/$preset" --quiet
done
# Figure 5 right at the authors' lr 0.1 needs more than 2^13 steps: the phase comes at steps ~11,600-30,000.
.venv/bin/python -m models.train --preset fig5-softmax-gd --steps 65536 --out ckpt/fig5-softmax-gd-2e16 --reuse --force --quiet
.venv/bin/python -m analyses.hallucination ckpt/fig5-softmax-gd-2e16 --out results/hallucination/fig5-softmax-gd-2e16 --quiet
