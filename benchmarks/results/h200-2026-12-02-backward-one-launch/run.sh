#!/usr/bin/env bash
# device call 2 (2026-12-02, second session): flash2_tc's backward in one launch (branch tcfuse, .wt/tcfuse) against
# main's two launches: times (tc_backward --times, both, twice), errors and determinism of the new one, kernel times
# at B*H 24..40, GPU tests and sanitizers of the new one
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/s2; mkdir -p $O
ROOT=$PWD; NEW=$PWD/.wt/tcfuse; [ -d $NEW/flash_numba ] || { echo "no .wt/tcfuse"; exit 3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
t0=$SECONDS
(cd $NEW && PYTHONPATH=$NEW timeout 150 python3 benchmarks/tc_backward.py $O/new_tcb > $O/new_tcb.txt 2>&1); echo "new tcb rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(cd $ROOT && PYTHONPATH=$ROOT timeout 100 python3 benchmarks/tc_backward.py $O/old_tcb --times > $O/old_tcb.txt 2>&1); echo "old tcb rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(cd $NEW && PYTHONPATH=$NEW timeout 100 python3 benchmarks/tc_backward.py $O/new_tcb2 --times > $O/new_tcb2.txt 2>&1); echo "new tcb2 rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(cd $NEW && PYTHONPATH=$NEW timeout 100 python3 benchmarks/kernel_times.py --n 4096 --bh 24 32 36 40 --d 64 --dtype float16 --kernels flash2_tc --repeats 5 > $O/kt_new.txt 2>&1); echo "kt new rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
cd $NEW; export PYTHONPATH=$NEW
(timeout 200 python3 -m pytest -n 4 -q -p no:cacheprovider tests/test_flash2_tc_backward.py tests/test_flash2_tc.py tests/test_spec.py > $O/tests_tc.txt 2>&1; echo "rc=$?" >> $O/tests_tc.txt) &
(timeout 200 python3 -m pytest -n 4 -q -p no:cacheprovider tests/test_kernels.py tests/test_fuzz.py tests/test_torch.py -k "flash2_tc or tc or torch" > $O/tests_matrix.txt 2>&1; echo "rc=$?" >> $O/tests_matrix.txt) &
(timeout 200 python3 benchmarks/sanitize.py --matrix $O/san --quick --tools memcheck racecheck initcheck synccheck --kernels flash2_tc > $O/san.txt 2>&1; echo "rc=$?" >> $O/san.txt) &
wait; echo "correctness $((SECONDS-t0)) s"
grep -E "worst|d=64|d=128|deterministic" $O/new_tcb.txt; grep -E "^d=" $O/old_tcb.txt $O/new_tcb2.txt
grep -v "^$" $O/kt_new.txt | tail -13
tail -n 2 $O/tests_tc.txt; tail -n 2 $O/tests_matrix.txt; tail -n 6 $O/san.txt
cd ${OUT:-/tmp/out} && tar czf s2.tgz s2 && rm -rf s2
