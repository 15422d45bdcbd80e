# m16w alone (carry build/dev-gpu/libpq2.so .whl lab/m16w/libm16w.so)
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 400 python lab/m16w/probe_m16w.py --json $OUT/m16w.json > $OUT/m16w.log 2>&1; echo "m16w rc $?"
grep -E "FAIL|FAULT|CHECKS|Error" $OUT/m16w.log | head -5
sed -n '/^shape/,$p' $OUT/m16w.log
