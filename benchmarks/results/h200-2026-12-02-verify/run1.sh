#!/usr/bin/env bash
# device call 1 (2026-12-02): host profile of the drop-in, ncu of decode and of the tc backward (fp16 vs bf16),
# then GPU correctness of the non-finite changes (test matrix + fuzz on the GPU, gpu tiers), sanitizers
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/c1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
t0=$SECONDS
timeout 90 python3 benchmarks/dropin_overhead.py --csv $O/dropin.csv --profile $O/dropin_prof.txt > $O/dropin.txt 2>&1; echo "dropin rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 100 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats --section Occupancy python3 benchmarks/ncu_probe.py decode > $O/ncu_decode.txt 2>&1; echo "ncu decode rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 150 ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats python3 benchmarks/ncu_probe.py tc128 tc128bf > $O/ncu_tc128.txt 2>&1; echo "ncu tc rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(timeout 330 python3 -m pytest -n 8 -v -p no:cacheprovider tests/test_kernels.py tests/test_fuzz.py > $O/tests_matrix.txt 2>&1; echo "rc=$?" >> $O/tests_matrix.txt) &
(timeout 330 python3 -m pytest -n 3 -v -m gpu -p no:cacheprovider tests/test_flash1.py tests/test_flash2.py tests/test_flash2_fast.py tests/test_standard.py tests/test_decode.py > $O/tests_gpu.txt 2>&1; echo "rc=$?" >> $O/tests_gpu.txt) &
(timeout 330 python3 benchmarks/sanitize.py --matrix $O/san_mem --quick --tools memcheck --kernels standard flash1 flash2 flash2_fast > $O/san_mem.txt 2>&1; echo "rc=$?" >> $O/san_mem.txt) &
(timeout 330 python3 benchmarks/sanitize.py --matrix $O/san_init --quick --tools initcheck --kernels standard flash2_fast-atomic flash2_tc flash2_tc-atomic > $O/san_init.txt 2>&1; echo "rc=$?" >> $O/san_init.txt) &
(for t in synccheck initcheck racecheck; do timeout 150 compute-sanitizer --tool $t --error-exitcode 9 python3 benchmarks/decode_sanitize.py --small > $O/decode_$t.txt 2>&1; echo "rc=$?" >> $O/decode_$t.txt; done) &
wait; echo "correctness $((SECONDS-t0)) s"
tail -1 $O/tests_matrix.txt; grep -E "passed|failed" $O/tests_matrix.txt | tail -2; grep -E "passed|failed" $O/tests_gpu.txt | tail -2
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" $O/decode_*.txt; tail -4 $O/san_mem.txt $O/san_init.txt
cat $O/dropin.csv; grep -E "Duration|^  [a-z_]+.*\(" $O/ncu_decode.txt | head -20
cd ${OUT:-/tmp/out} && tar czf c1.tgz c1 && rm -rf c1
