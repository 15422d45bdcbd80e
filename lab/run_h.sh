# Session 2026-12-07 (fourth), call H: the whole model on this GPU with the product at HEAD, then the attention tests.
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python -m pyq2 bench --synthetic bonsai-2-27b --whole --json $OUT/whole.json > $OUT/whole.txt 2>&1; echo "whole rc $?"; tail -4 $OUT/whole.txt
timeout 100 python -m pytest -q -x -m gpu tests/runtime/test_mixer_kernels_gpu.py -k attention -p no:cacheprovider 2>&1 | tail -2
