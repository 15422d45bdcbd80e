# The next session's GPU calls, most wanted first (written 2026-12-07, fourth session).
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Build: cmake --build build/dev-gpu; bash lab/m16ring/build.sh; CARVEOUT=-1 bash lab/m16ring/build.sh;
# LANE=1 bash lab/m16ring/build.sh;
# bash lab/e1/build.sh (for call 3). Wheels in .whl (lab/dev.sh).
#   call 1: bash lab/run_i.sh  (issue 35, batch 16: the ring kernel capped at 96 registers, bits and
#           the tuner at m = 16, 8, 4; carry build/dev-gpu/libpq2.so .whl build/lab-ring/libpq2.so
#           build/lab-ring-c-1/libpq2.so build/lab-ring-lane/libpq2.so). If the ring wins at m = 16: put the cap in the product
#           (kernels.cuh), its instances in instances_tuning.inc, retune m = 16 with a tuning build,
#           regenerate instances.inc, refresh the ptxas baseline, run the GPU matmul tests, then
#           `pyq2 bench --synthetic bonsai-2-27b --whole` on the H200 and commit its results file.
#   call 2: bash lab/run_h.sh  (the whole model at HEAD, on the H200 if it is the one lent, and the
#           attention tests; Nsight Compute of the attention decode kernel at batch 16; the CUDA
#           streaming attention prototype lab/attn_cuda against today's: build libattn.so first,
#           nvcc line in probe_cuda.py, carry lab/attn_cuda/libattn.so)
#   call 3: bash lab/run_j.sh  (issue 37: Nsight Compute of n128s6, E1 PRE, E3 forms; carry
#           build/lab-e1/libpq2.so)
echo "see the comments: run lab/run_i.sh, lab/run_h.sh, lab/run_j.sh as separate calls"
