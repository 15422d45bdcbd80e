# short GPU run: m16w overlapped and the attention tiles probe. carry: build/dev-gpu/libpq2.so .whl lab/m16w/libm16w.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 55 python lab/m16w/probe_m16w.py --rounds 3 --json $OUT/m16w.json > $OUT/m16w.log 2>&1; echo "m16w rc $?"
grep -E "FAIL|FAULT|CHECKS|Error" $OUT/m16w.log | head -5
sed -n '/^shape/,$p' $OUT/m16w.log | head -60
timeout 70 python lab/attn/probe_attn.py --rounds 3 --json $OUT/attn.json > $OUT/attn.log 2>&1; echo "attn rc $?"
grep -v '^check' $OUT/attn.log | tail -20; grep FAIL $OUT/attn.log | head -3
