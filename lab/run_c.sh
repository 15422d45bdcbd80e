# Session 2026-12-07 (third): the attention program-shape probe (persistent grid included), then
# the attention tests of 9e9c9c8.
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 140 python lab/attn/probe_attn.py --rounds 3 --json $OUT/attn.json > $OUT/attn.txt 2>&1; echo "attn rc $?"; grep -v "check.*rel" $OUT/attn.txt | tail -40
timeout 45 python -m pytest -q -x -m gpu tests/runtime/test_mixer_kernels_gpu.py -k attention -p no:cacheprovider 2>&1 | tail -3
