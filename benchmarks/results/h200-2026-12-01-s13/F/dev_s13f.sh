#!/bin/bash
# session 13, call F: P and dS in one shared tile at d = 128 (commit.txt) against two tiles (commit_old.txt):
# racecheck, GPU tests at d = 128, backward at d = 128 alternating, forced copies of dQ
R=$OUT/F; mkdir -p $R; cp .wt/commit.txt .wt/commit_old.txt .wt/dev_s13f.sh .wt/race128.py .wt/copies128.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard python3 .wt/race128.py > $R/racecheck.txt 2>&1; echo "racecheck rc=$? $(date +%T)"; tail -n 3 $R/racecheck.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash2_fast.py -k "128 or share or atomic" > $R/pytest.txt 2>&1; echo "pytest rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -n 2 $R/pytest.txt
run() { # tree tag
  PYTHONPATH=/tmp/site:$1 timeout 100 python3 benchmarks/block_sweep.py --d 128 --bwd 32x32 --repeats 10 --csv $R/$2.csv > $R/$2.txt 2>&1
  echo "$2 rc=$? $(date +%T)"; grep -hE "^ +128 " $R/$2.txt | sed "s/^/$2 /"
}
run $PWD new1; run $PWD/.wt/t_old old1; run $PWD new2
timeout 90 python3 .wt/copies128.py 8 12 16 0 > $R/copies.txt 2>&1; echo "copies rc=$? $(date +%T)"; grep "^d = " $R/copies.txt
for f in $R/*.txt; do sed -i "/NumbaPerformanceWarning\|warn(errors/d" $f; done
cd $OUT && tar czf F.tgz F && rm -rf F
