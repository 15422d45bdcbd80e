# Issue 36, call S (2026-12-07, seventh session): is the matrix-end fence what WR pays? The ring
# probe's per-warp rings with each matrix-end form (bar 0-5), two copies a slot (split) and fixed
# stalls (bar 6-8: 1-3 us a matrix), then WR with the release moved after the barrier onto one
# non-issuing thread (fm 1) or a red.release (fm 2), modes 3/0/2/7.
# Build: the two nvcc lines of lab/run_r.sh. carry build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 120 build/lab-ring-probe $OUT/ring.json fence > $OUT/ring.txt 2>&1; echo "ring rc $?"
grep -E "floor|reader|fsum" $OUT/ring.txt; awk '$1=="warp"' $OUT/ring.txt
timeout 400 python lab/seg/probe_seg.py --which wr --rounds 3 --trios "8,4,1;16,3,1;8,8,0" --fms 0,1,2,3 --modes 3,0,2,7 --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"; grep -v "^check" $OUT/wr.txt | tail -45
