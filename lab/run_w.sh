# Issue 36, call W (2026-12-07, seventh session): the consumer core unrolled over a whole chunk
# (compute 5 streamed, 6 alone) against today's loop (1, 2), with stalls of 0-3 us a matrix; then
# Nsight Compute on the unrolled core alone.
# Build: nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -Inative/src/cuda -Inative/include -o build/lab-ring-probe lab/seg/ring.cu
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 build/lab-ring-probe $OUT/ring.json fence > $OUT/ring.txt 2>&1; echo "ring rc $?"
grep -E "floor|reader|fsum" $OUT/ring.txt; awk '$1=="warp"' $OUT/ring.txt | head -80
M='smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg,gpc__cycles_elapsed.avg.per_second,regex:^smsp__average_warps_issue_stalled_(wait|math_pipe_throttle|short_scoreboard|not_selected|dispatch_stall)_per_issue_active\.ratio$,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active'
for cfg in "8 8 2 6 1" "16 4 3 6 1"; do
  echo "== nw chunk slots compute bar: $cfg"
  timeout 120 ncu --clock-control none -k regex:ring_warp --metrics "$M" build/lab-ring-probe x single $cfg > $OUT/ncu_${cfg// /_}.txt 2>&1
  grep -E "pct|ratio|sum|avg" $OUT/ncu_${cfg// /_}.txt | sed 's/  */ /g' | head -20
done
# then WR with whole chunks unrolled (th 2; bits checked equal), modes 3/0/2/7
# (carry also .whl build/dev-gpu/libpq2.so lab/seg/libseg.so)
source lab/dev.sh
export PYTHONUNBUFFERED=1
timeout 300 python lab/seg/probe_seg.py --which wr --rounds 3 --trios "8,8,0;8,4,1;16,4,0" --fms 2 --thermo 0,2 --modes 3,0,2,7 --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"; grep -v "^check" $OUT/wr.txt | tail -30; grep -i "fail" $OUT/wr.txt | head
