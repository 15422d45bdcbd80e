# Issue 36, call U (2026-12-07, seventh session): is the consumer core bound by its BMMAs? The ring
# probe's pure-compute rate (compute 2) against the thermometer core (two BMMA a unit instead of
# four; compute 4), and both streamed with stalls of 0-3 us a matrix; then WR with either core
# (th 0/1; bits checked equal), modes 3/0/2/7.
# Build: the two nvcc lines of lab/run_r.sh. carry build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 build/lab-ring-probe $OUT/ring.json fence > $OUT/ring.txt 2>&1; echo "ring rc $?"
grep -E "floor|reader|fsum" $OUT/ring.txt; awk '$1=="warp"' $OUT/ring.txt | head -200
timeout 380 python lab/seg/probe_seg.py --which wr --rounds 3 --trios "8,4,1;16,3,1" --fms 2 --thermo 0,1 --modes 3,0,2,7 --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"; grep -v "^check" $OUT/wr.txt | tail -24; grep -i "fail" $OUT/wr.txt | head
