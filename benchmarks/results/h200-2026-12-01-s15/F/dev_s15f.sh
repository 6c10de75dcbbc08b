#!/bin/bash
# session 15, call F (commit.txt: dQ in two lane groups by layout.dq_lane_groups): GPU tests of the atomic and split
# paths; the committed harness run (N = 4096, N = 1024, host time). The folder is tarred after each step (8 files max,
# and a call cut short keeps what it had)
R=$OUT/F; mkdir -p $R; cp .wt/commit.txt .wt/dev_s15f.sh $R/
pack() { for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done; (cd $OUT && tar czf F.tgz F); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv > $R/smi.csv
timeout 80 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py -k "atomic or split" > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"; pack; tail -1 $R/pytest.txt
timeout 200 python3 benchmarks/bench.py --n 4096 --d 32 64 80 96 128 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_4096.csv > $R/run_4096.txt 2>&1; echo "4096 rc=$? $(date +%T)"; pack
timeout 60 python3 benchmarks/bench.py --n 1024 --d 64 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_1024.csv > $R/run_1024.txt 2>&1; echo "1024 rc=$? $(date +%T)"; pack
timeout 35 python3 benchmarks/host_overhead.py --kernels flash2_fast flash2 --csv $R/host.csv > $R/host.txt 2>&1; echo "host rc=$? $(date +%T)"; pack
grep "^torch" $R/host.txt; grep -h "^flash2_fast\|^torch" $R/run_*.txt | cut -c1-110
rm -rf $R
