#!/usr/bin/env bash
# device call 1 (2026-12-02, second session): waves of the flash2_tc backward (B*H 24..40), standard's float16
# backward per launch, decode's L2 prefetch and stage variants at 32k / 128k, GPU tests of decode and standard
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/s1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
git log -1 --format=%H > $O/commit.txt 2>/dev/null
t0=$SECONDS
timeout 150 python3 benchmarks/kernel_times.py --n 4096 --bh 24 32 36 40 --d 64 --dtype float16 --kernels flash2_tc --repeats 5 > $O/kt_tc64.txt 2>&1; echo "kt tc rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 100 python3 benchmarks/kernel_times.py --n 4096 --bh 32 --d 64 --dtype float16 --kernels standard --repeats 5 > $O/kt_std64.txt 2>&1; echo "kt std rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 150 python3 -m flash_numba.tools.bench_decode --n 32768 131072 --count --repeats 10 --kernels flash_decode flash_decode-pf1 flash_decode-pf2 flash_decode-pf4 flash_decode-paged flash_decode-paged-pf2 flash_decode-st3 flash_decode-st4 flash_decode-st3-pf2 torch-flash --csv $O/decode_a.csv > $O/decode_a.txt 2>&1; echo "decode a rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 100 python3 -m flash_numba.tools.bench_decode --n 32768 --count --repeats 10 --kernels flash_decode-pf2 flash_decode flash_decode-pf4 flash_decode-pf1 torch-flash --csv $O/decode_b.csv > $O/decode_b.txt 2>&1; echo "decode b rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(timeout 200 python3 -m pytest -n 4 -q -p no:cacheprovider tests/test_decode.py > $O/tests_decode.txt 2>&1; echo "rc=$?" >> $O/tests_decode.txt) &
(timeout 200 python3 -m pytest -n 4 -q -m gpu -p no:cacheprovider tests/test_standard.py tests/test_standard_tc.py > $O/tests_std.txt 2>&1; echo "rc=$?" >> $O/tests_std.txt) &
wait; echo "tests $((SECONDS-t0)) s"
cat $O/kt_tc64.txt $O/kt_std64.txt | grep -v "^$" | tail -40
grep -E "flash_decode|torch" $O/decode_a.txt | head -40; grep -E "flash_decode|torch" $O/decode_b.txt | head -12
tail -2 $O/tests_decode.txt $O/tests_std.txt
cd ${OUT:-/tmp/out} && tar czf s1.tgz s1 && rm -rf s1
