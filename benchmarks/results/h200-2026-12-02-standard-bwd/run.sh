#!/usr/bin/env bash
# device call 3 (2026-12-02): standard's float16 backward with the forward's S; racecheck of flash2_fast's dQ lane groups
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/c3; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
t0=$SECONDS
timeout 45 python3 -m flash_numba.tools.bench --n 4096 --d 64 --dtype float16 --pass both --kernels standard flash2_tc --repeats 5 --csv $O/bench_standard_f16.csv > $O/bench.txt 2>&1; echo "bench rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(timeout 115 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider tests/test_standard.py tests/test_standard_tc.py > $O/tests_gpu.txt 2>&1; echo "rc=$?" >> $O/tests_gpu.txt) &
(FLASH_NUMBA_FUZZ_EXAMPLES=15 timeout 115 python3 -m pytest -n 4 -q -p no:cacheprovider tests/test_fuzz.py tests/test_standard.py -k "(test_fuzz and standard) or rounds_unlike" > $O/fuzz15.txt 2>&1; echo "rc=$?" >> $O/fuzz15.txt) &
(timeout 115 python3 benchmarks/sanitize.py --matrix $O/san --quick --tools memcheck initcheck --kernels standard > $O/san.txt 2>&1; echo "rc=$?" >> $O/san.txt) &
(timeout 115 python3 benchmarks/sanitize.py --matrix $O/san_race --quick --tools racecheck --kernels flash2_fast > $O/san_race.txt 2>&1; echo "rc=$?" >> $O/san_race.txt) &
wait; echo "correctness $((SECONDS-t0)) s"
tail -2 $O/tests_gpu.txt; tail -3 $O/fuzz15.txt; tail -4 $O/san.txt; tail -4 $O/san_race.txt; grep -E "standard|flash2_tc" $O/bench.txt | tail -8
cd ${OUT:-/tmp/out} && tar czf c3.tgz c3 && rm -rf c3
