#!/usr/bin/env bash
# device call 2 (2026-12-02, third session): L2_PREFETCH default 128 now.  Alternated 0/128/64 at 32k-128k, evict
# first, the decode sweep of flash_decode rows + torch-flash/cudnn, GPU tests and sanitizers of the new default
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/k2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
git log -1 --format=%H > $O/commit.txt 2>/dev/null
A="--n 32768 65536 131072 --count --repeats 10 --kernels flash_decode"
i=0
run() { i=$((i+1)); t0=$SECONDS; timeout 60 python3 benchmarks/decode_knobs.py "$@" -- $A --csv $O/alt$i.csv > $O/alt$i.txt 2>&1; echo "alt$i rc=$? $((SECONDS-t0)) s: $*"; }
run --set L2_PREFETCH=0; run --set L2_PREFETCH=128; run --set L2_PREFETCH=64
run --set L2_PREFETCH=0; run --set L2_PREFETCH=128; run --set L2_PREFETCH=64
run --set L2_PREFETCH=128 --set L2_EVICT_FIRST=True
tail -n 5 $O/alt7.txt
t0=$SECONDS
DECODE_FIGURE=0 DECODE_KERNELS="flash_decode flash_decode-paged flash_decode-s1 flash_decode-paged-s1 flash_decode-unfused torch-flash torch-cudnn" timeout 200 bash benchmarks/decode_sweep.sh $O/sweep > /dev/null 2>&1; echo "sweep rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_decode.py > $O/gpu_tests.log 2>&1; echo "rc=$?" >> $O/gpu_tests.log) &
for t in memcheck racecheck synccheck; do (timeout 150 compute-sanitizer --tool $t --error-exitcode 9 python3 benchmarks/decode_sanitize.py --small --d 128 > $O/$t.log 2>&1; echo "rc=$?" >> $O/$t.log) & done
wait; echo "correctness $((SECONDS-t0)) s"
for f in $O/alt*.txt; do echo "== $f"; grep -E "knobs|^flash_decode" $f | cut -c1-110; done
grep -E "^N =|^flash_decode |^flash_decode-paged |^torch" $O/sweep/bench_decode.txt | cut -c1-110
tail -n 2 $O/gpu_tests.log; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" $O/*check.log
cd ${OUT:-/tmp/out} && tar czf k2.tgz k2 && rm -rf k2
