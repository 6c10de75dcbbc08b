#!/bin/bash
# session 15, call D: the committed harness run at commit.txt (every kernel as in A): host time of one call (N = 128),
# N = 4096 (d = 32, 64, 80, 96, 128, fwd and fwd+bwd, causal both, every peer), N = 1024; GPU tests of flash2_fast
R=$OUT/D; mkdir -p $R; cp .wt/commit.txt .wt/dev_s15d.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv > $R/smi.csv
timeout 50 python3 benchmarks/host_overhead.py --kernels flash2_fast flash2 --csv $R/host.csv > $R/host.txt 2>&1; echo "host rc=$? $(date +%T)"
timeout 290 python3 benchmarks/bench.py --n 4096 --d 32 64 80 96 128 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_4096.csv > $R/run_4096.txt 2>&1; echo "4096 rc=$? $(date +%T)"
timeout 80 python3 benchmarks/bench.py --n 1024 --d 64 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_1024.csv > $R/run_1024.txt 2>&1; echo "1024 rc=$? $(date +%T)"
timeout 140 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py -k "not backward and not atomic and not split and not share" > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
tail -2 $R/pytest.txt; grep "^torch" $R/host.txt; grep -h "^flash2_fast\|^torch" $R/run_*.txt | cut -c1-110
cd $OUT && tar czf D.tgz D && rm -rf D
