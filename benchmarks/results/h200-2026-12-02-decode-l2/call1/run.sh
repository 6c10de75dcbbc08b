#!/usr/bin/env bash
# device call 1 (2026-12-02, third session): flash_decode tc knobs (L2 prefetch size, evict-first, K then V, early
# prologue), each its own process, 32k and 128k, float16, B=8 Hq=32 Hkv=8 d=128 Nq=1; torch-flash once
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
O=${OUT:-/tmp/out}/k1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
A="--n 32768 131072 --count --repeats 10 --kernels flash_decode"
i=0
run() { i=$((i+1)); t0=$SECONDS; timeout 60 python3 benchmarks/decode_knobs.py "$@" -- $A --csv $O/v$i.csv > $O/v$i.txt 2>&1; echo "v$i rc=$? $((SECONDS-t0)) s: $*"; }
t0=$SECONDS; timeout 60 python3 -m flash_numba.tools.bench_decode --n 32768 131072 --count --repeats 10 --kernels torch-flash --csv $O/torch.csv > $O/torch.txt 2>&1; echo "torch rc=$? $((SECONDS-t0)) s"
run
run --set L2_PREFETCH=128
run --set L2_PREFETCH=256
run --set L2_PREFETCH=256 --set L2_EVICT_FIRST=True
run --set K_THEN_V=True
run --set EARLY_PROLOGUE=True
run --set L2_PREFETCH=256 --set K_THEN_V=True --set EARLY_PROLOGUE=True
run
for f in $O/torch.txt $O/v*.txt; do echo "== $f"; grep -E "knobs|^flash_decode|^torch" $f | cut -c1-150; done
