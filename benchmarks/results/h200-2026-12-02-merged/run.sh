#!/usr/bin/env bash
# device call 2 (2026-12-02): main after the dropin, bf16bwd, decode and relia merges
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}/c2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; git log -1 --format=%H >> $O/gpu.txt 2>/dev/null
t0=$SECONDS
timeout 60 python3 benchmarks/dropin_overhead.py --csv $O/dropin.csv > $O/dropin.txt 2>&1; echo "dropin rc=$? $((SECONDS-t0)) s"
timeout 60 python3 -m flash_numba.examples.gpt train --attn flash_numba --autocast bfloat16 --steps 80 --csv $O/gpt_bf16_flash_numba.csv > $O/gpt_ours.txt 2>&1; echo "gpt ours rc=$? $((SECONDS-t0)) s"
timeout 60 python3 -m flash_numba.examples.gpt train --attn sdpa --autocast bfloat16 --steps 80 --csv $O/gpt_bf16_sdpa.csv > $O/gpt_sdpa.txt 2>&1; echo "gpt sdpa rc=$? $((SECONDS-t0)) s"
timeout 70 python3 -m flash_numba.tools.bench_decode --n 32768 131072 --kernels flash_decode flash_decode-paged torch-flash --csv $O/decode.csv > $O/decode.txt 2>&1; echo "decode rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
(timeout 170 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider tests/test_decode.py tests/test_torch.py tests/test_streams.py tests/test_launch_plan.py tests/test_flash2_tc_backward.py > $O/tests_gpu.txt 2>&1; echo "rc=$?" >> $O/tests_gpu.txt) &
(timeout 170 python3 -m pytest -n 4 -q -p no:cacheprovider tests/test_decode.py tests/test_fuzz.py -k "decode" > $O/tests_decode_small.txt 2>&1; echo "rc=$?" >> $O/tests_decode_small.txt) &
(for t in memcheck racecheck synccheck initcheck; do timeout 60 compute-sanitizer --tool $t --error-exitcode 9 python3 benchmarks/decode_sanitize.py --small > $O/decode_$t.txt 2>&1; echo "rc=$?" >> $O/decode_$t.txt; done) &
(for t in racecheck memcheck; do timeout 80 compute-sanitizer --tool $t --error-exitcode 9 python3 benchmarks/tc_backward.py /tmp/san_$t --sanitize > $O/tcbwd_$t.txt 2>&1; echo "rc=$?" >> $O/tcbwd_$t.txt; done) &
wait; echo "correctness $((SECONDS-t0)) s"
tail -2 $O/tests_gpu.txt; tail -2 $O/tests_decode_small.txt
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|^rc=" $O/decode_*.txt $O/tcbwd_*.txt | tr '\n' ' '; echo
cat $O/dropin.csv; tail -3 $O/gpt_ours.txt $O/gpt_sdpa.txt; grep -E "flash_decode|torch-flash" $O/decode.txt | tail -6
cd ${OUT:-/tmp/out} && tar czf c2.tgz c2 && rm -rf c2
