#!/bin/bash
# session 15, call C (commit.txt): the N = 1024 harness rows (B's files did not come back: too many), the d = 64
# N = 4096 rows twice more (the atomic target's margin), and the causal rules' device test on the GPU
R=$OUT/C; mkdir -p $R; cp .wt/commit.txt .wt/dev_s15c.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv > $R/smi.csv
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_causal.py > $R/pytest_causal.txt 2>&1; echo "causal rc=$?"; tail -1 $R/pytest_causal.txt
timeout 80 python3 benchmarks/bench.py --n 1024 --d 64 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_1024.csv > $R/run_1024.txt 2>&1; echo "1024 rc=$? $(date +%T)"
for t in a b; do
timeout 70 python3 benchmarks/bench.py --n 4096 --d 64 --causal false --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/again_$t.csv > $R/again_$t.txt 2>&1; echo "again $t rc=$? $(date +%T)"
done
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/run_1024.txt $R/again_*.txt | cut -c1-110
cd $OUT && tar czf C.tgz C && rm -rf C
