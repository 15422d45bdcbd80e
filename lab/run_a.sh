# GPU run A (repo root on the device): m16w probe (issue 35, batch 16), then seg4 (issue 36).
# carry: build/dev-gpu/libpq2.so .whl lab/seg/libseg.so lab/seg/libseg4.so lab/m16w/libm16w.so (nvcc ... -o lab/m16w/libm16w.so lab/m16w/m16w.cu)
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 300 python lab/m16w/probe_m16w.py --json $OUT/m16w.json > $OUT/m16w.log 2>&1; echo "m16w rc $?"
grep -E "FAIL|FAULT|CHECKS|Error|error" $OUT/m16w.log | head -20
sed -n '/^shape/,$p' $OUT/m16w.log
timeout 150 python lab/seg/probe_seg.py --which v4 --rounds 2 --json $OUT/seg4.json > $OUT/seg4.log 2>&1; echo "seg4 rc $?"
tail -28 $OUT/seg4.log
