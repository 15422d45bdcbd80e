# The next session's GPU calls, most wanted first (written 2026-12-07, tenth session).
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Build the probe: nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-td lab/seg/td.cu
#   call 1 (an H200 if one comes; an H100 answers most of it): bash lab/run_td.sh, carry build/lab-td (about 30 s).
#           td.cu with tile slots in copy order freed per tile (a tile-local wait no longer waits
#           for the predecessor's last tiles), cells balanced over CTAs (bal 1), and stamps of
#           every boundary by role (NOTES segment-td-fixed-h100). Read:
#           - bal 1 against bal 0 at variant 1: the full boundary's skew term;
#           - the stamps of variant 1: which hop of the ~10 us chain binds (consumers' release ->
#             producer sees -> tile released -> last copy issued -> first tile ready);
#           - variants 2 and 3 against 1 at needed 1, bal 1: do tile-local boundaries now hide
#             their chain? and red / red fused: the realistic reduction and one hop fewer;
#             own: every CTA makes its tiles in its shared memory (three hops fewer);
#             prodns -1: the real producers' arithmetic in place of the spin.
#             Variant 3 (red fused) under today's producers + calls (1.53-1.56x on the H100)
#             keeps the dataflow alive; near 1.4x it is worth building into the product.
#           Read it with: python3 lab/seg/td_report.py <files_at>/td.json --today <today's producers +
#           calls, x floor, on that device: 1.53-1.56 on the H100, 1.94 on the H200>.
#   call 2 (same machine, about 10 s): bash lab/run_tprod.sh, carry build/lab-tprod and
#           build/dev-gpu/libpq2.so. Build: nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda
#           -Inative/include -o build/lab-tprod lab/seg/tprod.cu -Lbuild/dev-gpu -lpq2
#           -Xlinker -rpath,'$ORIGIN/dev-gpu' (after cmake --build build/dev-gpu).
#           The one-warp tile producer (SwiGLU; the exact norm from the row in shared memory):
#           bits against pq2_swiglu_rotate_q8_cuda / pq2_norm_rotate_q8_cuda, and its latency a
#           tile, the producer term of the chain (NOTES tile-producer-one-warp).
#   call 3 (an H200 only; about 60 s): the recurrence's block width at batch 16 and 4, which the
#           ninth session left open (BV 32 was 5 % faster than today's 64 at batch 4 on the H200):
#           source lab/dev.sh; timeout 170 python lab/gdn/probe_gdn.py --batches 16,4 --json $OUT/gdn.json
#           (carry .whl build/dev-gpu/libpq2.so). If BV 32 wins at both on the H200 and loses on the
#           H100, the block width becomes a per-device choice in pyq2/runtime/mixer_kernels.py.
#   then, if the dataflow holds: the realistic producers inside td.cu (partials reduced, then
#           tprod's arithmetic), and the partials' volume cut (warps own runs of a row block's K tiles).
#   if it does not (variant 3 above today's producers + calls, 1.53-1.56x on the H100, 1.94x on the
#           H200; the expectation written before the run is in NOTES segment-td-red-compile-only):
#           resolve issue 36 with the measured gap (every route's figures are in NOTES).
echo "see the comments: run lab/run_td.sh first"
