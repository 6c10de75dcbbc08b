#!/usr/bin/env bash
# device call 5 (2026-12-02, second session): main's final dispatch (one launch without the mask, two with it):
# the causal and plain rows at N = 4096, d = 64, float16, then flash2_tc's backward GPU tests
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/s5; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
t0=$SECONDS
timeout 70 python3 -m flash_numba.tools.bench --n 4096 --d 64 --dtype float16 --causal both --pass both --kernels flash2_tc torch-flash --repeats 10 --csv $O/bench.csv > $O/bench.txt 2>&1; echo "bench rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 75 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider tests/test_flash2_tc_backward.py > $O/tests.txt 2>&1; echo "tests rc=$? $((SECONDS-t0)) s"
grep -E "flash2_tc|torch-flash" $O/bench.csv | cut -d, -f1,4,5,7,8,9,10 ; tail -n 2 $O/tests.txt
cd ${OUT:-/tmp/out} && tar czf s5.tgz s5 && rm -rf s5
