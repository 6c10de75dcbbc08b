#!/bin/bash
# session 11, call B: flat dQ with RED at constant offsets (flat), with/without a 168-register cap for the dynamic
# atomic build (flat/flatu), against main; d = 64 backward blocks 32x32 and 32x64, alternating twice; GPU tests
R=$OUT/B; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s11b.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
for i in 1 2; do
  for t in main flat flatu; do
    PYTHONPATH=/tmp/site:$PWD/.wt/t_$t timeout 150 python3 benchmarks/block_sweep.py --d 64 --bwd 32x32 32x64 --repeats 10 --csv $R/${t}_$i.csv > $R/${t}_$i.txt 2>&1; echo "$t $i rc=$? $(date +%T)"
  done
done
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
for t in main flat flatu; do echo "== $t"; grep -h "backward" $R/${t}_*.txt | cut -c1-80 | sort -k3,5 ; done
PYTHONPATH=/tmp/site:$PWD/.wt/t_flat timeout 240 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py tests/test_vec.py tests/test_gqa.py tests/test_strides.py tests/test_dropout.py tests/test_reliability.py tests/test_torch.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -4 $R/pytest.txt
cd $OUT && tar czf B.tgz B && rm -rf B
