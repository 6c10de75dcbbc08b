#!/usr/bin/env bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
t0=$SECONDS
timeout 100 python3 benchmarks/host_overhead.py --dtype bfloat16 --kernels flash2_tc --n 256 --bh 256 --d 64 --csv $O/host.csv --profile $O/host_prof.txt > $O/host.txt 2>&1; echo "host rc=$? $((SECONDS-t0))"
t0=$SECONDS
timeout 120 python3 -m cProfile -s tottime -m flash_numba.examples.gpt train --attn flash_numba --autocast bfloat16 --steps 60 --csv $O/gpt_ours.csv 2>&1 | head -120 > $O/gpt_prof.txt; echo "gptprof $((SECONDS-t0))"
t0=$SECONDS
timeout 60 python3 -m flash_numba.examples.gpt train --attn sdpa --autocast bfloat16 --steps 60 --csv $O/gpt_sdpa.csv > /dev/null 2>&1; echo "sdpa rc=$? $((SECONDS-t0))"
timeout 60 python3 -m flash_numba.examples.gpt train --attn flash_numba --autocast bfloat16 --steps 60 --csv $O/gpt_ours_noprof.csv > /dev/null 2>&1; echo "ours rc=$? $((SECONDS-t0))"
t0=$SECONDS
timeout 90 ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis python3 benchmarks/ncu_probe.py std64 > $O/ncu_std.txt 2>&1; echo "ncu rc=$? $((SECONDS-t0))"
cat $O/host.txt
python3 - <<'P'
import csv,statistics,os
O=os.environ.get("OUT","/tmp/out")
for n in ("gpt_sdpa","gpt_ours_noprof","gpt_ours"):
    try:
        r=list(csv.DictReader(open(f"{O}/{n}.csv")))
        print(n, "median ms/step from step 10:", statistics.median(float(x["ms"]) for x in r[10:]))
    except Exception as e: print(n, e)
P
