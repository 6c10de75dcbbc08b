#!/bin/bash
# session 14, call D: dV and dK split across warps too (commit.txt), against not: bit for bit, backward at d = 64
R=$OUT/D; mkdir -p $R; cp .wt/commit.txt .wt/dev_s14d.sh .wt/bits_kv.py .wt/bs_kv.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 100 python3 .wt/bits_kv.py > $R/bits.txt 2>&1; echo "bits rc=$? $(date +%T)"; tail -n 1 $R/bits.txt
run() { # tag kv split args...
  tag=$1; kv=$2; s=$3; shift 3
  KV=$kv SPLIT=$s timeout 60 python3 .wt/bs_kv.py --repeats 10 --csv $R/$tag.csv "$@" > $R/$tag.txt 2>&1
  echo "$tag rc=$? $(date +%T)"; grep -hE "^ +[0-9]+ backward" $R/$tag.txt | sed "s/^/$tag /"
}
run kv1a 1 "" --d 64 --bwd 32x64; run kv0 0 "" --d 64 --bwd 32x64; run kv1b 1 "" --d 64 --bwd 32x64
run both32 1 1 --d 64 --bwd 32x32
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cd $OUT && tar czf D.tgz D && rm -rf D
