# The next GPU run (from the repository root on the device machine), about 8 minutes:
#   carry: build/dev-gpu/libpq2.so .whl lab/seg/libseg.so lab/seg/libseg4.so build/lab-e1/libpq2.so
# Build them here first:
#   cmake -S . -B build/dev-gpu -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS=90a-real && cmake --build build/dev-gpu -j2
#   (cd lab/seg && for f in seg seg4; do nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
#      -shared -Xcompiler -fPIC -I../../native/src/cuda -I../../native/src -I../../native/include \
#      -o lib$f.so $f.cu; done)
#   bash lab/e1/build.sh
#   wheels into .whl (cffi pycparser gguf fla-core einops regex), as the device README says
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 120 python lab/seg/probe_seg.py --which v4 --rounds 2 --json $OUT/seg4.json > $OUT/seg4.log 2>&1; echo "seg4 rc $?"
tail -32 $OUT/seg4.log
bash lab/e1/run_e1.sh --fast --budget-s 120 --repro > /dev/null 2>&1; echo "e1 rc $?"
(cd $OUT && ls child-* >/dev/null 2>&1 && tar czf e1-children.tgz child-* && rm -f child-*)  # 8 files at most
tail -40 $OUT/e1.log
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/runtime > $OUT/runtime.log 2>&1; echo "runtime tests rc $?"
tail -5 $OUT/runtime.log
