#!/usr/bin/env bash
# device run 1: ncu of flash2_tc fwd/bwd and decode; decode bench at the current rule; racecheck of tc backward; GPU tests
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
git log -1 --format=%H >> $O/gpu.txt 2>/dev/null
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats"
t0=$SECONDS
timeout 200 ncu --profile-from-start off $SECS python3 benchmarks/ncu_probe.py tc64 tc128 decode > $O/ncu.txt 2>&1; echo "ncu rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 120 python3 -m flash_numba.tools.bench_decode --n 4096 32768 131072 --splits 6 8 12 --kernels flash_decode flash_decode-t4 flash_decode-s6 flash_decode-s8 flash_decode-s12 torch-flash --csv $O/decode.csv > $O/decode.txt 2>&1; echo "decode rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 40 python3 benchmarks/tc_backward.py /tmp/san --sanitize > $O/racecheck.txt 2>&1; echo "racecheck rc=$? $((SECONDS-t0)) s"
t0=$SECONDS
timeout 200 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider tests/test_streams.py tests/test_launch_plan.py tests/test_torch.py tests/test_reliability.py tests/test_flash2_tc_backward.py tests/test_decode.py > $O/gpu_tests.txt 2>&1; echo "tests rc=$? $((SECONDS-t0)) s"
tail -3 $O/gpu_tests.txt; grep -i "summary\|hazard" $O/racecheck.txt | tail -5; tail -25 $O/decode.txt
