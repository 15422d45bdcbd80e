# Issue 36, call Z (2026-12-07, ninth session): on the H200, the stall questions (ring probe: uniform
# 1-3 us and staggered stalls at 136 / 204 KB), the floor of a boundary's wait (flag.cu), and what
# WR's mode 0 pays: knockouts 1 copy, 2 sums, 32 sums stored only (no atomic, no combine), 64 the
# operand's copy issued at the previous walk's end, and spins of 1 / 2.6 / 4 us with no memory
# operation in place of the copy and the sums (7 + spin); then the batch-4 recurrence rerun.
# (carry build/lab-flag build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 build/lab-ring-probe $OUT/ring.json fence > $OUT/ring.txt 2>&1; echo "ring rc $?"
grep -E "floor|reader|fsum" $OUT/ring.txt; awk '$1=="warp"' $OUT/ring.txt | head -80
timeout 60 build/lab-flag $OUT/flag.json > $OUT/flag.txt 2>&1; echo "flag rc $?"; head -n 13 $OUT/flag.txt
source lab/dev.sh
export PYTHONUNBUFFERED=1
timeout 300 python lab/seg/probe_seg.py --which wr --rounds 3 --trios "8,8,0;8,4,1" --fms 2 --thermo 14 --modes 3,0,2,7 --kos 1,2,32,64,96,3,7,2567,6663,10247,6656 --stamp-all --json $OUT/wr.json > $OUT/wr.log 2>&1; echo "wr rc $?"
grep -E "^(today|v3|WR|read)" $OUT/wr.log; grep -i "fail" $OUT/wr.log | head
timeout 170 python lab/gdn/probe_gdn.py --batches 4,1 --json $OUT/gdn.json > $OUT/gdn.log 2>&1; echo "gdn rc $?"
grep -E "^b |CHECKS|read" $OUT/gdn.log
