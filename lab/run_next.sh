# The next session's GPU calls, most wanted first (written 2026-12-07, ninth session).
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Build the probe: nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-td lab/seg/td.cu
#   call 1 (an H200: the stall question is the H200's): bash lab/run_td.sh, carry build/lab-td (about 30 s).
#           td.cu with the producers' partial reads in one round trip (the H100 run's defect, NOTES
#           segment-td-synthetic). Read variant 1 against 2 and 3: with producers of about 1 round
#           trip + the spin, do tile-local boundaries beat full ones by their slack, and is variant 3
#           under about 1.4x the floor? Variant 0 against the copies row is the protocol's own cost;
#           needed 1 against 0: copies of only the tiles a CTA's cells use.
#   then, if the dataflow holds: epoch-tagged partials (NCCL LL style) instead of a fence and a counter
#           a cell; then real producers (SwiGLU / norm, the
#           1024-wide rotation and Q8 in one warp: the butterflies are exact, so the bits can match).
# The seg.cu / ring.cu / flag.cu builds and calls are in git history (lab at e5437bb: run_x.sh, run_z.sh).
echo "see the comments: run lab/run_td.sh first"
