#!/bin/bash
# session 11, call A: GPU tests not yet run on a GPU (misaligned plan key, fp16 aligned forward, d = 80/96 split
# backward with the new register table); backward block sweep on the session-10 kernel; ncu of the atomic backward
R=$OUT/A; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s11a.sh .wt/ncu_bwd.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_launch_plan.py tests/test_vec.py tests/test_flash2_fast.py tests/test_smem.py tests/test_gqa.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -4 $R/pytest.txt
timeout 150 ncu --clock-control none --kernel-name-base mangled --kernel-name regex:dkdv --launch-skip 1 --launch-count 1 --set full --import-source no -o $R/bwd python3 .wt/ncu_bwd.py > $R/ncu.log 2>&1; echo "ncu rc=$? $(date +%T)"
ncu -i $R/bwd.ncu-rep --page details > $R/ncu_details.txt 2>&1
ncu -i $R/bwd.ncu-rep --page raw --csv > $R/ncu_raw.csv 2>&1
ncu -i $R/bwd.ncu-rep --page source --csv --print-source sass > $R/ncu_sass.csv 2>&1; echo "source rc=$?"
grep -E "^\s+(Duration|Achieved Occupancy|Issue Slots Busy|Issued Warp|Executed Instructions |No Eligible|Registers Per)" $R/ncu_details.txt
timeout 300 python3 benchmarks/block_sweep.py --d 64 --bwd 32x32 64x32 32x64 16x64 --repeats 10 --csv $R/sweep64.csv > $R/sweep64.txt 2>&1; echo "sweep64 rc=$? $(date +%T)"
timeout 200 python3 benchmarks/block_sweep.py --d 128 --bwd 32x32 64x32 32x64 --repeats 10 --csv $R/sweep128.csv > $R/sweep128.txt 2>&1; echo "sweep128 rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -hE "^ +(64|128) " $R/sweep*.txt
cd $OUT && tar czf A.tgz A && rm -rf A
