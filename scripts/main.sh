#!/usr/bin/env bash
# Set up (if needed), train the default model and say where its facts live.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m models.train --preset tiny --out ckpt/tiny --force
.venv/bin/python -m analyses.locate_facts ckpt/tiny
