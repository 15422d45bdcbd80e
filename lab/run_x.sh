# Issue 36, call X (2026-12-07, eighth session): what WR's mode 0 (no cross-CTA dependency) pays
# beyond its copies: knockouts of the operand copy (1), the sums leaving the CTA (2), the flush (4),
# the start barrier (8), the arithmetic (16), with per-kind stamps of every row; and mode 8, mode 7
# with per-tile flags and copies (NOTES: segment-tile-dataflow).
# Before it: the ring probe with 32-bit ranges (compute 2/6 alone, 1/5 streamed, stalls), ncu on 6.
# Then the flag probe (lab/seg/flag.cu): a boundary's wait floor (flag, producers' stores, copy).
# (carry build/lab-flag build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 build/lab-ring-probe $OUT/ring.json fence > $OUT/ring.txt 2>&1; echo "ring rc $?"
grep -E "floor|reader|fsum" $OUT/ring.txt; awk '$1=="warp"' $OUT/ring.txt | head -80
timeout 60 build/lab-flag $OUT/flag.json > $OUT/flag.txt 2>&1; echo "flag rc $?"; cat $OUT/flag.txt
source lab/dev.sh
export PYTHONUNBUFFERED=1
timeout 400 python lab/seg/probe_seg.py --which wr --rounds 3 --trios "8,8,0;8,4,1" --fms 2 --thermo 0,2,6,14 --modes 3,0,2,7,8 --kos 1,2,4,16,7,31 --stamp-all --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"
grep -E "^(today|v3|WR|read)" $OUT/wr.txt; grep "^stamps:" $OUT/wr.txt | sed -E 's/"(wait_p90_us|end_spread_mean_us)": [0-9.]+,? ?//g' | cut -c1-190; grep -i "fail" $OUT/wr.txt | head
M='smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg,regex:^smsp__average_warps_issue_stalled_(wait|math_pipe_throttle|short_scoreboard|not_selected)_per_issue_active\.ratio$'
timeout 100 ncu --clock-control none -k regex:ring_warp --metrics "$M" build/lab-ring-probe x single 8 8 2 6 1 > $OUT/ncu_8_8_2_6_1.txt 2>&1
grep -E "pct|ratio|sum|avg" $OUT/ncu_8_8_2_6_1.txt | sed 's/  */ /g' | head -12
