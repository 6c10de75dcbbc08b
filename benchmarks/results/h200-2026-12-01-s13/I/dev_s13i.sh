#!/bin/bash
# session 13, call I: lesson 10's new GPU cell (the d = 128 atomic backward, P and dS in two tiles and one, twice),
# then lesson 10 whole on the GPU
R=$OUT/I; mkdir -p $R; cp .wt/commit.txt .wt/dev_s13i.sh .wt/cell10.py $R/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $R/smi.csv
timeout 70 python3 .wt/cell10.py > $R/cell10.txt 2>&1; echo "cell rc=$? $(date +%T)"; grep -v Warn $R/cell10.txt | grep -v "warn(" | tail -5
timeout 100 python3 lessons/_src/10_in_practice.py > $R/lesson10.txt 2>&1; echo "lesson rc=$? $(date +%T)"; grep -A3 "P and dS in\|blocks an SM" $R/lesson10.txt | grep -v "warn" | head -12; tail -n 2 $R/lesson10.txt
cd $OUT && tar czf I.tgz I && rm -rf I
