# Session 2026-12-07 (sixth), call P: the attention GPU tests at HEAD (a6a7f1b's refactor), then
# issue 37's E2 at 128 tokens (lab/run_o.sh, trimmed: Nsight Compute of p128s5 only; n128s6's is
# in NOTES e1-e3-ncu). Carry .whl build/dev-gpu/libpq2.so build/lab-e2/libpq2.so.
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python -m pytest -q -m gpu tests/runtime/test_mixer_kernels_gpu.py -k "attention or graph" -x -p no:cacheprovider > $OUT/tests.txt 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.txt
export PYQ2_LIBRARY=$PWD/build/lab-e2/libpq2.so
timeout 250 python lab/e1/probe_e1.py --fast --e2 --budget-s 200 --json $OUT/e2.json > $OUT/e2.txt 2>&1; echo "e2 rc $?"; tail -24 $OUT/e2.txt
for label in p128s5; do
  timeout 100 ncu --clock-control none --kernel-name regex:wgmma --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum' \
    python lab/e1/ncu_one.py $label > $OUT/ncu_$label.txt 2>&1; echo "$label rc $?"
  grep -E "Duration|SM Frequency|Issued Warp|Eligible Warps|inst_executed|Executed Ipc|local|stalled" $OUT/ncu_$label.txt | awk '$NF+0 > 0.1 || !/stalled/' | head -16
done
