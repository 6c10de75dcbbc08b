#!/bin/bash
# session 15, call A on main (commit.txt; S^T/dP^T and dV/dK splits): racecheck, GPU tests of flash2_fast's backward,
# the committed harness run at N = 4096 (d = 32, 64, 80, 96, 128, fwd and fwd+bwd, causal both, every peer)
R=$OUT/A; mkdir -p $R; cp .wt/commit.txt .wt/dev_s15a.sh .wt/race_split.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 130 compute-sanitizer --tool racecheck --racecheck-report hazard python3 .wt/race_split.py > $R/racecheck.txt 2>&1; echo "racecheck rc=$? $(date +%T)"; tail -n 2 $R/racecheck.txt
timeout 140 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py -k "backward or atomic or split or share" > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -2 $R/pytest.txt
timeout 290 python3 benchmarks/bench.py --n 4096 --d 32 64 80 96 128 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-math torch-efficient --csv $R/run_4096.csv > $R/run_4096.txt 2>&1; echo "4096 rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/run_*.txt | cut -c1-110
