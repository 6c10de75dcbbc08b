#!/usr/bin/env bash
# Everything that only a GPU can show, in as few device calls as possible, as named steps.
#
#   bash benchmarks/gpu_session.sh STEP [STEP ...] OUTDIR
#
# Timing steps run first, one after another, alone on the GPU:
#   bench        the harness (benchmarks/bench.py) at N = 1024, 4096, 8192, every implementation: table, CSV, plot
#   figures      figures/make_all.py --quick (figures 1-6 into OUTDIR/figures)
#   profile      flash-numba profile: our HBM byte counters beside Nsight Compute's DRAM bytes
#   l2           benchmarks/l2_sweep.py: DRAM and L2 bytes against N for standard and flash2_fast (crossing the L2)
#   gpt          benchmarks/train_gpt_h200.sh: the example GPT trained with SDPA and with our attention
# then the correctness steps, side by side:
#   tests        the `gpu` test tier (pytest -m gpu -v -n 6; test_lessons.py excluded: the device has no nbformat)
#   sanitize     compute-sanitizer memcheck, racecheck and synccheck over every kernel (benchmarks/sanitize.py --quick)
#   lessons      each lesson's Python source run as a script; one line per lesson in OUTDIR/lessons.txt
#   reliability  determinism (20 calls, bit for bit) and leaks (1000 calls) of benchmarks/reliability.py
# and the groups:
#   timing       bench figures profile
#   correctness  tests sanitize lessons reliability
#   all          timing, then correctness
#
# Narrower runs through the environment (defaults in brackets):
#   BENCH_ARGS        options of benchmarks/bench.py [--n 1024 4096 8192 --kernels standard flash2 flash2_fast
#                     flash2_fast-atomic torch-math torch-efficient]
#   FIGURES_ARGS      options of figures/make_all.py [--quick]          e.g. "--quick --only 5 6"
#   TESTS             test files of the tests step [tests]              e.g. "tests/test_flash2_fast.py tests/test_inputs.py"
#   SANITIZE_KERNELS  --kernels of the sanitize step [every kernel]     e.g. "flash2_fast flash2_fast-atomic"
#
# pytest runs with -v so that a run cut by its time limit still names every test that reported.  OUTDIR.tgz
# packs OUTDIR at the end.  The committed H200 results (benchmarks/results/, figures/out/) came from this
# script; each results folder's README.md gives the date, GPU, commands and commits (benchmarks/results/README.md lists them).
set -u
if [ $# -lt 2 ]; then
  sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=${!#}
steps=("${@:1:$#-1}")
mkdir -p "$out"
export PYTHONUNBUFFERED=1

BENCH_ARGS=${BENCH_ARGS:---n 1024 4096 8192 --kernels standard flash2 flash2_fast flash2_fast-atomic torch-math torch-efficient}
FIGURES_ARGS=${FIGURES_ARGS:---quick}
TESTS=${TESTS:-tests}
SANITIZE_KERNELS=${SANITIZE_KERNELS:-}

# ---------------------------------------------------------------------------- timing steps (foreground)

step_bench() {
  # shellcheck disable=SC2086  (BENCH_ARGS is a list of options)
  timeout 260 python3 benchmarks/bench.py $BENCH_ARGS --csv "$out/bench.csv" --plot "$out/bench.png" \
    > "$out/bench.txt" 2> "$out/bench.err"
  echo "bench rc=$?"
  tail -n 30 "$out/bench.txt"
}

step_figures() {
  # shellcheck disable=SC2086
  timeout 150 python3 figures/make_all.py $FIGURES_ARGS --out "$out/figures" > "$out/figures.txt" 2>&1
  echo "figures rc=$?"
  tail -n 8 "$out/figures.txt"
}

step_l2() {
  timeout 240 python3 benchmarks/l2_sweep.py --out "$out/l2" > "$out/l2.txt" 2>&1
  echo "l2 rc=$?"
  tail -n 12 "$out/l2.txt"
}

step_gpt() {
  timeout 280 bash benchmarks/train_gpt_h200.sh "$out/gpt" > "$out/gpt.txt" 2>&1
  echo "gpt rc=$?"
  tail -n 6 "$out/gpt.txt"
}

step_profile() {
  timeout 90 python3 -m flash_numba profile --out "$out/profile" > "$out/profile.txt" 2>&1
  echo "profile rc=$?"
  tail -n 3 "$out/profile.txt"
}

# ---------------------------------------------------------------------------- correctness steps (background)

step_tests() {
  # shellcheck disable=SC2086  (TESTS is a list of paths)
  timeout 420 python3 -m pytest -m gpu -v -n 6 -p no:cacheprovider -o addopts="" -rfE --durations=15 \
    $TESTS --ignore=tests/test_lessons.py > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$out/gpu_tests.log"
}

step_sanitize() {
  local kernels=()
  [ -n "$SANITIZE_KERNELS" ] && read -r -a kernels <<< "--kernels $SANITIZE_KERNELS"
  for tool in memcheck racecheck synccheck; do
    (timeout 420 python3 benchmarks/sanitize.py --matrix "$out/sanitize_$tool" --quick --tools $tool --timeout 400 \
        ${kernels[@]+"${kernels[@]}"} > "$out/sanitize_$tool.txt" 2>&1) &
  done
  wait
}

# Each lesson's Python source as a script, in three groups side by side (150 s per lesson).
step_lessons() {
  local all=() groups=("" "" "")
  for f in lessons/_src/[0-9][0-9]_*.py; do all+=("$(basename "$f" | cut -c1-2)"); done
  for i in "${!all[@]}"; do groups[$((i % 3))]+="${all[$i]} "; done
  for group in "${groups[@]}"; do
    (for n in $group; do
       f=$(ls lessons/_src/${n}_*.py); t1=$(date +%s)
       (cd lessons && timeout 150 python3 "_src/$(basename "$f")" > "$out/lesson_$n.log" 2>&1)
       rc=$?
       printf '%s rc=%s %ss %s\n' "$(basename "$f")" "$rc" "$(( $(date +%s) - t1 ))" \
         "$(grep -c 'all checks passed' "$out/lesson_$n.log") check line(s)" >> "$out/lessons.txt"
     done) &
  done
  wait
}

step_reliability() {
  timeout 200 python3 benchmarks/reliability.py determinism "$out/reliability" > "$out/determinism.txt" 2>&1
  timeout 120 python3 benchmarks/reliability.py leaks "$out/reliability" > "$out/leaks.txt" 2>&1
}

# ---------------------------------------------------------------------------- order of the steps

timing=() correctness=()
for s in "${steps[@]}"; do
  case $s in
    bench|figures|profile|l2|gpt) timing+=("$s") ;;
    tests|sanitize|lessons|reliability) correctness+=("$s") ;;
    timing) timing+=(bench figures profile) ;;
    correctness) correctness+=(tests sanitize lessons reliability) ;;
    all) timing+=(bench figures profile); correctness+=(tests sanitize lessons reliability) ;;
    *) echo "unknown step: $s (see: bash $0)" >&2; exit 2 ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$out/nvidia-smi.csv" 2>&1
python3 -c "import numpy, numba; print('numpy', numpy.__version__, 'numba', numba.__version__)" > "$out/versions.txt" 2>&1
python3 -m flash_numba info >> "$out/versions.txt" 2>&1

for s in ${timing[@]+"${timing[@]}"}; do
  t0=$(date +%s); "step_$s"; echo "$s: $(( $(date +%s) - t0 ))s"
done
if [ ${#correctness[@]} -gt 0 ]; then
  t0=$(date +%s)
  for s in "${correctness[@]}"; do "step_$s" & done
  wait
  echo "${correctness[*]}: $(( $(date +%s) - t0 ))s side by side"
  [ -f "$out/gpu_tests.log" ] && tail -n 3 "$out/gpu_tests.log"
  [ -f "$out/lessons.txt" ] && sort "$out/lessons.txt"
  grep -h "ERROR SUMMARY" "$out"/sanitize_*/*.log 2>/dev/null | sort | uniq -c
  [ -f "$out/determinism.txt" ] && tail -n 2 "$out/determinism.txt" "$out/leaks.txt"
fi
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
