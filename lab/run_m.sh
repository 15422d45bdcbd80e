# Session 2026-12-07 (fifth), call M (issue 35): libpq2's attention kernel with the L2 prefetch
# before its PDL wait (and the prep letting it launch early) against the commit before it
# (lab/base + build/ab-base), the whole model at batch 4 and 16 alternating; then the attention tests.
# carry .whl build/dev-gpu/libpq2.so build/ab-base/libpq2.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 python -m pytest -q -x -m gpu tests/runtime/test_mixer_kernels_gpu.py -k "attention or graph" -p no:cacheprovider 2>&1 | tail -2
for r in 1 2; do
  for v in base new; do
    if [ $v = base ]; then PP=/tmp/site:$PWD/lab/base; LIB=$PWD/build/ab-base/libpq2.so; else PP=/tmp/site:$PWD; LIB=$PWD/build/dev-gpu/libpq2.so; fi
    PYTHONPATH=$PP PYQ2_LIBRARY=$LIB timeout 150 python -m pyq2 bench --synthetic bonsai-2-27b --whole --ms 2,4,16 --decode 128 --json $OUT/whole_${v}_$r.json > $OUT/whole_${v}_$r.txt 2>&1
    echo "== $v $r rc $?"; grep "batch" $OUT/whole_${v}_$r.txt | sed -E 's/time to first token +[0-9.]+ ms +//'
  done
done
