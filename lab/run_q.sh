# Session 2026-12-07 (sixth), call Q (issue 36): the weight stream's ceiling (lab/seg/ring.cu) and
# the per-warp-ring segment kernel WR (lab/seg/seg.cu, probe_seg.py --which wr); then the
# attention GPU tests (mixer_kernels' _step_qkv); on an H200 the whole-model bench at HEAD.
# Build here:
#   nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-ring-probe lab/seg/ring.cu
#   nvcc -O3 -arch=sm_90a -std=c++17 -shared -Xcompiler -fPIC -Inative/src/cuda -Inative/src -Inative/include lab/seg/seg.cu -o lab/seg/libseg.so
# carry build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 100 build/lab-ring-probe $OUT/ring.json > $OUT/ring.txt 2>&1; echo "ring rc $?"
cat $OUT/ring.txt
timeout 240 python lab/seg/probe_seg.py --which wr --rounds 2 --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"; grep -v "^check" $OUT/wr.txt | tail -48
timeout 120 python -m pytest -q -m gpu tests/runtime/test_mixer_kernels_gpu.py -k "attention or graph" -x -p no:cacheprovider > $OUT/tests.txt 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 250 python -m pyq2 bench --synthetic bonsai-2-27b --whole --json $OUT/whole-h200.json > $OUT/whole.txt 2>&1; echo "whole rc $?"; tail -15 $OUT/whole.txt
fi
