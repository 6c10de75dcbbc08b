#!/bin/bash
# session 9, call H: test_smem whole on the GPU after its last change
R=$OUT/H; mkdir -p $R; cp .wt/commit.txt $R/commit.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_smem.py tests/test_flash2_fast.py -k "dynamic or block_choice or atomic_dq" > $R/pytest.txt 2>&1; echo "pytest rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -2 $R/pytest.txt
cd $OUT && tar czf H.tgz H && rm -rf H
