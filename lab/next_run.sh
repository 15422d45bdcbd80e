# The next GPU runs (from the repository root on the device machine), in this order:
#  1. bash lab/run_d.sh   (about 2.5 min: m16w overlapped + non-overlapped vs today at m 16;
#                          the attention tiles probe at batch 1, 4, 16)
#     carry: build/dev-gpu/libpq2.so .whl lab/m16w/libm16w.so
#  2. bash lab/run_c.sh   (the same plus the attention and graph mixer tests; trim the probes if
#                          run_d already ran) - the tests of a3fd3d1 have not run on a GPU yet
#  3. bash lab/run_b.sh   (E1/E3 timings with --repro for issue 37, then the runtime GPU tests)
#     carry: build/dev-gpu/libpq2.so .whl build/lab-e1/libpq2.so
# Build first:
#   cmake -S . -B build/dev-gpu -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS=90a-real -DCMAKE_BUILD_TYPE=Release
#   cmake --build build/dev-gpu -j2
#   (cd lab/m16w && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -shared \
#      -Xcompiler -fPIC -I../../native/src/cuda -I../../native/src -I../../native/include \
#      -o libm16w.so m16w.cu)
#   bash lab/e1/build.sh
#   wheels into .whl (cffi pycparser gguf fla-core einops regex), as the device README says
echo "see the comments; lab/run_next.sh does 1-3 in one call"
