#!/bin/bash
# session 12, call F: figure 6 regenerated on the H200 (main at commit.txt)
R=$OUT/F; mkdir -p $R/out; cp .wt/commit.txt .wt/dev_s12f.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 330 python3 figures/make_all.py --only 6 --out $R/out > $R/make_all.txt 2>&1; echo "figures rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/make_all.txt; tail -15 $R/make_all.txt; ls -la $R/out
cd $OUT && tar czf F.tgz F && rm -rf F
