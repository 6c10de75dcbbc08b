#!/bin/bash
# session 13, call A: atomic backward blocks (d = 64: 32x64 against 64x64; d = 128: 32x32 against 16x64 with the
# backward's limits lifted), cuBLAS float32's rate on the backward's products, ncu of the d = 128 atomic kernel
R=$OUT/A; mkdir -p $R; cp .wt/commit.txt .wt/dev_s13a.sh .wt/sweep_wide.py .wt/gemm_ceiling.py .wt/ncu_bwd128.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 40 python3 .wt/gemm_ceiling.py > $R/gemm.txt 2>&1; echo "gemm rc=$? $(date +%T)"; cat $R/gemm.txt
timeout 200 python3 .wt/sweep_wide.py --d 64 --bwd 32x64 64x64 --repeats 10 --csv $R/sweep64.csv > $R/sweep64.txt 2>&1; echo "sweep64 rc=$? $(date +%T)"
grep -hE "^ +(64|128) " $R/sweep64.txt
timeout 170 python3 .wt/sweep_wide.py --d 128 --bwd 32x32 16x64 --repeats 10 --csv $R/sweep128.csv > $R/sweep128.txt 2>&1; echo "sweep128 rc=$? $(date +%T)"
grep -hE "^ +(64|128) " $R/sweep128.txt
timeout 130 ncu --clock-control none --kernel-name-base mangled --kernel-name regex:dkdv --launch-skip 1 --launch-count 1 --set full --import-source no -o $R/bwd128 python3 .wt/ncu_bwd128.py > $R/ncu.log 2>&1; echo "ncu rc=$? $(date +%T)"
ncu -i $R/bwd128.ncu-rep --page details > $R/ncu_details.txt 2>&1
ncu -i $R/bwd128.ncu-rep --page raw --csv > $R/ncu_raw.csv 2>&1
ncu -i $R/bwd128.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $R/ncu_sass.csv.gz; echo "source rc=$?"
grep -E "^\s+(Duration|Achieved Occupancy|Issue Slots Busy|Issued Warp|Executed Instructions |No Eligible|Registers Per|Block Limit)" $R/ncu_details.txt
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cd $OUT && tar czf A.tgz A && rm -rf A
