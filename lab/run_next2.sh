# second call: the attention tiles with num_stages, m16w without 2/8/2/1
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 80 python -m pytest -x -q -p no:cacheprovider -m gpu tests/runtime/test_mixer_kernels_gpu.py -k "attention" > $OUT/mixer.log 2>&1; echo "mixer tests rc $?"
tail -3 $OUT/mixer.log
timeout 90 python lab/attn/probe_attn.py --rounds 3 --json $OUT/attn.json > $OUT/attn.log 2>&1; echo "attn rc $?"
grep -v '^check' $OUT/attn.log | tail -20; grep FAIL $OUT/attn.log | head -3
timeout 80 python lab/m16w/probe_m16w.py --rounds 2 --json $OUT/m16w.json > $OUT/m16w.log 2>&1; echo "m16w rc $?"
grep -E "FAIL|FAULT|CHECKS|Error" $OUT/m16w.log | head -5
sed -n '/^shape/,$p' $OUT/m16w.log | head -60
