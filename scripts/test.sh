#!/usr/bin/env bash
# Set up (if needed), lint (ruff, configured in pyproject.toml) and run the test suite on
# the CPU, one pytest worker per core (pytest-xdist), each with one torch thread: every test,
# or with --fast the fast tier (-m "not slow": no test that trains for minutes, kills
# processes, runs a notebook or a GPU dry run; docs/testing.md). With --portable, the fast
# tier twice, as on two other CPUs: ATen's and MKL's kernels forced down to AVX2, then to no
# vector extension beyond SSE4.2 (the suite's promises hold on every CPU; docs/testing.md).
# Other arguments go to pytest (`-n 0` runs in this process, one test after another).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
portable=0
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then args+=(-m "not slow")
  elif [ "$arg" = "--portable" ]; then portable=1
  else args+=("$arg"); fi
done
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
# two torch threads per worker on a core each would wait on each other (OpenMP spins)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
pytest=(.venv/bin/python -m pytest -n auto --dist worksteal)
if [ "$portable" = 0 ]; then
  exec "${pytest[@]}" ${args[@]+"${args[@]}"}
fi
failed=0
for personality in "avx2 AVX2" "default SSE4_2"; do
  read -r aten mkl <<<"$personality"
  echo "fast tier as on a CPU with ATEN_CPU_CAPABILITY=$aten MKL_ENABLE_INSTRUCTIONS=$mkl"
  ATEN_CPU_CAPABILITY=$aten MKL_ENABLE_INSTRUCTIONS=$mkl "${pytest[@]}" -m "not slow" ${args[@]+"${args[@]}"} \
    || failed=1
done
exit "$failed"
