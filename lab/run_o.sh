# Session after 2026-12-07 (fifth), call O (issue 37, E2 at 128 tokens): build first with
# `bash lab/e2/build.sh` (about 10 min on 2 cores), carry .whl build/lab-e2/libpq2.so. Bits of
# p128s4/5/6 against n128s6, then times beside n128s6, p96s6 and cuBLAS (gate_up and down at
# M = 2048, gate_up at 512), then Nsight Compute of the best form.
source lab/dev.sh
export PYTHONUNBUFFERED=1
export PYQ2_LIBRARY=$PWD/build/lab-e2/libpq2.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 330 python lab/e1/probe_e1.py --fast --e2 --budget-s 250 --json $OUT/e2.json > $OUT/e2.txt 2>&1; echo "e2 rc $?"; tail -24 $OUT/e2.txt
for label in p128s5 n128s6; do
  timeout 90 ncu --clock-control none --kernel-name regex:wgmma --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum' \
    python lab/e1/ncu_one.py $label > $OUT/ncu_$label.txt 2>&1; echo "$label rc $?"
  grep -E "Duration|SM Frequency|Issued Warp|Eligible Warps|inst_executed|Executed Ipc|local|stalled" $OUT/ncu_$label.txt | awk '$NF+0 > 0.1 || !/stalled/' | head -16
done
