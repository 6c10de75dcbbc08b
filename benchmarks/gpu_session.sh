#!/usr/bin/env bash
# Everything that only a GPU can show, in as few device calls as possible.
#
#   bash benchmarks/gpu_session.sh A OUTDIR   # bench (timed, alone), then GPU tests + sanitizer + reliability in parallel
#   bash benchmarks/gpu_session.sh B OUTDIR   # leaks, bench, figures; then GPU tests, ncu profile, lessons side by side
#   bash benchmarks/gpu_session.sh C OUTDIR   # correctness only: the whole GPU test tier, lessons, sanitizer, side by side
#   bash benchmarks/gpu_session.sh D OUTDIR   # timing only, one step after another: bench, figures 5 and 6, ncu profile
#   bash benchmarks/gpu_session.sh E OUTDIR   # after a flash2_fast / input-handling change: its GPU tests and sanitizer
# (pytest runs with -v so that a run cut by its time limit still names every test that reported)
#
# Used for the committed H200 results (benchmarks/results/, figures/out/); see
# benchmarks/results/README.md for the dates and the exact commands.
set -u
mode=$1
out=$2
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$out/nvidia-smi.csv" 2>&1
python3 -c "import numpy, numba, numba_cuda; print('numpy', numpy.__version__, 'numba', numba.__version__)" > "$out/versions.txt" 2>&1
python3 -m flash_numba info >> "$out/versions.txt" 2>&1

# Each lesson's Python source, run as a script in three background groups (the device has no nbformat);
# one line per lesson in $out/lessons.txt. $1: the time limit of one lesson, in seconds.
lessons_in_background() {
  for group in "00 01 02 03" "04 05 06 07" "08 09 10"; do
    (for n in $group; do
       f=$(ls lessons/_src/${n}_*.py); t1=$(date +%s)
       (cd lessons && timeout "$1" python3 "_src/$(basename "$f")" > "$out/lesson_$n.log" 2>&1)
       rc=$?
       printf '%s rc=%s %ss %s\n' "$(basename "$f")" "$rc" "$(( $(date +%s) - t1 ))" \
         "$(grep -c 'all checks passed' "$out/lesson_$n.log") check line(s)" >> "$out/lessons.txt"
     done) &
  done
}

if [ "$mode" = A ]; then
  t0=$(date +%s)
  timeout 240 python3 benchmarks/bench.py --n 1024 2048 4096 8192 --csv "$out/bench.csv" --plot "$out/bench.png" \
    > "$out/bench.txt" 2> "$out/bench.err"
  echo "bench rc=$? $(( $(date +%s) - t0 ))s"
  t0=$(date +%s)
  (timeout 300 python3 -m pytest -m gpu -v -p no:cacheprovider tests --ignore=tests/test_lessons.py \
      -o addopts="" -rfE > "$out/gpu_tests.log" 2>&1; echo "gpu tests rc=$?" >> "$out/gpu_tests.log") &
  for tool in memcheck racecheck synccheck; do
    (timeout 300 python3 benchmarks/sanitize.py --matrix "$out/sanitize_$tool" --quick --tools $tool --timeout 280 \
        > "$out/sanitize_$tool.txt" 2>&1) &
  done
  (timeout 200 python3 benchmarks/reliability.py determinism "$out/reliability" > "$out/determinism.txt" 2>&1;
   timeout 120 python3 benchmarks/reliability.py leaks "$out/reliability" > "$out/leaks.txt" 2>&1) &
  wait
  echo "parallel part $(( $(date +%s) - t0 ))s"
  tail -n 3 "$out/gpu_tests.log"
  grep -h "ERROR SUMMARY" "$out"/sanitize_*/*.log 2>/dev/null | sort | uniq -c
fi

if [ "$mode" = B ]; then
  # timing-sensitive steps alone, one after another
  timeout 60 python3 benchmarks/reliability.py leaks "$out/reliability" > "$out/leaks.txt" 2>&1
  echo "leaks rc=$?"
  t0=$(date +%s)
  timeout 150 python3 benchmarks/bench.py --n 1024 4096 8192 --kernels standard flash2 flash2_fast torch-math torch-efficient \
    --csv "$out/bench.csv" --plot "$out/bench.png" > "$out/bench.txt" 2> "$out/bench.err"
  echo "bench rc=$? $(( $(date +%s) - t0 ))s"
  t0=$(date +%s)
  timeout 150 python3 figures/make_all.py --quick --out "$out/figures" > "$out/figures.txt" 2>&1
  echo "figures rc=$? $(( $(date +%s) - t0 ))s"
  # correctness-only steps side by side
  t0=$(date +%s)
  (timeout 200 python3 -m pytest -m gpu -v -n 4 -p no:cacheprovider -o addopts="" -rfE \
      tests/test_flash2.py tests/test_flash2_fast.py tests/test_standard.py tests/test_reliability.py \
      tests/test_inputs.py tests/test_microbench.py tests/test_device.py > "$out/gpu_tests.log" 2>&1;
   echo "gpu tests rc=$?" >> "$out/gpu_tests.log") &
  (timeout 150 python3 -m flash_numba.profile --out "$out/profile" > "$out/profile.txt" 2>&1) &
  lessons_in_background 100
  wait
  echo "parallel part $(( $(date +%s) - t0 ))s"
  sort "$out/lessons.txt"; tail -n 4 "$out/gpu_tests.log"; tail -n 3 "$out/profile.txt"
fi
if [ "$mode" = C ]; then
  t0=$(date +%s)
  (timeout 420 python3 -m pytest -m gpu -v -n 6 -p no:cacheprovider -o addopts="" -rfE --durations=15 tests --ignore=tests/test_lessons.py \
      > "$out/gpu_tests.log" 2>&1; echo "gpu tests rc=$?" >> "$out/gpu_tests.log") &
  for tool in memcheck racecheck synccheck; do
    (timeout 420 python3 benchmarks/sanitize.py --matrix "$out/sanitize_$tool" --quick --tools $tool --timeout 400 \
        > "$out/sanitize_$tool.txt" 2>&1) &
  done
  lessons_in_background 150
  wait
  echo "parallel part $(( $(date +%s) - t0 ))s"
  sort "$out/lessons.txt"; tail -n 3 "$out/gpu_tests.log"
  grep -h "ERROR SUMMARY" "$out"/sanitize_*/*.log 2>/dev/null | sort | uniq -c
fi

if [ "$mode" = E ]; then
  t0=$(date +%s)
  (timeout 330 python3 -m pytest -m gpu -v -n 6 -p no:cacheprovider -o addopts="" -rfE --durations=10 \
      tests/test_flash2_fast.py tests/test_inputs.py tests/test_bench.py tests/test_device.py tests/test_reliability.py \
      > "$out/gpu_tests.log" 2>&1; echo "gpu tests rc=$?" >> "$out/gpu_tests.log") &
  for tool in memcheck racecheck synccheck; do
    (timeout 330 python3 benchmarks/sanitize.py --matrix "$out/sanitize_$tool" --quick --tools $tool --timeout 320 \
        --kernels flash2_fast flash2_fast-atomic > "$out/sanitize_$tool.txt" 2>&1) &
  done
  (timeout 200 python3 benchmarks/reliability.py determinism "$out/reliability" > "$out/determinism.txt" 2>&1) &
  wait
  echo "parallel part $(( $(date +%s) - t0 ))s"
  tail -n 3 "$out/gpu_tests.log"
  grep -h "^== " "$out"/sanitize_*.txt
fi

if [ "$mode" = D ]; then
  t0=$(date +%s)
  timeout 260 python3 benchmarks/bench.py --n 1024 4096 8192 \
    --kernels standard flash2 flash2_fast flash2_fast-atomic torch-math torch-efficient \
    --csv "$out/bench.csv" --plot "$out/bench.png" > "$out/bench.txt" 2> "$out/bench.err"
  echo "bench rc=$? $(( $(date +%s) - t0 ))s"
  t0=$(date +%s)
  timeout 150 python3 figures/make_all.py --quick --only 5 6 --out "$out/figures" > "$out/figures.txt" 2>&1
  echo "figures rc=$? $(( $(date +%s) - t0 ))s"
  t0=$(date +%s)
  timeout 90 python3 -m flash_numba.profile --out "$out/profile" > "$out/profile.txt" 2>&1
  echo "profile rc=$? $(( $(date +%s) - t0 ))s"
  tail -n 30 "$out/bench.txt"; tail -n 5 "$out/figures.txt"
fi
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
