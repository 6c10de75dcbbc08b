#!/bin/bash
# session 13, call B: the dK/dV kernel's warps as 4 x 8 threads (working tree, new) against 2 x 16 (commit.txt, old),
# alternating: backward blocks at d = 64 (32x64 atomic's, 32x32 deterministic's) and d = 128 (32x32, 16x64)
R=$OUT/B; mkdir -p $R; cp .wt/commit.txt .wt/dev_s13b.sh $R/; git diff > $R/new.diff
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
run() { # tree tag d blocks...
  local tree=$1 tag=$2 d=$3; shift 3
  PYTHONPATH=/tmp/site:$tree timeout 150 python3 .wt/sweep_wide.py --d $d --bwd "$@" --repeats 10 --csv $R/$tag.csv > $R/$tag.txt 2>&1
  echo "$tag rc=$? $(date +%T)"; grep -hE "^ +(64|128) " $R/$tag.txt | sed "s/^/$tag /"
}
run $PWD new1_64 64 32x64 32x32
run $PWD/.wt/t_old old1_64 64 32x64 32x32
run $PWD new1_128 128 32x32 16x64
run $PWD/.wt/t_old old1_128 128 32x32 16x64
run $PWD new2_64 64 32x64 32x32
run $PWD/.wt/t_old old2_64 64 32x64 32x32
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cd $OUT && tar czf B.tgz B && rm -rf B
