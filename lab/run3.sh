# one call: the issue-36 segment prototype, then issue 37's E1/E3 (fast), then the step profile
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 python lab/seg/probe_seg.py --rounds 2 --json $OUT/seg.json > $OUT/seg.log 2>&1; echo "seg rc $?"
tail -40 $OUT/seg.log
bash lab/e1snap/run_e1.sh --fast --budget-s 110 > /dev/null 2>&1; echo "e1 rc $?"
tail -40 $OUT/e1.log
timeout 40 python lab/prof_step.py > $OUT/prof_step.log 2>&1; echo "prof rc $?"
grep -A12 "DecodeStep m=" $OUT/prof_step.log | head -14
