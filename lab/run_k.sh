# Session 2026-12-07 (fifth), call K (issue 35): Nsight Compute of the m = 16 ring kernels (lane and
# bulk, capped at 96 registers) against the register kernel, gate_up m = 16 (carry .whl
# build/lab-ring/libpq2.so build/lab-ring-lane/libpq2.so)
source lab/dev.sh
export PYTHONUNBUFFERED=1
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for spec in "lab-ring-lane 2 1 4" "lab-ring-lane 8 1 2" "lab-ring 2 1 4" "lab-ring 2 1 1"; do
  set -- $spec
  export PYQ2_LIBRARY=$PWD/build/$1/libpq2.so
  tag=$1-w$2u$3s$4
  timeout 90 ncu --clock-control none --kernel-name regex:rowblock --launch-skip 3 --launch-count 1 \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics "$M" \
    python lab/m16ring/ncu_ring.py $2 $3 $4 > $OUT/ncu_$tag.txt 2>&1; echo "== $tag rc $?"
  grep -E "  rowblock|stalled|Warp Cycles Per Issued|Issued Ipc|Eligible Warps|Active Warps Per|Registers Per|Duration|Achieved Occ|DRAM Through|L1/TEX Hit|Block Limit (Reg|Sha)|Dynamic Shared" $OUT/ncu_$tag.txt | awk '$NF+0 > 0.1 || !/stalled/' | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ +/ /g' | head -30
done
