#!/bin/bash
# session 15, call B (commit.txt): the tensor-core and CUDA-core ceilings (mma_rate.cu, built here with nvcc 13.0);
# racecheck of the dV/dK split (d = 64 atomic); lesson 10 whole on the GPU (its new cell: S^T/dP^T split or not);
# the N = 1024 harness rows; the d = 64 N = 4096 rows again (the atomic target's margin)
R=$OUT/B; mkdir -p $R; cp .wt/commit.txt .wt/dev_s15b.sh .wt/race_kv.py .wt/mma_rate.cu $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv > $R/smi.csv
timeout 60 .wt/mma_rate > $R/mma_rate.txt 2>&1; echo "mma rc=$?"; cat $R/mma_rate.txt
timeout 120 compute-sanitizer --tool racecheck --racecheck-report hazard python3 .wt/race_kv.py > $R/racecheck.txt 2>&1; echo "racecheck rc=$? $(date +%T)"; tail -n 2 $R/racecheck.txt
timeout 200 python3 lessons/_src/10_in_practice.py > $R/lesson10.txt 2>&1; echo "lesson rc=$? $(date +%T)"; sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/lesson10.txt; grep -B2 -A6 "split" $R/lesson10.txt | tail -20; tail -n 2 $R/lesson10.txt
timeout 70 python3 benchmarks/bench.py --n 1024 --d 64 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_1024.csv > $R/run_1024.txt 2>&1; echo "1024 rc=$? $(date +%T)"
timeout 60 python3 benchmarks/bench.py --n 4096 --d 64 --causal False --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/again_4096.csv > $R/again_4096.txt 2>&1; echo "again rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/run_1024.txt $R/again_4096.txt | cut -c1-110
