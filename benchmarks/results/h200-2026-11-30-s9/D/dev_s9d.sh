#!/bin/bash
# session 9, call D: forward with K/V loaded in quads (conflict-free transposed stores) against the one before,
# alternating, then the harness (head-dim sweep, fwd) and the GPU tests
R=$OUT/D; mkdir -p $R; cp .wt/commit.txt $R/commit.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
B="--n 4096 --d 64 128 --causal both --pass fwd --repeats 20 --peak 62 --kernels flash2_fast torch-efficient"
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD timeout 100 python3 benchmarks/bench.py $B --csv $R/after_$i.csv > $R/after_$i.txt 2>&1; echo "after $i rc=$? $(date +%T)"
  PYTHONPATH=/tmp/site:$PWD/.wt/before timeout 100 python3 benchmarks/bench.py $B --csv $R/before_$i.csv > $R/before_$i.txt 2>&1; echo "before $i rc=$? $(date +%T)"
done
timeout 100 python3 benchmarks/bench.py --n 4096 1024 --d 32 96 --causal false --pass fwd --repeats 10 --peak 62 --kernels flash2_fast --csv $R/sweep.csv > $R/sweep.txt 2>&1; echo "sweep rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -h "^flash2_fast\|^torch" $R/after_*.txt $R/before_*.txt $R/sweep.txt | cut -c1-110
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py tests/test_smem.py tests/test_gqa.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_reliability.py -k flash2_fast > $R/pytest_rel.txt 2>&1; echo "pytest rel rc=$? $(date +%T)"
for f in $R/pytest*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
tail -4 $R/pytest.txt; tail -6 $R/pytest_rel.txt
cd $OUT && tar czf D.tgz D && rm -rf D
