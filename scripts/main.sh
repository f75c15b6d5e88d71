#!/usr/bin/env bash
# Set up (if needed), train the default model and say where its facts live.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Run again, it keeps ckpt/tiny when it was trained with these settings (and its analysis/);
# otherwise it replaces the model's files only, moving the old analysis/ aside.
.venv/bin/python -m models.train --preset tiny --out ckpt/tiny --reuse --force
.venv/bin/python -m analyses.locate_facts ckpt/tiny
