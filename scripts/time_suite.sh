#!/usr/bin/env bash
# Time the test suite's two tiers, as the README's test line states them: the fast tier
# (`bash scripts/test.sh --fast`), then every test (`bash scripts/test.sh`). Prints, per tier,
# pytest's summary, the wall-clock time and the CPU seconds of pytest and its subprocesses, then
# the tests that cost the most CPU (scripts/test_times.py). Wall-clock times are the machine's
# only when nothing else runs on its cores: take them on a quiet machine. Extra arguments go to
# pytest (e.g. -x). Exits non-zero when a tier fails.
#
#   bash scripts/time_suite.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?  # installed before the clock starts
logs=$(mktemp -d)
TIMEFORMAT="%R %U %S"  # bash's `time`: wall, user and system seconds, waited-for children included
failed=0
for tier in fast full; do
  flags=()
  [ "$tier" = fast ] && flags=(--fast)
  { time FACTUAL_RECALL_TEST_TIMES="$logs/$tier.tsv" bash scripts/test.sh "${flags[@]}" -p no:cacheprovider "$@" \
      >"$logs/$tier.log" 2>&1; } 2>"$logs/$tier.time" || failed=1
  read -r wall user sys <"$logs/$tier.time"
  summary=$(grep -E "[0-9]+ (passed|failed)" "$logs/$tier.log" | tail -1 | tr -d '=')
  printf '%s: %s\n' "$([ "$tier" = fast ] && echo 'fast tier (scripts/test.sh --fast)' || echo 'full suite (scripts/test.sh)')" \
    "${summary:-no summary: see $logs/$tier.log}"
  awk -v w="$wall" -v u="$user" -v s="$sys" \
    'BEGIN { printf "  %d min %02d s wall, %.0f s CPU (pytest and its subprocesses)\n", w / 60, w % 60, u + s }'
done
for tier in fast full; do
  echo "the costliest tests of the $tier run:"
  .venv/bin/python scripts/test_times.py "$logs/$tier.tsv" --top 10 | tail -n 10
done
echo "logs: $logs/"
exit $failed
