#!/bin/bash
# session 11, call D: the harness at d = 32 on the shipped rule (32 x 64 atomic block at d <= 64); d = 16, 48 atomic
# blocks (information); host time again (C's host ran ~30% slow on untouched paths); GPU tests of the atomic path
R=$OUT/D; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s11d.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 40 python3 benchmarks/host_overhead.py --kernels flash2_fast flash2 --csv $R/host.csv > $R/host.txt 2>&1; echo "host rc=$? $(date +%T)"
timeout 100 python3 benchmarks/bench.py --n 4096 --d 32 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_4096_d32.csv > $R/run_4096_d32.txt 2>&1; echo "4096 d32 rc=$? $(date +%T)"
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py -k "atomic" > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -2 $R/pytest.txt
timeout 70 python3 benchmarks/block_sweep.py --d 16 48 --bwd 32x32 32x64 --repeats 5 --csv $R/sweep16_48.csv > $R/sweep16_48.txt 2>&1; echo "sweep rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/run_*.txt | cut -c1-100; cat $R/host.txt; grep -h "atomic" $R/sweep16_48.txt
cd $OUT && tar czf D.tgz D && rm -rf D
