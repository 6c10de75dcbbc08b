#!/bin/bash
# session 15, call E (commit.txt: dQ in two groups of 16 lanes where that loads less, layout.dq_lane_groups): the
# backward at d = 64 (32 x 32 default, 32 x 64 atomic) with two groups, one, two, one
R=$OUT/E; mkdir -p $R; cp .wt/commit.txt .wt/dev_s15e.sh .wt/bs_dqg.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv > $R/smi.csv
for t in 2a 1a 2b 1b; do
  DQG=${t:0:1} timeout 60 python3 .wt/bs_dqg.py --d 64 --bwd 32x32 32x64 --repeats 10 --csv $R/g$t.csv > $R/g$t.txt 2>&1
  echo "g$t rc=$? $(date +%T)"; grep -hE "^ +[0-9]+ backward" $R/g$t.txt | sed "s/^/g$t /"
done
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cd $OUT && tar czf E.tgz E && rm -rf E
