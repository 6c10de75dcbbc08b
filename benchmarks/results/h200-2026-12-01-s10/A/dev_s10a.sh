#!/bin/bash
# session 10, call A: the forward's three changes (fmax row max; keys tx+16b with K row-major and P^T stored
# 16 bytes; 16-byte K/V global loads) against main, alternating twice; then the GPU tests of the last
R=$OUT/A; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s10a.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
B="--n 4096 --d 64 128 --causal both --pass fwd --repeats 20 --peak 62 --kernels flash2_fast torch-efficient"
for i in 1 2; do
  for t in main fmax keys16 keys16v; do
    PYTHONPATH=/tmp/site:$PWD/.wt/t_$t timeout 100 python3 benchmarks/bench.py $B --csv $R/${t}_$i.csv > $R/${t}_$i.txt 2>&1; echo "$t $i rc=$? $(date +%T)"
  done
done
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
for t in main fmax keys16 keys16v; do echo "== $t"; grep -h "^flash2_fast\|^torch" $R/${t}_*.txt | cut -c1-110; done
timeout 260 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py tests/test_smem.py tests/test_gqa.py tests/test_strides.py tests/test_causal.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -8 $R/pytest.txt
cd $OUT && tar czf A.tgz A && rm -rf A
