# Session 2026-12-07 (sixth), call R (issue 36): WR with 32-bit sums, a bulk-copied operand,
# cta_produce's loads ahead and distributed producers (mode 7) (trimmed to the device time left), then the ring ceiling (ring.cu's
# alignment fixed). carry build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 python lab/seg/probe_seg.py --which wr --rounds 2 --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"; grep -v "^check" $OUT/wr.txt | tail -20
timeout 40 build/lab-ring-probe $OUT/ring.json > $OUT/ring.txt 2>&1; echo "ring rc $?"
grep -E "floor|reader|fsum" $OUT/ring.txt; awk '$1=="shared" || $1=="warp" || $1=="reg"' $OUT/ring.txt | sort -k10 -n | head -12
