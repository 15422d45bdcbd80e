# The next GPU call (about 8 minutes; one 10-minute call), most wanted first:
#   carry: build/dev-gpu/libpq2.so .whl lab/m16w/libm16w.so build/lab-e1/libpq2.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 90 python -m pytest -x -q -p no:cacheprovider -m gpu tests/runtime/test_mixer_kernels_gpu.py > $OUT/mixer.log 2>&1; echo "mixer tests rc $?"
tail -4 $OUT/mixer.log
timeout 90 python lab/attn/probe_attn.py --rounds 3 --json $OUT/attn.json > $OUT/attn.log 2>&1; echo "attn rc $?"
grep -v '^check' $OUT/attn.log | tail -20; grep FAIL $OUT/attn.log | head -3
timeout 70 python lab/gdn/probe_gdn.py --rounds 3 --json $OUT/gdn.json > $OUT/gdn.log 2>&1; echo "gdn rc $?"
grep -v '^check' $OUT/gdn.log | tail -36; grep FAIL $OUT/gdn.log | head -3
timeout 70 python lab/m16w/probe_m16w.py --rounds 3 --json $OUT/m16w.json > $OUT/m16w.log 2>&1; echo "m16w rc $?"
grep -E "FAIL|FAULT|CHECKS|Error" $OUT/m16w.log | head -5
sed -n '/^shape/,$p' $OUT/m16w.log | head -70
[ -n "$WITH_E1" ] && bash lab/e1/run_e1.sh --fast --budget-s 120 --repro > /dev/null 2>&1; echo "e1 rc $?"
(cd $OUT && ls child-* >/dev/null 2>&1 && tar czf e1-children.tgz child-* && rm -f child-*)
tail -30 $OUT/e1.log
