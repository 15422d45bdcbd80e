# Session after 2026-12-07 (fourth), call J (issue 37): Nsight Compute of today's narrow 128 block
# and the best E1 and E3 forms, gate_up M = 2048 (carry build/lab-e1/libpq2.so .whl): IPC, issue
# active, stall reasons, tensor pipe, and the SM clock.
source lab/dev.sh
export PYTHONUNBUFFERED=1
export PYQ2_LIBRARY=$PWD/build/lab-e1/libpq2.so
for label in n128s6 e128s6u7 e128s6u14 n128s6u12; do
  timeout 100 ncu --clock-control none --kernel-name regex:wgmma --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum \
    python lab/e1/ncu_one.py $label > $OUT/ncu_$label.txt 2>&1; echo "$label rc $?"
  grep -E "Duration|SM Frequency|Issued Warp|Eligible Warps|No Eligible|gmma_cycles|inst_executed|Stall (Long|Short|Wait|Barrier|Math|Not Sel|Dispatch|GMMA)|Executed Ipc" $OUT/ncu_$label.txt | head -16
done
