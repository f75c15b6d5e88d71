#!/usr/bin/env bash
# A GPU's work for the toolkit in one call of at most GPU_RUN_SECONDS (default 540: 9 minutes),
# resumable across calls on fresh machines:
#
#   bash scripts/gpu_run.sh OUT [STATE]        STATE: the OUT/state.tar.gz an earlier call left
#   bash scripts/gpu_run.sh --dry-run OUT [STATE]   the same steps at tiny sizes on the CPU
#
# Set up first (no network needed): PYTHON=python3 bash scripts/setup.sh --offline WHEELS.
# Steps, each bounded by the time left and recorded as it finishes; a later call skips the
# steps an earlier one finished and goes on with the sweeps where they stopped. The call ends
# within its budget (counted from its start) and a few seconds: a piece of Figure 4 left with
# too little time is not started, and one line of the report counts those left:
#   env        the GPU, driver and torch
#   tests      the CUDA tests (FACTUAL_RECALL_TEST_DEVICE=cuda): summary in tests_cuda.txt
#   bench      bench/train_throughput.py: graphed, eager and the TransformerLens loop at config
#              A; tiny graphed at K = 1 and K = 64; 169 models at the grid's largest cell with
#              each attention core; then bench/step_profile.py: the top 25 kernels by GPU time
#              of each of those stacks, graphed (bench.txt); the model-FLOP utilisation of
#              each line in report.txt
#   checks     bench/gpu_checks.py: main job CUDA against CPU, host syncs, determinism
#   grid       Figure 4 right: the 169-cell grid with storage shares over seeds 0, 1, 2, stacked
#              (one stack per H), the stacks in GPU_RUN_JOBS worker processes sharing the GPU
#              (--executor processes; the dry run: in one process), timed (grid.png)
#   fig4_left_*  Figure 4 left at the authors' full protocol (25 shapes, d = 8 ... 181, three
#              learning rates) in pieces that each fit one call, largest sizes first: (1, 1, 8)
#              at d = 90, 128 and 181 over seeds 0, 1, 2 (S*: the largest S most seeds store),
#              each bracketed around the S* of the line fitted to the recorded sizes, then each
#              row of shapes (one alpha) at every d (d <= 22, <= 64, the rest) with seed 0 and the
#              milestone rule (a run that cannot reach 99% gives up: docs/capacity.md), its shapes searched in
#              GPU_RUN_JOBS parallel processes (fig4_left.png, fig4_left.csv: every piece so far)
#   fig4_left_2e16_*  then (1, 1, 8) at d = 90, 128, 181 again at 2^16 steps (in the archive)
# OUT then holds at most 8 plain files: report.txt (what ran, for how long, the headline
# numbers), the files named above and state.tar.gz (every step's output and the sweeps'
# cells, packed again every GPU_RUN_PACK_SECONDS, written atomically: a kill at any moment
# leaves the last whole archive, and loses only the cells in flight).
set -uo pipefail
start=$(date +%s)  # the budget counts from here: the checks and the unpacking below are in it
cd "$(dirname "$0")/.."
root=$PWD
usage() { echo "usage: bash scripts/gpu_run.sh [--dry-run] OUT [STATE]" >&2; exit 2; }
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
[ $# -ge 1 ] && [ $# -le 2 ] && [ "${1#-}" = "$1" ] || usage
out=$1; state=${2:-}
[ -z "$state" ] || [ -f "$state" ] || { echo "gpu_run: $state: no such archive" >&2; exit 2; }
if [ -n "$state" ]; then
  tar -tzf "$state" >/dev/null 2>&1 || { echo "gpu_run: $state: not a readable state archive" >&2; exit 2; }
fi
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$python" -c "import torch, transformer_lens" 2>/dev/null \
  || { echo "gpu_run: $python cannot import torch and transformer_lens; run scripts/setup.sh first" >&2; exit 2; }
budget=${GPU_RUN_SECONDS:-$([ $dry = 1 ] && echo 300 || echo 540)}
pack_every=${GPU_RUN_PACK_SECONDS:-$([ $dry = 1 ] && echo 2 || echo 60)}
jobs=${GPU_RUN_JOBS:-8}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$state" ]; then tar -xzf "$state" -C "$work"; fi
mkdir -p "$work/done"
export PYTHONUNBUFFERED=1

left() { echo $(( budget - ($(date +%s) - start) )); }
# the seconds a command may run now, keeping `reserve` (and ${1:-0} more) for what follows it
room() { echo $(( $(left) - reserve - ${1:-0} )); }
log() { echo "$*" | tee -a "$work/report.txt"; }
put() {  # copy a file of the run into OUT atomically
  [ -f "$work/$1" ] || return 0
  cp "$work/$1" "$out/.$2.tmp" && mv "$out/.$2.tmp" "$out/$2"
}
pack() {  # the run's state, atomically: a whole archive or the previous one
  tar -czf "$out/.state.tar.gz.tmp" --exclude='*.tmp' -C "$work" . 2>/dev/null \
    && mv "$out/.state.tar.gz.tmp" "$out/state.tar.gz"
  put report.txt report.txt
}
earlier() {  # earlier NAME: true, and said, when an earlier call finished step NAME
  [ -f "$work/done/$1" ] && log "$1: done in an earlier call ($(cat "$work/done/$1"))"
}
# step NAME CAP COMMAND...: run COMMAND (output to NAME.txt) for at most CAP seconds and the
# time left (keeping `reserve` seconds to pack, and `after` seconds more when set); record its
# exit status and seconds.
reserve=$([ $dry = 1 ] && echo 5 || echo 20)
step() {
  local name=$1 cap=$2; shift 2
  if earlier "$name"; then return 0; fi
  local limit; limit=$(room "${after:-0}"); [ "$limit" -lt "$cap" ] || limit=$cap
  if [ "$limit" -le 0 ]; then log "$name: no time left"; return 1; fi
  local t0=$(date +%s) rc=0
  timeout -k 10 "$limit" "$@" >>"$work/$name.txt" 2>&1 || rc=$?
  local seconds=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ] || [ "${finish_anyway:-0}" = 1 ]; then echo "exit $rc, ${seconds} s" > "$work/done/$name"; fi
  log "$name: exit $rc in ${seconds} s (limit ${limit} s)$([ $rc = 124 ] && echo ', cut by the time limit')"
  pack
  return $rc
}
within() {  # within COMMAND...: run COMMAND for at most the time left before the reserve
  local limit; limit=$(room)
  [ "$limit" -gt 0 ] && timeout -k 2 "$limit" "$@"
}

log "gpu_run $(date -u +%FT%TZ): budget ${budget} s, $([ $dry = 1 ] && echo 'dry run (CPU, tiny sizes)' || echo GPU)\
$([ -n "$state" ] && echo ", resuming $state")"
pack

# --------------------------------------------------------------------------- the sizes
if [ $dry = 1 ]; then
  export FACTUAL_RECALL_TEST_DEVICE=cpu
  device=(--device cpu)
  tests=(tests/test_graphed.py -k "refuses or auto_captures")
  bench_a=(--device cpu --preset tiny --trained-steps 0 --repeats 1 --round-seconds 0.1 --no-memory)
  bench_k=()
  bench_stack=()
  profile=(--device cpu --small --steps 2 --rows 10)
  grid=(--heads 1,2 --widths 4,8 --steps 40 --eval-every 20 --contexts 2 --patch-contexts 1 --seeds 0,1)
  fig4=(--answers 2 --seq-len 4 --lr 0.03 --steps 60 --eval-every 20 --eval-size 64 --batch-size 64)
  lead=1,1,2; lead_flags=(--seeds 0,1 --probes 2 --fill-rounds)
  brackets=("d11 --d 11 --min-size 2 --max-size 5")
  rows=("1,1,2,8" "2,2,2"); row_flags=(--min-size 2 --max-size 5 --give-up milestones); parts=("=8" "_large=8,11")
  ladder=(--steps 120)
else
  export FACTUAL_RECALL_TEST_DEVICE=cuda
  device=(--device cuda)
  tests=(-n 8 tests/test_graphed.py tests/test_parity.py tests/test_trainer.py tests/test_shape_stack.py
         tests/test_grid_stack.py tests/test_stack_buckets.py tests/test_counter.py tests/test_fused_attention.py
         tests/test_authors_model.py tests/test_locate_facts.py tests/test_reliability.py)
  # each beside the fused attention core, graphed: where does it beat the vocabulary core?
  bench_a=(--device cuda --graphed --trained-steps 0 --repeats 3 --compare-core fused)
  bench_k=(--device cuda --graphed --trained-steps 0 --repeats 3 --preset tiny --no-memory --compare-core fused)
  # the grid's largest cell, 169 models: memory-bound with the vocabulary core; the fused one beside it
  bench_stack=(--device cuda --trained-steps 0 --no-memory --repeats 2 --preset paper-tradeoff --n-heads 32
               --d-mlp 128 --k 169 --attention-core vocab --compare-core fused --graphed)
  profile=(--device cuda --steps 5 --rows 25)
  # one stack per H (its 13 widths x 3 seeds), GPU_RUN_JOBS stacks at a time, each in its own process
  grid=(--heads 1,2,4,6,8,10,12,14,16,20,24,28,32 --widths 1,8,16,24,32,40,48,56,64,80,96,112,128 --seeds 0,1,2
        --executor processes --jobs "$jobs")
  fig4=(--answers 8 --seq-len 32 --eval-size 1024)
  # (1, 1, 8) at its largest sizes, bracketed around the fitted line's S* (59, 81, 107 at d = 90,
  # 128, 181: analyses.capacity.plan.Oracle.stand_in; the H100 record gave 74 at d = 128)
  lead=1,1,8; lead_flags=(--seeds 0,1,2 --probes 5 --fill-rounds)
  brackets=("d90 --d 90 --min-size 44 --max-size 77" "d128 --d 128 --min-size 60 --max-size 105"
            "d181 --d 181 --min-size 80 --max-size 140")
  rows=()  # one row of shapes per alpha, (1, 1, 8) only up to d = 64 there; in three parts of 3 to 5 minutes (the plan)
  for a in 4 2 1 0.5 0.25; do
    row=""; for b in 4 2 1 0.5 0.25; do row+=" $a,$b,8$([ "$a,$b" = 1,1 ] && echo ,64)"; done; rows+=("${row# }")
  done
  row_flags=(--seed 0 --give-up milestones)
  parts=("=8,11,16,22" "_mid=8,11,16,22,32,45,64" "_large=8,11,16,22,32,45,64,90,128,181")
  ladder=(--steps 65536)
fi

# --------------------------------------------------------------------------- the steps
finish_anyway=1 step env 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  2>/dev/null || echo 'no GPU (nvidia-smi absent)'; $python -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda)'"

finish_anyway=1 step tests 180 "$python" -m pytest -p no:cacheprovider "${tests[@]}"
tail -n 30 "$work/tests.txt" > "$work/tests_cuda.txt" 2>/dev/null; put tests_cuda.txt tests_cuda.txt

bench_earlier=$([ -f "$work/done/bench" ] && echo 1 || echo 0)
finish_anyway=1 step bench 330 bash -c "$python bench/train_throughput.py ${bench_a[*]} && \
  if [ -n '${bench_k[*]}' ]; then for k in 1 64; do $python bench/train_throughput.py ${bench_k[*]} --k \$k; done; fi && \
  if [ -n '${bench_stack[*]}' ]; then $python bench/train_throughput.py ${bench_stack[*]}; fi; rc=\$?; \
  $python bench/step_profile.py ${profile[*]} || rc=1; exit \$rc"
put bench.txt bench.txt
[ "$bench_earlier" = 1 ] || grep -h '^model_flop_utilisation' "$work/bench.txt" 2>/dev/null | sed 's/^/  /' \
  | tee -a "$work/report.txt"

if [ $dry = 0 ]; then
  finish_anyway=1 step checks 120 "$python" bench/gpu_checks.py --out "$work/checks"
  put checks/gpu_checks.json gpu_checks.json
fi

t0=$(date +%s)
step grid 600 "$python" -m analyses.tradeoff grid "${grid[@]}" "${device[@]}" --sampler counter --quiet \
  --out "$work/grid" && log "grid: $(( $(date +%s) - t0 )) s for every cell not recorded before this call"
put grid/grid.png grid.png

# one search per shape, GPU_RUN_JOBS at a time, their cells shared in one directory; the
# flags reach them through a file (an array does not cross bash -c)
fig4_search() { mapfile -t flags < "$1"; "$python" -m analyses.capacity transformer --shape "$2" "${flags[@]}"; }
export -f fig4_search
export python
packer() {  # pack every pack_every seconds until sent TERM, which waits for an archive in progress
  local nap=""
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do sleep "$pack_every" & nap=$!; wait "$nap"; pack; done
}
# piece NAME DIR "SHAPES" FLAGS...: every shape searched with FLAGS into fig4_left/DIR/ (a step
# fig4_left_NAME: done once it finished, resumed from its cells by the next call when cut), then
# its tables in the `after_piece` seconds kept for them. False, with nothing started, when an
# earlier call finished it or too little time is left (then it is left for the next call).
after_piece=$([ $dry = 1 ] && echo 10 || echo 30)
piece() {
  local name=$1 dir="$work/fig4_left/$2" shapes=$3; shift 3
  earlier "fig4_left_$name" && return 1
  [ "$(room "$after_piece")" -gt 0 ] || return 1
  local shape_flags=() s
  local flags=("${fig4[@]}" "$@" --sampler counter "${device[@]}" --quiet --out "$dir")
  mkdir -p "$work/fig4_left"
  printf '%s\n' "${flags[@]}" > "$dir.flags"
  for s in $shapes; do shape_flags+=(--shape "$s"); done
  packer & local packer=$!
  after=$after_piece step "fig4_left_$name" 100000 \
    bash -c "printf '%s\n' $shapes | xargs -P $jobs -I{} bash -c 'fig4_search $dir.flags {}'"
  kill "$packer" 2>/dev/null; wait "$packer" 2>/dev/null
  within "$python" -m analyses.capacity transformer "${shape_flags[@]}" "${flags[@]}" --recorded-only \
    >"$dir.tables.txt" 2>&1 \
    && log "fig4_left_$name: $(ls "$dir/cells" 2>/dev/null | wc -l) probes recorded;\
$(grep '^  shape' "$dir.tables.txt" | tr -s ' ' | tr '\n' ';')"
  return 0
}
put_fig4_left() { put fig4_left.csv fig4_left.csv; put fig4_left.png fig4_left.png; }
# fig4_left.csv and fig4_left.png: every piece's sizes so far, one table and one figure
combine() {
  within "$python" - "$work/fig4_left" "$work/fig4_left.csv" "$work/fig4_left.png" <<'PY' >>"$work/fig4_left.txt" 2>&1
import sys
from pathlib import Path
import pandas as pd
from analyses.capacity import TransformerSweep, fitted_slope
from analyses.capacity.figures import facts_figure
folder, table_path, figure_path = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
tables = [pd.read_csv(p).assign(piece=p.parent.name) for p in sorted(folder.glob("*/capacity.csv"))
          if not p.parent.name.startswith("2e16_")]  # the ladder's longer budget: its own table
tables = [t for t in tables if len(t)]
if tables:
    table = pd.concat(tables, ignore_index=True)
    table.to_csv(table_path, index=False)
    stored = table[table["facts"] > 0]
    if len(stored):
        slope = fitted_slope(stored["parameters"], stored["facts"]) if stored["parameters"].nunique() > 1 else None
        facts_figure(stored, slope, TransformerSweep(), figure_path)
PY
  put_fig4_left
}
# Figure 4 left, largest sizes first; then those sizes again at 2^16 steps: are the facts stored
# there set by the parameters or by the step budget?
# (a row's parts share its directory: each goes on from the S* its previous part found)
for b in "${brackets[@]}"; do
  read -r name flags <<< "$b"; piece "$name" "$name" "$lead" "${lead_flags[@]}" $flags && combine
done
for r in "${rows[@]}"; do
  for part in "${parts[@]}"; do
    piece "alpha${r%%,*}${part%%=*}" "alpha${r%%,*}" "$r" "${row_flags[@]}" --d "${part#*=}" && combine
  done
done
pieces=$(( ${#brackets[@]} + ${#parts[@]} * ${#rows[@]} ))  # then as many again at 2^16 steps
if [ "$(ls "$work/done" | grep '^fig4_left_' | grep -vc '^fig4_left_2e16_')" = "$pieces" ]
then
  for b in "${brackets[@]}"; do
    read -r name flags <<< "$b"; piece "2e16_$name" "2e16_$name" "$lead" "${lead_flags[@]}" $flags "${ladder[@]}"
  done
fi
left_over=$(( pieces + ${#brackets[@]} - $(ls "$work/done" | grep -c '^fig4_left_') ))
[ "$left_over" = 0 ] || log "fig4_left: $left_over of $(( pieces + ${#brackets[@]} )) pieces left for the next call"
put_fig4_left
log "gpu_run: $(( $(date +%s) - start )) s in all; $(ls "$work/done" | tr '\n' ' ')done"
pack
