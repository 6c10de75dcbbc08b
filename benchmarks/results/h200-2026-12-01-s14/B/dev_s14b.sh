#!/bin/bash
# session 14, call B: S^T/dP^T split across warps, as a build option (commit.txt): bit for bit against not, registers
# from the device's compiler, backward at d = 64, 80, 96 split forced on / off / by the rule
R=$OUT/B; mkdir -p $R; cp .wt/commit.txt .wt/dev_s14b.sh .wt/bits2.py .wt/bs_flag.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 200 python3 .wt/bits2.py > $R/bits.txt 2>&1; echo "bits rc=$? $(date +%T)"; grep -v "Warning\|warn(" $R/bits.txt | tail -n 40
run() { # tag split args...
  tag=$1; s=$2; shift 2
  SPLIT=$s timeout 100 python3 .wt/bs_flag.py --repeats 10 --csv $R/$tag.csv "$@" > $R/$tag.txt 2>&1
  echo "$tag rc=$? $(date +%T)"; grep -hE "^ +[0-9]+ backward" $R/$tag.txt | sed "s/^/$tag /"
}
run rule64 "" --d 64 --bwd 32x32 32x64; run on64 1 --d 64 --bwd 32x32 32x64; run off64 0 --d 64 --bwd 32x32 32x64
run on80 1 --d 80 --bwd 32x32; run off80 0 --d 80 --bwd 32x32
run on96 1 --d 96 --bwd 16x32; run off96 0 --d 96 --bwd 16x32
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cd $OUT && tar czf B.tgz B && rm -rf B
