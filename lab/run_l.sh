# Session 2026-12-07 (fifth), call L (issue 35): libpq2's attention decode kernel in the product:
# the new ABI tests, the attention GPU tests, the A/B against the Triton programs, the whole model.
# carry .whl build/dev-gpu/libpq2.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 60 python -m pytest -q -x tests/lib/test_attention_decode_abi.py -p no:cacheprovider 2>&1 | tail -2
timeout 150 python -m pytest -q -x -m gpu tests/runtime/test_mixer_kernels_gpu.py -k "attention or graph" -p no:cacheprovider 2>&1 | tail -4
timeout 120 python lab/attn_cuda/ab_product.py --json $OUT/ab.json 2>&1 | tail -8
timeout 200 python -m pyq2 bench --synthetic bonsai-2-27b --whole --json $OUT/whole.json > $OUT/whole.txt 2>&1; echo "whole rc $?"; tail -4 $OUT/whole.txt
