# The next session's GPU calls, most wanted first (2026-12-07 third session: no machine started).
# Build first (cmake --build build/dev-gpu; bash lab/e1/build.sh); wheels in .whl (lab/dev.sh).
#   call 1: bash lab/run_c.sh  (attention probe incl. the persistent grid and the spill-free
#           shapes, then the attention tests of 9e9c9c8; carry build/dev-gpu/libpq2.so .whl)
#   call 2: bash lab/run_a.sh  (E1/E3 timings, then the whole model on the H200; carry also
#           build/lab-e1/libpq2.so)
#   call 3: bash lab/run_b.sh  (the attention test, ncu of the m = 16 gate_up kernel, the weight
#           path by kinds, segment v3 on this GPU;
#           carry also lab/seg/libseg.so)
# If the probe finds a spill-free shape faster, set CHUNK/ATTENTION_TILES/ATTENTION_WARPS (and
# the one-sequence constants) from it, rerun the attention tests and the whole bench.
echo "see the comments: run lab/run_c.sh, lab/run_a.sh, lab/run_b.sh as separate calls"
