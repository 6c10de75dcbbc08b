#!/bin/bash
# session 10, call B: keys16 (scalar K/V loads), keys16v (16-byte global loads), keys16s (and 16-byte shared
# stores), alternating twice; then forward block sweeps with keys16s at d = 64 and 128
R=$OUT/B; mkdir -p $R; cp .wt/commit.txt $R/commit.txt; cp .wt/dev_s10b.sh $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
B="--n 4096 --d 64 128 --causal both --pass fwd --repeats 20 --peak 62 --kernels flash2_fast torch-efficient"
for i in 1 2; do
  for t in keys16 keys16v keys16s; do
    PYTHONPATH=/tmp/site:$PWD/.wt/t_$t timeout 100 python3 benchmarks/bench.py $B --csv $R/${t}_$i.csv > $R/${t}_$i.txt 2>&1; echo "$t $i rc=$? $(date +%T)"
  done
done
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
for t in keys16 keys16v keys16s; do echo "== $t"; grep -h "^flash2_fast\|^torch" $R/${t}_*.txt | cut -c1-100; done
PYTHONPATH=/tmp/site:$PWD/.wt/t_keys16s timeout 200 python3 benchmarks/block_sweep.py --d 64 128 --fwd 64x32 64x48 64x64 --repeats 20 --csv $R/sweep.csv > $R/sweep.txt 2>&1; echo "sweep rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/sweep.txt; cat $R/sweep.txt | cut -c1-150
cd $OUT && tar czf B.tgz B && rm -rf B
