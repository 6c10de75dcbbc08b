#!/bin/bash
# session 12, call B: host time of one call, launch plans before (ab3ab04, .wt/t_before) and after (commit.txt: ctypes
# launch, kept D), alternating twice; cProfile after; registers and blocks/SM of the backward launches (driver); GPU tests
R=$OUT/B; mkdir -p $R; cp .wt/commit.txt .wt/dev_s12b.sh .wt/occ.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
for i in 1 2; do
  for t in before after; do
    if [ $t = before ]; then P=/tmp/site:$PWD/.wt/t_before; else P=/tmp/site:$PWD; fi
    PYTHONPATH=$P timeout 60 python3 benchmarks/host_overhead.py --kernels flash2_fast flash2 --csv $R/host_${t}_$i.csv > $R/host_${t}_$i.txt 2>&1
    echo "host $t $i rc=$? $(date +%T)"; grep "^torch" $R/host_${t}_$i.txt
  done
done
timeout 60 python3 benchmarks/host_overhead.py --kernels flash2_fast --profile $R/host_profile_after.txt > /dev/null 2>&1; echo "profile rc=$?"
timeout 120 python3 .wt/occ.py > $R/occ.txt 2>&1; echo "occ rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/*.txt; cat $R/occ.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/ > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt; tail -4 $R/pytest.txt
cd $OUT && tar czf B.tgz B && rm -rf B
