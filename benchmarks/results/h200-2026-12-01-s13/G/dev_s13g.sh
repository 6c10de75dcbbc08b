#!/bin/bash
# session 13, call G: the forward at d = 128, 64 x 32 (76,800 bytes: three blocks in 228 KB, 168 registers) against
# the chosen 64 x 48 (97,792 bytes: two blocks), both orders
R=$OUT/G; mkdir -p $R; cp .wt/commit.txt .wt/dev_s13g.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 120 python3 benchmarks/block_sweep.py --d 128 --fwd 64x32 64x48 --repeats 10 --csv $R/fwd1.csv > $R/fwd1.txt 2>&1; echo "fwd1 rc=$? $(date +%T)"
timeout 120 python3 benchmarks/block_sweep.py --d 128 --fwd 64x48 64x32 --repeats 10 --csv $R/fwd2.csv > $R/fwd2.txt 2>&1; echo "fwd2 rc=$? $(date +%T)"
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
grep -hE "^ +128 " $R/fwd1.txt $R/fwd2.txt
cd $OUT && tar czf G.tgz G && rm -rf G
