#!/bin/bash
# session 11, call E: the split backward's dQ copies at d = 96 (12, chosen since session 10's register table, against
# 16, session 8's) and d = 80; the dK/dV/dQ kernel's registers as this device builds it
R=$OUT/E; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s11e.sh .wt/regs.py .wt/copies96.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 90 python3 .wt/regs.py > $R/regs.txt 2>&1; echo "regs rc=$? $(date +%T)"
timeout 90 python3 .wt/copies96.py > $R/copies.txt 2>&1; echo "copies rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cat $R/regs.txt $R/copies.txt | grep -v "^ *$" | tail -20
cd $OUT && tar czf E.tgz E && rm -rf E
