#!/bin/bash
# session 11, call C: the committed harness run (main at .wt/commit.txt: the atomic backward's own 32 x 64 block at
# d = 64): N = 4096, d = 32, 64, 96, 128, fwd and fwd+bwd, every peer; N = 1024; host time (N = 128); the GPU tests
# of the changed paths; d = 32 atomic blocks (information)
R=$OUT/C; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s11c.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 280 python3 benchmarks/bench.py --n 4096 --d 32 64 96 128 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_4096.csv > $R/run_4096.txt 2>&1; echo "4096 rc=$? $(date +%T)"
timeout 60 python3 benchmarks/bench.py --n 1024 --d 64 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_1024.csv > $R/run_1024.txt 2>&1; echo "1024 rc=$? $(date +%T)"
timeout 40 python3 benchmarks/host_overhead.py --csv $R/host.csv > $R/host.txt 2>&1; echo "host rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/run_*.txt | cut -c1-100; tail -5 $R/host.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py tests/test_torch.py tests/test_api.py tests/test_launch_plan.py tests/test_spec.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -3 $R/pytest.txt
timeout 80 python3 benchmarks/block_sweep.py --d 32 --bwd 32x32 32x64 --repeats 10 --csv $R/sweep32.csv > $R/sweep32.txt 2>&1; echo "sweep32 rc=$? $(date +%T)"
grep -h "atomic" $R/sweep32.txt
cd $OUT && tar czf C.tgz C && rm -rf C
