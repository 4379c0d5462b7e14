#!/usr/bin/env bash
# GPU day one: what to run the first time a GPU machine (one H100 or H200) is at hand, in under ten minutes.
#
#   bash benchmarks/gpu_day_one.sh [--smoke] [--steps facts,tests,bench,tune] [OUT_DIR]
#
# Steps, each under its own timeout, each writing under OUT_DIR ($OUT when set, else artifacts/gpu_day_one):
#   facts  the device, torch, CUDA and Triton versions; stops   facts.log, facts.json
#          the run (exit 4) where a package the later steps
#          import is missing, naming it
#   tests  the kernel tests that run on CUDA tensors (bf16,     kernel_tests.log, kernel_tests.xml
#          large cases), a line per test; failures are
#          recorded, the rest runs
#   bench  python -m benchmarks.attention --suite gpu at        bench.log, bench/bench.json, bench/bench.png,
#          n = 16384: the speed table                           speed_table.md
#   tune   python -m benchmarks.tune at n = 16384, last: it     tune.log, tune/tune.json, tune.md
#          finds the bench's kernels compiled, and it is the
#          step a short run can best lose
# then a summary (summary.md, summary.json) and exit status 1 if anything failed (benchmarks/gpu_day_one.py
# says what counts). --smoke runs the same steps on CPU tensors in Triton's interpreter at tiny sizes, a
# rehearsal that needs no GPU (about a minute and a half on two cores). --steps runs some of the steps, e.g.
# the benchmarks again after a timeout.
#
# Environment: PYTHON (default .venv/bin/python, else python3); DAY_ONE_FACTS_S, DAY_ONE_TESTS_S,
# DAY_ONE_TUNE_S, DAY_ONE_BENCH_S (each step's timeout in seconds; on a GPU 30 + 150 + 270 + 120 = 570 at
# most in all, sized from the first H200 run: the tests need about 140 s on 12 workers, the speed table
# 260 s with its FlexAttention compilations, the tuning's defaults pass and one candidate about 60 s each
# when nothing is compiled yet); DAY_ONE_TUNE_BUDGET_S (the tuning's --budget-s, 60 on a GPU: about one
# candidate); DAY_ONE_TESTS (pytest arguments instead of the kernel test files); DAY_ONE_TEST_WORKERS
# (pytest-xdist workers on a GPU, 12); DAY_ONE_TOTAL_S (the whole run's seconds, 570 on a GPU: each step's
# timeout is cut to what is left, and a step with under 15 s left is not started); DAY_ONE_SMOKE=1 (as
# --smoke).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

smoke="${DAY_ONE_SMOKE:-0}"
steps="facts,tests,bench,tune"
out=""
while (($#)); do
  case "$1" in
    --smoke) smoke=1 ;;
    --steps) [[ $# -ge 2 ]] || { echo "--steps needs a value" >&2; exit 2; }; steps="$2"; shift ;;
    --steps=*) steps="${1#--steps=}" ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ -z $out ]] || { echo "one OUT_DIR only, got $out and $1" >&2; exit 2; }; out="$1" ;;
  esac
  shift
done
IFS=, read -r -a chosen <<< "$steps"
for step in "${chosen[@]}"; do
  case "$step" in
    facts | tests | tune | bench) ;;
    *) echo "--steps: unknown step '$step' (facts, tests, bench, tune)" >&2; exit 2 ;;
  esac
done
wants() { [[ ",$steps," == *",$1,"* ]]; }

out="${out:-${OUT:-artifacts/gpu_day_one}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"  # absolute, before moving to the repository root
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-}"
if [[ -z $py ]]; then
  if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi

# the test files whose tests run on CUDA tensors when a GPU is present (they ask torch.cuda.is_available())
mapfile -t kernel_files < <(grep -l "cuda.is_available" tests/kernels/test_*.py | grep -v test_gpu_day_one.py)
if [[ $smoke == 1 ]]; then
  export CUDA_VISIBLE_DEVICES=""  # CPU tensors, even on a machine with a GPU
  export TRITON_INTERPRET=1
  device=cpu bench_n=64 bench_buckets=4 tune_n=32
  tune_budget="${DAY_ONE_TUNE_BUDGET_S:-30}"
  limits=("${DAY_ONE_FACTS_S:-60}" "${DAY_ONE_TESTS_S:-120}" "${DAY_ONE_BENCH_S:-180}" "${DAY_ONE_TUNE_S:-120}")
  total="${DAY_ONE_TOTAL_S:-900}"
  # one cheap test of each file: the interpreter runs the full files in many minutes
  test_args=(-k "rows_with_no_key_give_zeros or float16_inputs or cpu_tensors_run_the_torch_path or heads_must_divide or deviation_is_the_worst or row_without_valid_ids or axes_diagonalise or a_bucket_is_one_block_row")
else
  unset TRITON_INTERPRET  # benchmarks.tune refuses to time the interpreter on CUDA tensors
  device=cuda bench_n=16384 bench_buckets=16 tune_n=16384
  tune_budget="${DAY_ONE_TUNE_BUDGET_S:-60}"
  limits=("${DAY_ONE_FACTS_S:-30}" "${DAY_ONE_TESTS_S:-150}" "${DAY_ONE_BENCH_S:-270}" "${DAY_ONE_TUNE_S:-120}")
  total="${DAY_ONE_TOTAL_S:-570}"  # the whole run, so that one command fits a 10-minute device call
  # the tuning's own tests sweep tiles on CUDA as the tune step does, a minute each: that step covers them
  mapfile -t kernel_files < <(printf '%s\n' "${kernel_files[@]}" | grep -v test_tune.py)
  # the tests compile their Triton kernels on the CPU (16 cores on an H200 machine), so more workers than
  # the GPU alone would want: 12 finished 152 of about 170 tests in 125 s there; the slowest are printed
  test_args=(--durations 15)
  if "$py" -c "import xdist" 2> /dev/null; then test_args+=(-n "${DAY_ONE_TEST_WORKERS:-12}"); fi
fi
# with pytest-timeout, the session ends itself between tests 25 s before the step's timeout, so that pytest
# still writes its XML (a kill leaves only the log, whose verbose lines the summary then counts)
# (pytest-timeout 2.3 and later: earlier ones have no --session-timeout, and pytest would stop at the option)
if "$py" -c "import pytest_timeout as t; assert hasattr(t, 'SESSION_TIMEOUT_KEY')" 2> /dev/null; then
  test_args+=(--session-timeout "$((limits[1] > 50 ? limits[1] - 25 : limits[1]))")
fi
if [[ -n ${DAY_ONE_TESTS:-} ]]; then
  read -r -a kernel_files <<< "$DAY_ONE_TESTS"
  if [[ $smoke == 1 ]]; then test_args=(); fi
fi

declare -A codes=()
# run_step STEP LOG LIMIT_S COMMAND...: the command under its timeout (SIGINT first, so pytest still writes
# its report and the benchmarks stop between calls; SIGKILL 10 s later), its output on the terminal and in
# OUT_DIR/LOG; records the exit status (124: timed out, or not started for want of time) and never stops the
# script
# within what is left of the run's DAY_ONE_TOTAL_S, less 25 s: the kill's 10 s grace and the summary's time
run_step() {
  local step=$1 log=$2 limit=$3
  shift 3
  local left=$((total - SECONDS - 25))
  if ((left < limit)); then limit=$left; fi
  echo
  if ((limit < 15)); then
    echo "== $step: not started, the run's ${total} s are spent" | tee "$out/$log"
    codes[$step]=124
    return
  fi
  echo "== $step (timeout ${limit} s): $*"
  set +e
  timeout -s INT -k 10 "$limit" "$@" 2>&1 | tee "$out/$log"
  codes[$step]=${PIPESTATUS[0]}
  set -e
  echo "== $step: exit ${codes[$step]}"
}

echo "GPU day one ($([[ $smoke == 1 ]] && echo "smoke: CPU tensors, Triton's interpreter" || echo "$device")): steps $steps, outputs in $out"
if wants facts; then
  require=(--require-cuda)
  if [[ $smoke == 1 ]]; then require=(); fi
  # the modules the later steps import: the benchmarks and the test files (tests/kernels/test_x.py as
  # tests.kernels.test_x)
  imports=(benchmarks.attention benchmarks.tune)
  for file in "${kernel_files[@]}"; do
    if [[ $file == tests/*.py ]]; then imports+=("$(echo "${file%.py}" | tr / .)"); fi
  done
  run_step facts facts.log "${limits[0]}" "$py" -m benchmarks.gpu_day_one facts "$out" "${require[@]}" \
    --imports "${imports[@]}"
  # no CUDA device (3) or a missing package (4): the other steps cannot run
  if [[ ${codes[facts]} == 3 || ${codes[facts]} == 4 ]]; then exit "${codes[facts]}"; fi
fi
# each step's report is removed first: a step killed before writing one must not leave an earlier run's
if wants tests; then
  rm -f "$out/kernel_tests.xml"
  run_step tests kernel_tests.log "${limits[1]}" "$py" -m pytest -v -rfEsxXp -p no:cacheprovider \
    --junitxml="$out/kernel_tests.xml" "${test_args[@]}" "${kernel_files[@]}"
fi
if wants bench; then
  rm -f "$out/bench/bench.json" "$out/bench/bench.png" "$out/speed_table.md"
  # Inductor compiles FlexAttention in this process: on the first H200 run its pool of compile workers
  # (one process per core, each importing torch) held the first FlexAttention row for over 195 s
  run_step bench bench.log "${limits[2]}" env TORCHINDUCTOR_COMPILE_THREADS=1 \
    "$py" -m benchmarks.attention --suite gpu --device "$device" \
    --sizes "$bench_n" --buckets "$bench_buckets" --index-inputs local --out "$out/bench"
fi
if wants tune; then
  rm -f "$out/tune/tune.json" "$out/tune.md"
  run_step tune tune.log "${limits[3]}" "$py" -m benchmarks.tune --device "$device" --sizes "$tune_n" \
    --budget-s "$tune_budget" --out "$out/tune"
fi

status=()
for step in "${!codes[@]}"; do status+=("$step=${codes[$step]}"); done
smoke_flag=()
if [[ $smoke == 1 ]]; then smoke_flag=(--smoke); fi
echo
"$py" -m benchmarks.gpu_day_one summary "$out" --status "${status[@]}" "${smoke_flag[@]}"
