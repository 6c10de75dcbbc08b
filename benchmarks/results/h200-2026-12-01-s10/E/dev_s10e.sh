#!/bin/bash
# session 10, call E: the committed harness run of the final kernels (branch bwd16 at .wt/commit.txt, merged after):
# N = 4096, d = 64 and 128, fwd and fwd+bwd, every peer; N = 1024; host time (N = 128)
R=$OUT/E; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s10e.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
export PYTHONPATH=/tmp/site:$PWD/.wt/t_bwdq
timeout 150 python3 benchmarks/bench.py --n 4096 --d 64 128 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_4096.csv > $R/run_4096.txt 2>&1; echo "4096 rc=$? $(date +%T)"
timeout 60 python3 benchmarks/bench.py --n 1024 --d 64 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_1024.csv > $R/run_1024.txt 2>&1; echo "1024 rc=$? $(date +%T)"
timeout 40 python3 benchmarks/host_overhead.py --csv $R/host.csv > $R/host.txt 2>&1; echo "host rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/run_*.txt | cut -c1-100; cat $R/host.txt | tail -5
cd $OUT && tar czf E.tgz E && rm -rf E
