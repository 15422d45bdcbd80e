# Session 2026-12-07 (sixth), call R (issue 36): the ring ceiling again (ring.cu's alignment fixed)
# and WR with 32-bit sums and a bulk-copied operand. carry build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python lab/seg/probe_seg.py --which wr --rounds 2 --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"; grep -v "^check" $OUT/wr.txt | tail -32
timeout 100 build/lab-ring-probe $OUT/ring.json > $OUT/ring.txt 2>&1; echo "ring rc $?"
cat $OUT/ring.txt
