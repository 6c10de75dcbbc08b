#!/bin/bash
# session 9, call E: main (forward experiments reverted) with the test fixes: whole test files on the GPU
R=$OUT/E; mkdir -p $R; cp .wt/commit.txt $R/commit.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 400 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_flash2_fast.py tests/test_reliability.py tests/test_smem.py tests/test_gqa.py > $R/pytest.txt 2>&1; echo "pytest rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt
grep "^FAILED\|passed\|failed" $R/pytest.txt | tail -12
grep -B5 "^E  " $R/pytest.txt | grep -v "^--$" | head -40
cd $OUT && tar czf E.tgz E && rm -rf E
