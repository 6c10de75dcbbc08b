#!/bin/bash
# session 14, call C: S^T/dP^T split by the rule (commit.txt): GPU tests of flash2_fast's backward; the committed
# harness run: N = 4096, d = 32, 64, 80, 96, 128, fwd and fwd+bwd, causal both, every peer; N = 1024
R=$OUT/C; mkdir -p $R; cp .wt/commit.txt .wt/dev_s14c.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py -k "backward or atomic or split or share" > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -3 $R/pytest.txt
timeout 300 python3 benchmarks/bench.py --n 4096 --d 32 64 80 96 128 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_4096.csv > $R/run_4096.txt 2>&1; echo "4096 rc=$? $(date +%T)"
timeout 70 python3 benchmarks/bench.py --n 1024 --d 64 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_1024.csv > $R/run_1024.txt 2>&1; echo "1024 rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/run_*.txt | cut -c1-110
cd $OUT && tar czf C.tgz C && rm -rf C
