# Session 2026-12-07 (fourth), call E: the attention tests with the new constants (32 x 8, 4 warps),
# the m <= 16 row-block space with register ping-pong (stages 2) added (build/lab-m16), then the
# whole model at batch 16, the old attention constants against the new, alternating.
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 100 python -m pytest -q -x -m gpu tests/runtime/test_mixer_kernels_gpu.py -k attention -p no:cacheprovider 2>&1 | tail -3
(export PYQ2_LIBRARY=$PWD/build/lab-m16/libpq2.so; timeout 170 python3 tools/tune/tune_matmul.py --ms 16 --layouts tiles:2 --search rowblock,persistent --warps 2,4,8 --replays 10 --json $OUT/tune16.json > $OUT/tune16.txt 2>&1; echo "tune16 rc $?"; tail -8 $OUT/tune16.txt)
for r in 1 2; do
  PQ2_KNOBS=CHUNK=128,ATTENTION_TILES=2,ATTENTION_WARPS=8 timeout 80 python lab/bench_knobs.py bench --synthetic bonsai-2-27b --whole --ms 16 --decode 128 > $OUT/whole_old_$r.txt 2>&1; echo "old rc $?"; tail -1 $OUT/whole_old_$r.txt
  timeout 80 python -m pyq2 bench --synthetic bonsai-2-27b --whole --ms 16 --decode 128 > $OUT/whole_new_$r.txt 2>&1; echo "new rc $?"; tail -1 $OUT/whole_new_$r.txt
done
(export PYQ2_LIBRARY=$PWD/build/lab-m16/libpq2.so; timeout 120 python3 tools/tune/tune_matmul.py --ms 8,4 --layouts tiles:2 --search rowblock,persistent --warps 2,4,8 --replays 10 --json $OUT/tune8.json > $OUT/tune8.txt 2>&1; echo "tune8 rc $?"; tail -8 $OUT/tune8.txt)
