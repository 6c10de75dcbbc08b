#!/bin/bash
# session 9, call G: P^T stored swizzled (16-byte stores) against the forward before, alternating; forward GPU tests
R=$OUT/G; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/swz_bench.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
echo "tree,d,block,causal,ms" > $R/swz.csv
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD timeout 80 python3 .wt/swz_bench.py swizzled >> $R/swz.csv 2>> $R/swz.err
  PYTHONPATH=/tmp/site:$PWD/.wt/before timeout 80 python3 .wt/swz_bench.py before >> $R/swz.csv 2>> $R/swz.err
done
echo "bench $(date +%T)"; cat $R/swz.csv
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py -k forward > $R/pytest.txt 2>&1; echo "pytest rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -2 $R/pytest.txt
cd $OUT && tar czf G.tgz G && rm -rf G
