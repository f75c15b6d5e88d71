#!/usr/bin/env bash
# Set up (if needed), lint (ruff, configured in pyproject.toml) and run the test suite on
# the CPU: every test, or with --fast the fast tier (-m "not slow": no test that trains for
# minutes, kills processes, runs a notebook or a GPU dry run; docs/testing.md). Other
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then args+=(-m "not slow"); else args+=("$arg"); fi
done
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
