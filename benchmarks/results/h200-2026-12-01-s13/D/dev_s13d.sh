#!/bin/bash
# session 13, call D: figure 1 (flash2_fast counted at B*H itself) and figure 4 (flash2_fast's atomic backward drawn)
R=$OUT/D; mkdir -p $R/out; cp .wt/commit.txt .wt/dev_s13d.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 300 python3 figures/make_all.py --quick --only 1 4 --out $R/out > $R/make14.txt 2>&1; echo "figs rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/make14.txt; tail -n 8 $R/make14.txt; cat $R/out/fig4_memory.csv; grep flash2_fast $R/out/fig1_paper_table.md
cd $OUT && tar czf D.tgz D && rm -rf D
