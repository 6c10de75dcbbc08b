#!/bin/bash
# session 12, call A: wave quantization of the flash2_fast passes at N = 4096, d = 64 (time against heads, occupancy
# from the driver); host time of one call at N = 128 with cProfile of the replayed calls (main at commit.txt)
R=$OUT/A; mkdir -p $R; cp .wt/commit.txt .wt/dev_s12a.sh .wt/waves.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 240 python3 .wt/waves.py > $R/waves.txt 2>&1; echo "waves rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/waves.txt; cat $R/waves.txt
timeout 90 python3 benchmarks/host_overhead.py --kernels flash2_fast flash2 --csv $R/host.csv --profile $R/host_profile.txt > $R/host.txt 2>&1; echo "host rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/host.txt; cat $R/host.txt
cd $OUT && tar czf A.tgz A && rm -rf A
