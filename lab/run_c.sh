# GPU run C: m16w overlapped (issue 35 batch 16), attention tiles probe, the mixer kernel tests,
# then the runtime GPU tests. carry: build/dev-gpu/libpq2.so .whl lab/m16w/libm16w.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 60 python lab/m16w/probe_m16w.py --rounds 3 --json $OUT/m16w.json > $OUT/m16w.log 2>&1; echo "m16w rc $?"
grep -E "FAIL|FAULT|CHECKS|Error" $OUT/m16w.log | head -5
sed -n '/^shape/,$p' $OUT/m16w.log | grep -E "today|/1 |/0 " | head -70
timeout 75 python lab/attn/probe_attn.py --rounds 3 --json $OUT/attn.json > $OUT/attn.log 2>&1; echo "attn rc $?"
grep -v '^check' $OUT/attn.log | tail -20
timeout 90 python -m pytest -x -q -p no:cacheprovider -m gpu tests/runtime/test_mixer_kernels_gpu.py -k "attention or graph" > $OUT/runtime.log 2>&1; echo "runtime tests rc $?"
tail -6 $OUT/runtime.log
