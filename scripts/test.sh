#!/usr/bin/env bash
# Set up (if needed), lint (ruff, configured in pyproject.toml) and run the test suite on
# the CPU. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
exec .venv/bin/python -m pytest "$@"
