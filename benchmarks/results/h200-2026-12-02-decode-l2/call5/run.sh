#!/usr/bin/env bash
# device call 5 (2026-12-02, third session): the CUDA-core decode kernel capped at 128 registers
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/k5; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
t0=$SECONDS
timeout 100 python3 -m flash_numba.tools.bench_decode --n 4096 32768 131072 --count float16 --repeats 10 --kernels flash_decode-cuda flash_decode-paged-cuda flash_decode --csv $O/decode.csv > $O/bench_decode.txt 2>&1; echo "decode rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_decode.py > $O/gpu_tests.log 2>&1; echo "rc=$?" >> $O/gpu_tests.log) &
for t in memcheck racecheck; do (timeout 110 compute-sanitizer --tool $t --error-exitcode 9 python3 benchmarks/decode_sanitize.py --small > $O/$t.log 2>&1; echo "rc=$?" >> $O/$t.log) & done
wait; echo "correctness $((SECONDS-t0)) s"
grep -E "^N =|^flash_decode" $O/bench_decode.txt | cut -c1-110
tail -n 2 $O/gpu_tests.log; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" $O/*check.log
cd ${OUT:-/tmp/out} && tar czf k5.tgz k5 && rm -rf k5
