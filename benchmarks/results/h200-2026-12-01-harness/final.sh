#!/usr/bin/env bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O/b
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/b/gpu.txt
t=$SECONDS
timeout ${TT:-400} python3 .probe/driver.py $O/b ${STEPS:-tcb,bench_f16_d64,bench_f16_d128,bench_bf16,shares,dropin,gpt_sdpa,gpt_ours,generate}
echo "timing $((SECONDS-t)) s"; t=$SECONDS
(timeout ${TC:-150} python3 -m pytest -m gpu -n 3 -q -p no:cacheprovider ${TESTS:-tests/test_standard_tc.py tests/test_flash2_tc.py tests/test_mma.py tests/test_flash2_tc_backward.py} > $O/b/gpu_tests.txt 2>&1; echo "tests rc=$?" >> $O/b/gpu_tests.txt) &
p1=$!
(timeout ${TC:-150} python3 benchmarks/sanitize.py --matrix $O/b/san --quick --kernels ${SAN:-flash2_tc flash2_tc-atomic} > $O/b/sanitize.txt 2>&1; echo "sanitize rc=$?" >> $O/b/sanitize.txt) &
p2=$!
wait $p1 $p2; echo "correctness $((SECONDS-t)) s"
tail -2 $O/b/gpu_tests.txt; tail -6 $O/b/sanitize.txt
grep -h "worst ratio\|fwd+bwd det" $O/b/tcb.txt | head -5
cd $O && tar czf b.tgz b && rm -rf b
