#!/usr/bin/env bash
# device call 4 (2026-12-02, third session): the full decode sweep at the final code (9ec28ff)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/k4; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
t0=$SECONDS
DECODE_FIGURE=0 timeout 380 bash benchmarks/decode_sweep.sh $O/sweep > $O/sweep.log 2>&1; echo "sweep rc=$? $((SECONDS-t0)) s"
grep -E "^N =|^flash_decode |^torch-flash|^flash_decode-cuda|^flash2_fast" $O/sweep/bench_decode.txt | cut -c1-100
cd ${OUT:-/tmp/out} && tar czf k4.tgz k4 && rm -rf k4
