# Session 2026-12-07 (fourth), call G: the m = 16 gate_up kernel with register ping-pong (stages 2), stall lines.
source lab/dev.sh
export PYTHONUNBUFFERED=1
export PYQ2_LIBRARY=$PWD/build/lab-m16/libpq2.so
timeout 150 ncu --clock-control none --kernel-name-base mangled --kernel-name regex:ILi2ELi2ELi1ELi16ELi2ELi0ELi2E --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \
  -o $OUT/m16s2 python3 tools/tune/tune_matmul.py --ms 16 --shapes gate_up --layouts tiles:2 --search rowblock --warps 2 --replays 3 > $OUT/ncu_s2.txt 2>&1
echo "ncu rc $?"
ncu --import $OUT/m16s2.ncu-rep --page details > $OUT/m16s2_details.txt 2>&1
ncu --import $OUT/m16s2.ncu-rep --page source --csv --print-source sass > $OUT/m16s2_sass.csv 2>&1; echo "src rc $?"; wc -l $OUT/m16s2_sass.csv
grep -E "Duration|Throughput|Hit Rate|Stall Long|Stall Wait|Eligible|Issued Warp|Active Warps|Registers" $OUT/m16s2_details.txt | head -30
