#!/bin/bash
# session 12, call C: host time of one call before (ab3ab04, .wt/t_before) and after (commit.txt: ctypes launch, kept D,
# the two-pass dQ kernel computing D), alternating twice; cProfile after; the two-pass backward's kernel time before/after;
# GPU tests of the changed paths
R=$OUT/C; mkdir -p $R; cp .wt/commit.txt .wt/dev_s12c.sh .wt/twopass.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
for i in 1 2; do
  for t in before after; do
    if [ $t = before ]; then P=/tmp/site:$PWD/.wt/t_before; else P=/tmp/site:$PWD; fi
    PYTHONPATH=$P timeout 60 python3 benchmarks/host_overhead.py --kernels flash2_fast flash2 --csv $R/host_${t}_$i.csv > $R/host_${t}_$i.txt 2>&1
    echo "host $t $i rc=$? $(date +%T)"; grep "^torch" $R/host_${t}_$i.txt
  done
done
timeout 60 python3 benchmarks/host_overhead.py --kernels flash2_fast --profile $R/host_profile_after.txt > /dev/null 2>&1; echo "profile rc=$?"
for t in before after; do
  if [ $t = before ]; then P=/tmp/site:$PWD/.wt/t_before; else P=/tmp/site:$PWD; fi
  PYTHONPATH=$P timeout 90 python3 .wt/twopass.py > $R/twopass_$t.txt 2>&1; echo "twopass $t rc=$?"; grep "^N=" $R/twopass_$t.txt
done
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_launch_plan.py tests/test_flash2_fast.py tests/test_api.py tests/test_torch.py tests/test_gqa.py tests/test_dropout.py tests/test_strides.py tests/test_smem.py > $R/pytest.txt 2>&1; echo "pytest gpu rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/*.txt; tail -4 $R/pytest.txt
cd $OUT && tar czf C.tgz C && rm -rf C
