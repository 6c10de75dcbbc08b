#!/usr/bin/env bash
# device call 4 (2026-12-02, second session): the harness on main (flash2_tc's one-launch backward)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/s4; mkdir -p $O/h
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
git log -1 --format=%H > $O/commit.txt 2>/dev/null
t0=$SECONDS
timeout ${TT:-300} python3 .probe/driver.py $O/h bench_f16_d64,bench_f16_d128,bench_bf16 > $O/harness.txt 2>&1; echo "harness rc=$? $((SECONDS-t0)) s"
cat $O/harness.txt; grep -h "All results\|MISMATCH" $O/h/*.txt | head
cd ${OUT:-/tmp/out} && tar czf s4.tgz s4 && rm -rf s4
