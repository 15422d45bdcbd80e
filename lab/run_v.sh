# Issue 36, call V (2026-12-07, seventh session): what binds the consumer core at ~41 cycles a unit an
# SM when it runs alone (ring probe compute 2: the product's core; 4: the thermometer core), and
# streamed (compute 1). Nsight Compute, pipes and stall reasons.
# Build: nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -Inative/src/cuda -Inative/include -o build/lab-ring-probe lab/seg/ring.cu
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
M='regex:^sm__inst_executed_pipe_[a-z_]+\.avg\.pct_of_peak_sustained_active$,regex:^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active\.ratio$,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.avg,gpc__cycles_elapsed.avg.per_second'
for cfg in "8 8 2 2 1" "8 8 2 4 1" "16 4 3 2 1" "8 8 3 1 1"; do
  echo "== nw chunk slots compute bar: $cfg"
  timeout 240 ncu --clock-control none -k regex:ring_warp --metrics "$M" build/lab-ring-probe x single $cfg > $OUT/ncu_${cfg// /_}.txt 2>&1
  grep -E "pct|ratio|sum|avg" $OUT/ncu_${cfg// /_}.txt | awk '{v=$NF; if (v+0 > 0.5 || $1 ~ /sum|cycles|per_second|warps_active|issue_active|throughput/) print}' | sed 's/  */ /g' | head -60
done
