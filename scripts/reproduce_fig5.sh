#!/usr/bin/env bash
# Figure 5 of the paper: train the three presets with their full settings, then follow every
# snapshot with analyses.hallucination; results (CSV, summary.json, figures) in results/hallucination/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
for preset in fig5-linear fig5-softmax-gd fig5-softmax-adam; do
  .venv/bin/python -m models.train --preset "$preset" --out "ckpt/$preset" --force --quiet
  .venv/bin/python -m analyses.hallucination "ckpt/$preset" --out "results/hallucination/$preset" --quiet
done
