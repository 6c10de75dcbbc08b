#!/usr/bin/env bash
# device call 3 (2026-12-02, second session): flash_decode at three blocks an SM (branch decode3, .wt/decode3)
# against main's two; the harness on main (flash2_tc's one-launch backward); decode3's GPU tests and sanitizers
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/s3; mkdir -p $O
ROOT=$PWD; NEW=$PWD/.wt/decode3; [ -d $NEW/flash_numba ] || { echo "no .wt/decode3"; exit 3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
git log -1 --format=%H > $O/commit.txt 2>/dev/null
DK="flash_decode flash_decode-s4 flash_decode-paged torch-flash"
t0=$SECONDS
(cd $NEW && PYTHONPATH=$NEW timeout 75 python3 -m flash_numba.tools.bench_decode --n 32768 65536 131072 --count --repeats 10 --kernels $DK --csv $O/decode_new1.csv > $O/decode_new1.txt 2>&1); echo "new1 rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(cd $ROOT && PYTHONPATH=$ROOT timeout 60 python3 -m flash_numba.tools.bench_decode --n 32768 65536 131072 --count --repeats 10 --kernels flash_decode torch-flash --csv $O/decode_old.csv > $O/decode_old.txt 2>&1); echo "old rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(cd $NEW && PYTHONPATH=$NEW timeout 60 python3 -m flash_numba.tools.bench_decode --n 32768 131072 --dtype bfloat16 float16 --count --repeats 10 --kernels flash_decode torch-flash --csv $O/decode_new2.csv > $O/decode_new2.txt 2>&1); echo "new2 rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(cd $ROOT && PYTHONPATH=$ROOT timeout 250 python3 .probe/driver.py $O/h bench_f16_d64,bench_f16_d128,bench_bf16 > $O/harness.txt 2>&1); echo "harness rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
cd $NEW; export PYTHONPATH=$NEW
(timeout 110 python3 -m pytest -n 4 -q -p no:cacheprovider tests/test_decode.py > $O/tests_decode.txt 2>&1; echo "rc=$?" >> $O/tests_decode.txt) &
for t in memcheck racecheck synccheck; do (timeout 100 compute-sanitizer --tool $t --error-exitcode 9 python3 benchmarks/decode_sanitize.py --small --d 128 > $O/decode_$t.txt 2>&1; echo "rc=$?" >> $O/decode_$t.txt) & done
wait; echo "correctness $((SECONDS-t0)) s"
grep -E "^flash_decode|^torch" $O/decode_new1.txt $O/decode_old.txt $O/decode_new2.txt | cut -c1-120
cat $O/harness.txt; grep -h "All results\|MISMATCH" $O/h/*.txt | head
tail -n 2 $O/tests_decode.txt; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" $O/decode_*.txt
cd ${OUT:-/tmp/out} && tar czf s3.tgz s3 && rm -rf s3
