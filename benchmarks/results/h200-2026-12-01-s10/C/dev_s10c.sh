#!/bin/bash
# session 10, call C: the dK/dV(/dQ) kernel with queries 16 apart and row-major Q/dO (bwd16; bwd16v adds 16-byte
# Q/dO loads) against main2 (this session's forward, the old backward), fwd+bwd, alternating twice; the GPU tests
# of bwd16v; Nsight Compute on the new forward (its shared-store conflicts)
R=$OUT/C; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s10c.sh .wt/ncu_fwd2.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
B="--n 4096 --d 64 128 --causal both --pass fwd+bwd --repeats 10 --peak 62 --kernels flash2_fast flash2_fast-atomic torch-efficient"
for i in 1 2; do
  for t in main2 bwd16 bwd16v; do
    PYTHONPATH=/tmp/site:$PWD/.wt/t_$t timeout 150 python3 benchmarks/bench.py $B --csv $R/${t}_$i.csv > $R/${t}_$i.txt 2>&1; echo "$t $i rc=$? $(date +%T)"
  done
done
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
for t in main2 bwd16 bwd16v; do echo "== $t"; grep -h "^flash2_fast\|^torch" $R/${t}_*.txt | cut -c1-100; done
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py tests/test_smem.py tests/test_gqa.py tests/test_strides.py tests/test_causal.py tests/test_dropout.py tests/test_vec.py tests/test_reliability.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -5 $R/pytest.txt
timeout 150 ncu --clock-control none --kernel-name regex:^kernel --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis_Tables python3 .wt/ncu_fwd2.py > $R/ncu.txt 2> $R/ncu.err; echo "ncu rc=$? $(date +%T)"
grep -E "^\s+(Duration|Achieved Occupancy|L1/TEX Cache|Compute \(SM\)|Issued Warp|Executed Instructions )|way bank" $R/ncu.txt
cd $OUT && tar czf C.tgz C && rm -rf C
