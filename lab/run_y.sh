# Issue 36 call X (lab/run_x.sh), then the batch-4 recurrence rerun (lab/gdn/probe_gdn.py) in the same call.
bash lab/run_x.sh 2>&1
source lab/dev.sh
PYTHONUNBUFFERED=1 timeout 170 python lab/gdn/probe_gdn.py --json $OUT/gdn.json > $OUT/gdn.txt 2>&1; echo "gdn rc $?"
tail -n 40 $OUT/gdn.txt
