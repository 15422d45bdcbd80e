# The next session's first GPU call (about 6 minutes), most wanted first. Build first:
#   cmake -S . -B build/dev-gpu -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS=90a-real -DCMAKE_BUILD_TYPE=Release
#   cmake --build build/dev-gpu -j2 ; bash lab/e1/build.sh ; wheels into .whl (lab/dev.sh)
#   carry: build/dev-gpu/libpq2.so .whl build/lab-e1/libpq2.so
# 1. issue 35 on the H200 with bf4a4df's constants: the whole model at batch 1, 4, 16 (the
#    committed benchmark), then the weight path by kinds of call at m 1 and 16 (producers 1.03 ms
#    at m 16 on 2026-12-02); 2. E1/E3 timings for issue 37.
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python -m pyq2 bench --synthetic bonsai-2-27b --whole --json $OUT/whole.json 2>&1 | tail -5
timeout 60 python -m pyq2 bench --synthetic bonsai-2-27b --ms 1,16 --json $OUT/weights.json 2>&1 | tail -6
bash lab/e1/run_e1.sh --fast --budget-s 120 --repro > /dev/null 2>&1; echo "e1 rc $?"
(cd $OUT && ls child-* >/dev/null 2>&1 && tar czf e1-children.tgz child-* && rm -f child-*)
tail -30 $OUT/e1.log
