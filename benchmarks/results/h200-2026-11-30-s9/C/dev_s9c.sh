#!/bin/bash
# session 9, call C: Nsight Compute, the forward with P V on CUDA cores and on tensor cores (64x32, d = 64)
R=$OUT/C; mkdir -p $R; cp .wt/commit.txt $R/commit.txt
timeout 400 ncu --clock-control none --kernel-name regex:^kernel --launch-skip 1 --launch-count 3 --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis_Tables python3 .wt/ncu_fwd.py > $R/ncu.txt 2> $R/ncu.err; echo "ncu rc=$? $(date +%T)"
tail -3 $R/ncu.err
grep -E "^\s+(Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc A|No Eligible|Stall|Warp Cycles Per Issued|Block Limit|Dynamic Shared|Avg. Active Threads|Compute \(SM\) Throughput|Memory Throughput|One or More|Executed Instructions )|kernel|Bank|conflict" $R/ncu.txt | head -120
cd $OUT && tar czf C.tgz C && rm -rf C
