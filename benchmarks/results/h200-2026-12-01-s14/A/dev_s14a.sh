#!/bin/bash
# session 14, call A: S^T and dP^T in separate warps of the dK/dV kernel (commit.txt) against main (commit_old.txt):
# racecheck, bit-for-bit outputs against the old tree, backward at d = 64, 128 alternating; d = 64 atomic capped at 168
R=$OUT/A; mkdir -p $R; cp .wt/commit.txt .wt/commit_old.txt .wt/dev_s14a.sh .wt/race_split.py .wt/bits.py .wt/bs_cap.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard python3 .wt/race_split.py > $R/racecheck.txt 2>&1; echo "racecheck rc=$? $(date +%T)"; tail -n 3 $R/racecheck.txt
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 .wt/bits.py $R/new.npz > $R/bits_new.txt 2>&1; echo "bits new rc=$?"
PYTHONPATH=/tmp/site:$PWD/.wt/t_old timeout 60 python3 .wt/bits.py $R/old.npz > $R/bits_old.txt 2>&1; echo "bits old rc=$?"
python3 -c "
import numpy as np; a = np.load('$R/new.npz'); b = np.load('$R/old.npz'); diff = [k for k in a.files if not np.array_equal(a[k], b[k], equal_nan=True)]
print(len(a.files), 'arrays,', len(diff), 'differ:', diff[:12])" | tee $R/bits.txt
rm -f $R/*.npz
run() { # tree tag d blocks...
  t=$1; tag=$2; shift 2
  PYTHONPATH=/tmp/site:$t timeout 100 python3 benchmarks/block_sweep.py --repeats 10 --csv $R/$tag.csv "$@" > $R/$tag.txt 2>&1
  echo "$tag rc=$? $(date +%T)"; grep -hE "^ +[0-9]+ backward" $R/$tag.txt | sed "s/^/$tag /"
}
run $PWD new64a --d 64 --bwd 32x32 32x64; run $PWD/.wt/t_old old64 --d 64 --bwd 32x32 32x64; run $PWD new64b --d 64 --bwd 32x32 32x64
PYTHONPATH=/tmp/site:$PWD timeout 60 python3 .wt/bs_cap.py --d 64 --bwd 32x64 --repeats 10 --csv $R/cap64.csv > $R/cap64.txt 2>&1; echo "cap64 rc=$?"; grep -hE "^ +[0-9]+ backward" $R/cap64.txt | sed "s/^/cap64 /"
run $PWD new128a --d 128 --bwd 32x32; run $PWD/.wt/t_old old128 --d 128 --bwd 32x32
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cd $OUT && tar czf A.tgz A && rm -rf A
