#!/usr/bin/env bash
# device call 3 (2026-12-02, third session): the final flash_decode code (cp.async .L2::128B, knobs taken out):
# decode at 32k-128k float16/bfloat16 with the counters, GPU tests, sanitizers; then flash2_tc's forward with
# L2_PREFETCH 0 / 128 alternated (an experiment)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/k3; mkdir -p $O/fwd
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
git log -1 --format=%H > $O/commit.txt 2>/dev/null
t0=$SECONDS
timeout 120 python3 -m flash_numba.tools.bench_decode --n 32768 65536 131072 --dtype float16 bfloat16 --count float16 --repeats 10 --kernels flash_decode flash_decode-paged torch-flash --csv $O/decode.csv > $O/bench_decode.txt 2>&1; echo "decode rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_decode.py tests/test_mma.py > $O/gpu_tests.log 2>&1; echo "rc=$?" >> $O/gpu_tests.log) &
for t in memcheck racecheck synccheck; do (timeout 150 compute-sanitizer --tool $t --error-exitcode 9 python3 benchmarks/decode_sanitize.py --small --d 128 > $O/$t.log 2>&1; echo "rc=$?" >> $O/$t.log) & done
wait; echo "correctness $((SECONDS-t0)) s"
grep -E "^N =|^flash_decode |^flash_decode-paged |^torch" $O/bench_decode.txt | cut -c1-110
tail -n 2 $O/gpu_tests.log; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" $O/*check.log
i=0
for pf in 0 128 0 128; do i=$((i+1)); t0=$SECONDS
  timeout 80 python3 .probe/fwdl2.py $pf --n 4096 16384 --d 64 128 --dtype float16 --causal false --pass fwd --kernels flash2_tc --repeats 10 --csv $O/fwd/f$i.csv > $O/fwd/f$i.txt 2>&1; echo "fwd$i pf=$pf rc=$? $((SECONDS-t0)) s"
  grep -E "L2_PREFETCH|flash2_tc" $O/fwd/f$i.txt | cut -c1-120
done
cd ${OUT:-/tmp/out} && tar czf k3.tgz k3 && rm -rf k3
