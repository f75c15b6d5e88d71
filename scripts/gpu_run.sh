#!/usr/bin/env bash
# A GPU's work for the toolkit in one call of at most GPU_RUN_SECONDS (default 540: 9 minutes).
# What it computes lands in the repository's results folders, and the next call, on any machine,
# goes on from them once they are unpacked in its checkout (and committed):
#
#   bash scripts/gpu_run.sh OUT [STATE]        STATE: the OUT/state.tar.gz an earlier call left
#   bash scripts/gpu_run.sh --dry-run OUT [STATE]   the same steps at tiny sizes on the CPU
#   tar -xzf OUT/results.tar.gz                (in the checkout's root) the results, to commit
#
# Set up first (no network needed): PYTHON=python3 bash scripts/setup.sh --offline WHEELS.
# GPU_RUN_COMMIT names the checkout's commit where git is not there (a copied tree).
# The results (results/; a dry run: results/dry_run/, ignored by git):
#   tradeoff/paper_grid_gpu/            Figure 4 right: the 169-cell grid over seeds 0, 1, 2
#   capacity/paper_fig4_left_full/      Figure 4 left at the full protocol, one folder per piece
#                                       (analyses/capacity/protocol.py), fig4_left.csv and .png
#   induction/paper_gpu/                the induction head at the paper's size (d = T = 256, batch 512,
#                                       K = 5): `python -m analyses.induction reproduce --preset paper`
#   gpu/passed.json                     what passed on a GPU at which code (tests, checks)
#   gpu/measured.json                   each bench line's steps/s by attention core, at which code
#   gpu/done/                           the sweep pieces finished
# Steps, in this order, each bounded by the time left; the call ends within its budget and a
# few seconds (a piece with too little time left is not started; one line counts those left):
#   env        the GPU, driver and torch
#   tests      the CUDA tests (FACTUAL_RECALL_TEST_DEVICE=cuda): in full where the code a GPU runs
#              changed since they last passed in full (passed.json), else a one-minute subset
#              (capture, parity, determinism, resumed stacks); in tests_cuda.txt every failure by
#              name (also of a run cut by its limit) and the summary
#   checks     bench/gpu_checks.py (main job CUDA against CPU, host syncs, determinism), where
#              the code changed since it last passed
#   induction  every in-context study at the paper's size, once (a cut call keeps the studies it finished)
#   bench_*    the bench lines whose code changed since measured.json recorded them, the stack
#              rate first: 169 models at the grid's largest cell with both attention cores, then
#              config A and tiny K = 64 (graphed, beside the fused core) and tiny K = 1, each with
#              bench/step_profile.py's table (bench.txt); each line recorded in measured.json
#   grid       Figure 4 right, the stacks in GPU_RUN_JOBS worker processes sharing the GPU, each
#              stack resumable; started where 240 s are left, else after the pieces
#   fig4_left_*  the pieces of Figure 4 left, largest sizes first, GPU_RUN_JOBS searches at once
# OUT then holds at most 6 plain files: report.txt, tests_cuda.txt, bench.txt, gpu_checks.json,
# results.tar.gz (the results above, packed again every GPU_RUN_PACK_SECONDS and after every
# step, atomically) and state.tar.gz (what is not a result: the report, the logs and profiles,
# and the states of the stacks in flight, which a call given it resumes mid-training: the
# smallest first, as many as keep it within GPU_RUN_ARCHIVE_BYTES, default 15 MiB).
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
# installed, asked without importing them (seconds of CPU each call; the env step imports torch)
"$python" -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ('torch', 'transformer_lens'))))" \
  2>/dev/null || { echo "gpu_run: $python cannot import torch and transformer_lens; run scripts/setup.sh first" >&2; exit 2; }
budget=${GPU_RUN_SECONDS:-$([ $dry = 1 ] && echo 300 || echo 540)}
pack_every=${GPU_RUN_PACK_SECONDS:-$([ $dry = 1 ] && echo 2 || echo 60)}
archive_bytes=${GPU_RUN_ARCHIVE_BYTES:-15728640}
jobs=${GPU_RUN_JOBS:-8}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
res=results$([ $dry = 1 ] && echo /dry_run)  # a dry run's results: ignored by git
grid_dir=$res/tradeoff/paper_grid_gpu
fig4_dir=$res/capacity/paper_fig4_left_full
induction_dir=$res/induction/paper_gpu
done_dir=$res/gpu/done
passed=$res/gpu/passed.json
measured=$res/gpu/measured.json
records() { "$python" -m analyses.sweeps.gpu_records "$@"; }
# the links through which the sweeps keep their in-flight stacks' states in the archive (inflight)
trap 'find "$res" -name state -type l -lname "$work/*" -delete 2>/dev/null; rm -rf "$work"' EXIT
if [ -n "$state" ]; then tar -xzf "$state" -C "$work"; fi
mkdir -p "$done_dir" "$work/inflight"
export PYTHONUNBUFFERED=1

left() { echo $(( budget - ($(date +%s) - start) )); }
# the seconds a command may run now, keeping `reserve` (and ${1:-0} more) for what follows it
room() { echo $(( $(left) - reserve - ${1:-0} )); }
log() { echo "$*" | tee -a "$work/report.txt"; }
put() {  # copy a file of the run into OUT atomically
  [ -f "$work/$1" ] || return 0
  cp "$work/$1" "$out/.$2.$BASHPID.tmp" && mv "$out/.$2.$BASHPID.tmp" "$out/$2"
}
pack() {  # the results and the archive, each atomically: a whole file or the previous one
  local kept=() p tmp=".$BASHPID.tmp"  # the packer's and this process's packs never share a file
  for p in "$grid_dir" "$fig4_dir" "$induction_dir" "$done_dir" "$passed" "$measured"; do [ -e "$p" ] && kept+=("$p"); done
  # not results: the stacks' states, an unfinished study's training state, circuitsvis pages and
  # weight snapshots (tens of MB; their curves are in the CSVs)
  tar -czf "$out/results.tar.gz$tmp" --exclude='*.tmp' --exclude='*/state' --exclude='*/train_state' \
    --exclude='*.html' --exclude='*/snapshots' -C "$root" "${kept[@]}" 2>/dev/null \
    && mv "$out/results.tar.gz$tmp" "$out/results.tar.gz"
  # the in-flight stacks' states, smallest first, as many as keep the archive within archive_bytes
  # (their floats barely compress): those left out start over in the next call
  local size total=$(( $(du -sb --exclude=inflight "$work" | cut -f1) )) left_out=() kept_states=0
  while read -r size p; do
    if [ $(( total + size )) -le "$archive_bytes" ]; then total=$(( total + size )); kept_states=$(( kept_states + 1 ))
    else left_out+=("--exclude=./${p#"$work"/}"); fi
  done < <(du -sb "$work"/inflight/*/* 2>/dev/null | sort -n)
  if [ ${#left_out[@]} != "$(cat "$work/inflight.left_out" 2>/dev/null || echo 0)" ]; then
    echo ${#left_out[@]} > "$work/inflight.left_out"
    [ ${#left_out[@]} = 0 ] || log "state.tar.gz: ${#left_out[@]} in-flight stacks' states left out, $kept_states kept \
(the archive's limit: $archive_bytes bytes)"
  fi
  tar -czf "$out/state.tar.gz$tmp" --exclude='*.tmp' "${left_out[@]}" -C "$work" . 2>/dev/null \
    && mv "$out/state.tar.gz$tmp" "$out/state.tar.gz"
  put report.txt report.txt
}
inflight() {  # inflight DIR: DIR/state, where a sweep's stacks keep their states, is in the archive
  local keep="$work/inflight/${1//\//_}"
  mkdir -p "$1" "$keep"
  [ -L "$1/state" ] && rm "$1/state"
  [ -e "$1/state" ] || ln -s "$keep" "$1/state"
}
earlier() {  # earlier NAME: true, and said, when an earlier call finished the sweep step NAME
  [ -f "$done_dir/$1" ] && log "$1: done in an earlier call ($(cat "$done_dir/$1"))"
}
finished() { echo "finished $(date -u +%FT%TZ)" > "$done_dir/$1"; }  # finished NAME: a sweep step, in done/
# step NAME CAP COMMAND...: run COMMAND (output to NAME.txt, or to INTO.txt where `into` is set)
# for at most CAP seconds and the time left (keeping `reserve` seconds to pack, and `after`
# seconds more when set); a sweep's step (`science=1`) is recorded in done/ when it finished.
reserve=$([ $dry = 1 ] && echo 5 || echo 20)
step() {
  local name=$1 cap=$2; shift 2
  if earlier "$name"; then return 0; fi
  local limit; limit=$(room "${after:-0}"); [ "$limit" -lt "$cap" ] || limit=$cap
  if [ "$limit" -le 0 ]; then log "$name: no time left"; return 1; fi
  local t0=$(date +%s) rc=0
  timeout -k 10 "$limit" "$@" >>"$work/${into:-$name}.txt" 2>&1 || rc=$?
  local seconds=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ] && [ "${science:-0}" = 1 ]; then finished "$name"; fi
  log "$name: exit $rc in ${seconds} s (limit ${limit} s)$([ $rc = 124 ] && echo ', cut by the time limit')"
  pack
  return $rc
}
within() {  # within COMMAND...: run COMMAND for at most the time left before the reserve
  local limit; limit=$(room)
  [ "$limit" -gt 0 ] && timeout -k 2 "$limit" "$@"
}

log "gpu_run $(date -u +%FT%TZ): budget ${budget} s, $([ $dry = 1 ] && echo 'dry run (CPU, tiny sizes)' || echo GPU)\
$([ -n "$state" ] && echo ", resuming $state"), results in $res/"
pack

# --------------------------------------------------------------------------- the sizes
declare -A bench profile
if [ $dry = 1 ]; then
  export FACTUAL_RECALL_TEST_DEVICE=cpu
  device=(--device cpu)
  # of the fast tier (no test that runs a command as a process: seconds of imports each call)
  tests_full=(tests/test_graphed.py -m "not slow" -k "refuses or auto_captures or warms_up")
  tests_subset=(tests/test_graphed.py -m "not slow" -k "refuses or auto_captures")
  bench_lines=(stack-169 tiny-k1)  # the GPU's lines at tiny sizes, one of them not profiled
  bench[stack-169]="--device cpu --preset tiny --trained-steps 0 --repeats 1 --round-seconds 0.1 --no-memory --k 2"
  bench[tiny-k1]="--device cpu --preset tiny --trained-steps 0 --repeats 1 --round-seconds 0.1 --no-memory --k 1"
  profile[stack-169]=stack-vocab,stack-fused
  profile_flags="--device cpu --small --steps 2 --rows 10"
  grid=(--heads 1,2 --widths 4 --steps 40 --eval-every 20 --contexts 2 --patch-contexts 1 --seeds 0)
  induction=(--preset cpu --steps 4 --n-triggers 2 --seq-len 16 --d-model 16 --batch-size 8 --probe-every 2)
else
  export FACTUAL_RECALL_TEST_DEVICE=cuda
  device=(--device cuda)
  tests_full=(-n 8 tests/test_graphed.py tests/test_parity.py tests/test_trainer.py tests/test_shape_stack.py
              tests/test_stack_resume.py tests/test_grid_stack.py tests/test_stack_buckets.py tests/test_counter.py
              tests/test_fused_attention.py tests/test_adam_kernel.py tests/test_authors_model.py
              tests/test_locate_facts.py tests/test_reliability.py)
  # a minute: captured = eager, the forward against TransformerLens, same-seed runs, stacks resumed
  tests_subset=(-n 8 tests/test_graphed.py tests/test_parity.py tests/test_adam_kernel.py tests/test_stack_resume.py)
  # the stack rate first (the grid's largest cell, 169 models: the vocabulary and the fused core)
  bench_lines=(stack-169 config-a tiny-k64 tiny-k1)
  bench[stack-169]="--device cuda --trained-steps 0 --no-memory --repeats 2 --preset paper-tradeoff --n-heads 32 \
--d-mlp 128 --k 169 --attention-core vocab --compare-core fused --graphed"
  profile[stack-169]=stack-vocab,stack-fused
  bench[config-a]="--device cuda --graphed --trained-steps 0 --repeats 3 --attention-core vocab --compare-core fused"
  profile[config-a]=config-a
  bench[tiny-k64]="--device cuda --graphed --trained-steps 0 --repeats 3 --preset tiny --no-memory --k 64 \
--attention-core vocab --compare-core fused"
  profile[tiny-k64]=tiny-k64
  bench[tiny-k1]="--device cuda --graphed --trained-steps 0 --repeats 3 --preset tiny --no-memory --k 1 \
--attention-core vocab --compare-core fused"
  profile_flags="--device cuda --steps 5 --rows 25"
  # one stack per H (its 13 widths x 3 seeds), GPU_RUN_JOBS stacks at a time, each in its own process
  grid=(--heads 1,2,4,6,8,10,12,14,16,20,24,28,32 --widths 1,8,16,24,32,40,48,56,64,80,96,112,128 --seeds 0,1,2
        --executor processes --jobs "$jobs")
  # the authors' size and protocol (their freeze_until for "alone"), probed every 20 steps
  induction=(--preset paper --alone init --probe-every 20)
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); gpu=${gpu:-cpu}

# --------------------------------------------------------------------------- the steps
# torch's version read from its version file, not imported (seconds of CPU; the tests step imports it)
step env 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  2>/dev/null || echo 'no GPU (nvidia-smi absent)'; $python -c 'import importlib.util as u, runpy; \
v = runpy.run_path(u.find_spec(\"torch\").submodule_search_locations[0] + \"/version.py\"); \
print(\"torch\", v[\"__version__\"], \"cuda\", v[\"cuda\"])'"

# the CUDA tests: in full where the code a GPU runs changed since they last passed in full
code=$(records hash tests)
if [ "$(records get "$passed" tests code)" = "$code" ]; then kind=tests_subset; else kind=tests; fi
log "tests: $([ $kind = tests ] && echo "in full: the code a GPU runs changed since its last full pass" \
  || echo "the subset: the code a GPU runs passed in full at $(records get "$passed" tests commit)")"
if [ $kind = tests ]; then tests=("${tests_full[@]}"); else tests=("${tests_subset[@]}"); fi
# each test's outcome on its own line as it ends (-vv: the configuration says -q), so a run cut by its limit still names its failures
step tests 240 "$python" -m pytest -p no:cacheprovider -vv "${tests[@]}" \
  && records set "$passed" "$kind" code="$code" device="$gpu" summary="$(grep -E '(passed|failed)' "$work/tests.txt" | tail -1 | tr -d '=')"
{ grep -E "(FAILED|ERROR) " "$work/tests.txt" | sort -u; tail -n 30 "$work/tests.txt"; } > "$work/tests_cuda.txt" 2>/dev/null
put tests_cuda.txt tests_cuda.txt


if [ $dry = 0 ]; then
  if [ "$(records get "$passed" checks code)" = "$code" ]; then
    log "checks: passed at this code ($(records get "$passed" checks commit)): skipped"
  else
    step checks 120 "$python" bench/gpu_checks.py --out "$work/checks" \
      && records set "$passed" checks code="$code" device="$gpu"
    put checks/gpu_checks.json gpu_checks.json
  fi
fi

# the in-context studies at the paper's size (on an H100 about 2 min for the layers, 3 for the probes, 3 for the
# model with an MLP): a call cut in the middle keeps the studies it finished (summary.json), the next goes on
science=1 step induction 480 "$python" -m analyses.induction reproduce "${induction[@]}" "${device[@]}" --quiet \
  --out "$induction_dir"

# the bench lines whose code changed since measured.json recorded them, the stack rate first
bench_code=$(records hash bench)
for line in "${bench_lines[@]}"; do
  if [ "$(records get "$measured" "$line" code)" = "$bench_code" ]; then
    log "bench_$line: measured at this code ($(records get "$measured" "$line" commit)): skipped"; continue
  fi
  seen=$(cat "$work/bench.txt" 2>/dev/null | wc -l)
  configs=${profile[$line]:-}  # the profiler's configurations of the line (none: not profiled)
  into=bench step "bench_$line" 240 bash -c "echo '== bench line $line'; $python bench/train_throughput.py \
${bench[$line]} --record $measured --line $line; rc=\$?; if [ -n '$configs' ]; then \
$python bench/step_profile.py $profile_flags --configs $configs || rc=1; fi; exit \$rc"
  tail -n "+$(( seen + 1 ))" "$work/bench.txt" | grep "^model_flop_utilisation" | sed 's/^/  /' | tee -a "$work/report.txt"
done
put bench.txt bench.txt

# Figure 4 right: its stacks take minutes each, so it starts where grid_least seconds are left
# (else the pieces go first, their probes recorded one by one, and it waits for a longer call)
grid_least=$([ $dry = 1 ] && echo 0 || echo 240)
grid_step() {
  local t0=$(date +%s)
  inflight "$grid_dir"
  science=1 step grid 600 "$python" -m analyses.tradeoff grid "${grid[@]}" "${device[@]}" --sampler counter \
    --quiet --out "$grid_dir" && log "grid: $(( $(date +%s) - t0 )) s for every cell not recorded before this call"
}
grid_later=0
if [ -f "$done_dir/grid" ] || [ "$(room)" -ge "$grid_least" ]; then grid_step
else log "grid: less than $grid_least s left: the pieces of Figure 4 left first"; grid_later=1; fi

# one search per shape, GPU_RUN_JOBS at a time, their cells shared in the piece's folder; the
# flags reach them through a file (an array does not cross bash -c)
fig4_search() { mapfile -t flags < "$1"; "$python" -m analyses.capacity transformer --shape "$2" "${flags[@]}"; }
export -f fig4_search
export python
packer() {  # pack every pack_every seconds until sent TERM, which waits for an archive in progress
  local nap=""
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do sleep "$pack_every" & nap=$!; wait "$nap"; pack; done
}
# piece NAME FOLDER "SHAPES" "FLAGS": every shape searched with FLAGS into FOLDER (a step
# fig4_left_NAME: done once it finished, resumed from its cells by the next call when cut),
# then its tables (the transformer CLI's, --recorded-only) and the combined ones (--combine) in the
# `after_piece` seconds kept for them. False, with
# nothing started, when an earlier call finished it or too little time is left.
after_piece=$([ $dry = 1 ] && echo 10 || echo 30)
dry_flag=$([ $dry = 1 ] && echo --dry-run)
piece() {
  local name=$1 dir="$fig4_dir/$2" shapes=$3 flags=$4
  earlier "fig4_left_$name" && return 1
  [ "$(room "$after_piece")" -gt 0 ] || return 1
  inflight "$dir"
  local shape_flags=() shape
  for shape in $shapes; do shape_flags+=(--shape "$shape"); done
  printf '%s\n' $flags --out "$dir" "${device[@]}" > "$work/fig4_left_$name.flags"
  packer & local packer=$! rc=0
  after=$after_piece step "fig4_left_$name" 100000 \
    bash -c "printf '%s\n' $shapes | xargs -P $jobs -I{} bash -c 'fig4_search $work/fig4_left_$name.flags {}'" || rc=$?
  kill "$packer" 2>/dev/null; wait "$packer" 2>/dev/null
  within "$python" -m analyses.capacity transformer "${shape_flags[@]}" $flags --out "$dir" "${device[@]}" \
    --recorded-only --combine "$res" >"$work/fig4_left_$name.tables.txt" 2>&1 \
    && log "fig4_left_$name: $(ls "$dir/cells" 2>/dev/null | wc -l) probes recorded in $dir;\
$(grep '^  shape' "$work/fig4_left_$name.tables.txt" | tr -s ' ' | tr '\n' ';')" \
    && [ $rc = 0 ] && finished "fig4_left_$name"  # done with its tables
  pack
  return 0
}
# Figure 4 left, largest sizes first (analyses/capacity/protocol.py); then those sizes again at
# 2^16 steps once every other piece is done
mapfile -t pieces < <("$python" -m analyses.capacity.protocol pieces $dry_flag)
ladder=0
for line in "${pieces[@]}"; do
  IFS=$'\t' read -r name folder shapes flags <<< "$line"
  if [ "${name#2e16_}" != "$name" ] && [ $ladder = 0 ]; then
    ladder=1
    [ "$(ls "$done_dir" | grep '^fig4_left_' | grep -vc '^fig4_left_2e16_')" = "$(printf '%s\n' "${pieces[@]}" \
      | grep -vc '^2e16_')" ] || break
  fi
  piece "$name" "$folder" "$shapes" "$flags"
done
if [ $grid_later = 1 ] && [ "$(room)" -ge "$grid_least" ]; then grid_step; fi
left_over=$(( ${#pieces[@]} - $(ls "$done_dir" | grep -c '^fig4_left_') ))
[ "$left_over" = 0 ] || log "fig4_left: $left_over of ${#pieces[@]} pieces left for the next call"
log "gpu_run: $(( $(date +%s) - start )) s in all; done so far: $(ls "$done_dir" | tr '\n' ' ')"
log "gpu_run: the results are in OUT/results.tar.gz: unpack it in the checkout's root (tar -xzf) and commit $res/"
pack
