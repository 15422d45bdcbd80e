# Session 2026-12-07 (fourth), call F: where the m = 16 gate_up row-block kernel stalls, by SASS line.
source lab/dev.sh
export PYTHONUNBUFFERED=1
(cd tools/bench && timeout 150 ncu --clock-control none --kernel-name regex:rowblock --launch-skip 20 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --print-details all --page details -o $OUT/m16 \
  python3 bench_matmul.py --ms 16 --shapes gate_up --layouts tiles:2 --no-cublas --no-pass --replays 3 > $OUT/ncu_src.txt 2>&1)
echo "ncu rc $?"
ncu --import $OUT/m16.ncu-rep --page source --csv --print-source sass > $OUT/m16_sass.csv 2>&1; echo "src rc $?"; wc -l $OUT/m16_sass.csv
grep -iE "hit rate|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|stall" $OUT/ncu_src.txt | head -30
