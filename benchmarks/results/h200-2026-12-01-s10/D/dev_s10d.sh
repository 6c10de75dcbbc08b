#!/bin/bash
# session 10, call D: bwdq (dK/dV kernel with queries 16 apart, row-major Q/dO, quad columns; forward O in quads at
# TD = 8) against main2, alternating twice, fwd and fwd+bwd; d = 32, 96 once each; GPU tests of bwdq
R=$OUT/D; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s10d.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
B="--n 4096 --d 64 128 --causal both --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic"
for i in 1 2; do
  for t in main2 bwdq; do
    PYTHONPATH=/tmp/site:$PWD/.wt/t_$t timeout 150 python3 benchmarks/bench.py $B --csv $R/${t}_$i.csv > $R/${t}_$i.txt 2>&1; echo "$t $i rc=$? $(date +%T)"
  done
done
for t in main2 bwdq; do
  PYTHONPATH=/tmp/site:$PWD/.wt/t_$t timeout 150 python3 benchmarks/bench.py --n 4096 --d 32 96 --causal false --pass both --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic --csv $R/${t}_d32_d96.csv > $R/${t}_d32_d96.txt 2>&1; echo "$t d32/96 rc=$? $(date +%T)"
done
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
for t in main2 bwdq; do echo "== $t"; grep -h "^flash2_fast" $R/${t}_*.txt | cut -c1-90; done
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py tests/test_smem.py tests/test_gqa.py tests/test_strides.py tests/test_causal.py tests/test_dropout.py tests/test_vec.py tests/test_reliability.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -4 $R/pytest.txt
cd $OUT && tar czf D.tgz D && rm -rf D
