#!/bin/bash
# session 9, call B: forward with P V on the tensor cores: timed against the CUDA-core path; GPU tests
R=$OUT/B; mkdir -p $R
cp .wt/commit.txt $R/commit.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 200 python3 benchmarks/forward_mma.py --shapes 4096x64x32 1024x64x32 --blocks chosen 64x32 --csv $R/forward_mma.csv > $R/forward_mma.txt 2>&1; echo "bench rc=$? $(date +%T)"
cat $R/forward_mma.txt | grep -v Warn
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_flash2_fast.py tests/test_reliability.py tests/test_gqa.py -k "flash2_fast or gpu" > $R/pytest.txt 2>&1; echo "pytest rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
tail -15 $R/pytest.txt
cd $OUT && tar czf B.tgz B && rm -rf B
