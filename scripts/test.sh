#!/usr/bin/env bash
# Set up (if needed), lint (ruff, configured in pyproject.toml) and run the test suite on
# the CPU, one pytest worker per core (pytest-xdist), each with one torch thread: every test,
# or with --fast the fast tier (-m "not slow": no test that trains for minutes, kills
# processes, runs a notebook or a GPU dry run; docs/testing.md). Other arguments go to pytest
# (`-n 0` runs in this process, one test after another).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then args+=(-m "not slow"); else args+=("$arg"); fi
done
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
# two torch threads per worker on a core each would wait on each other (OpenMP spins)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -n auto --dist worksteal ${args[@]+"${args[@]}"}
