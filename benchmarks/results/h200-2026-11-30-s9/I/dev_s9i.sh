#!/bin/bash
# session 9, call I: more test files run whole on the GPU (verbose: a partial run still reports)
R=$OUT/I; mkdir -p $R; cp .wt/commit.txt $R/commit.txt
timeout 290 python3 -m pytest -v -p no:cacheprovider -n 12 --tb=line tests/test_api.py tests/test_torch.py tests/test_dropout.py tests/test_launch_plan.py tests/test_grids.py tests/test_causal.py > $R/pytest.txt 2>&1; echo "pytest rc=$? $(date +%T)"
sed -i "/NumbaPerformanceWarning\|warn(errors/d" $R/pytest.txt
echo "passed $(grep -c ' PASSED ' $R/pytest.txt) failed $(grep -c ' FAILED ' $R/pytest.txt) skipped $(grep -c ' SKIPPED ' $R/pytest.txt)"
grep " FAILED \|^E \|^/.*Error" $R/pytest.txt | head -30; tail -3 $R/pytest.txt
cd $OUT && tar czf I.tgz I && rm -rf I
