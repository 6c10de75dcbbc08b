#!/bin/bash
# session 9, call A: forward with P V on the tensor cores (first build, commit in commit.txt): timed against the
# CUDA-core path; GPU tests
R=$OUT/A; mkdir -p $R
cp .wt/commit.txt $R/commit.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 200 python3 benchmarks/forward_mma.py --shapes 4096x64x32 4096x128x32 1024x64x32 --csv $R/forward_mma.csv > $R/forward_mma.txt 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_flash2_fast.py tests/test_reliability.py tests/test_gqa.py -k "flash2_fast or gpu" > $R/pytest.txt 2>&1
