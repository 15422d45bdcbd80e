# Session 2026-12-07 (fifth), call N: the product at HEAD (review fixes): GPU tests of the runner and
# the attention kernels, the sanitizers, the whole model. carry .whl build/dev-gpu/libpq2.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/runtime/test_runner_gpu.py tests/runtime/test_mixer_kernels_gpu.py -k "not prompt and not gdn" -p no:cacheprovider 2>&1 | tail -3
timeout 150 python -m pyq2 bench --synthetic bonsai-2-27b --whole --json $OUT/whole.json > $OUT/whole.txt 2>&1; echo "whole rc $?"; grep batch $OUT/whole.txt
timeout 120 bash tools/sanitize/run_sanitizers.sh build/dev-gpu/libpq2.so $OUT/san 2>&1 | tail -8
