# Session 2026-12-07 (third), call A: E1/E3 timings (issue 37), then the whole model (issue 35).
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(export PYQ2_LIBRARY=$PWD/build/lab-e1/libpq2.so; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; \
 timeout -k 5 230 python3 lab/e1/probe_e1.py --json $OUT/e1.json --fast --budget-s 100 > $OUT/e1.log 2>&1); echo "e1 rc $?"
(cd $OUT && ls child-* >/dev/null 2>&1 && tar czf e1-children.tgz child-* && rm -f child-*)
grep -v "^check\|^bits" $OUT/e1.log | tail -40
source lab/dev.sh
timeout 200 python -m pyq2 bench --synthetic bonsai-2-27b --whole --json $OUT/whole.json > $OUT/whole.txt 2>&1; echo "whole rc $?"; tail -14 $OUT/whole.txt
