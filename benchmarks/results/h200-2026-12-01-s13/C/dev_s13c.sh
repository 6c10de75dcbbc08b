#!/bin/bash
# session 13, call C: figures 1-4 (--quick, as session 4 made them) and 5 (ours now on PyTorch tensors) on the H200
R=$OUT/C; mkdir -p $R/out; cp .wt/commit.txt .wt/dev_s13c.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 150 python3 figures/make_all.py --only 5 --out $R/out > $R/make5.txt 2>&1; echo "fig5 rc=$? $(date +%T)"
timeout 380 python3 figures/make_all.py --quick --only 1 2 3 4 --out $R/out > $R/make14.txt 2>&1; echo "figs1-4 rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
tail -8 $R/make5.txt $R/make14.txt; ls $R/out
cd $OUT && tar czf C.tgz C && rm -rf C
