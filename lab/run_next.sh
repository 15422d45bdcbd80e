# The next session's GPU calls (written 2026-12-07, eleventh session). Issue 36 was resolved with its
# measured gap (NOTES segment-routes-closed); these calls would add H200 figures to it, not reopen it.
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Builds: nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-pdl lab/seg/pdl.cu
#         (and build/lab-td from lab/seg/td.cu alike)
#   call 1 (an H200 only, about 60 s; carry build/lab-pdl build/lab-td build/dev-gpu/libpq2.so .whl):
#     bash lab/run_pdl.sh   - the PDL-chained alternative A' on the H200, where today's producers cost
#                             +0.49 of the floor (H100 +0.27); NOTES segment-pdl-chain has the H100 rows.
#     source lab/dev.sh; timeout 170 python lab/gdn/probe_gdn.py --batches 16,4 --json $OUT/gdn.json
#                           - the recurrence's block width at batch 16 (BV 32 was 5 % faster at batch 4
#                             on the H200, 2.5 % slower on the H100; NOTES gdn-bv-h200-batch4). If BV 32
#                             wins at both batches on the H200, the width becomes a per-device choice in
#                             pyq2/runtime/mixer_kernels.py.
#     bash lab/run_td.sh    - the tile dataflow on the H200 (dropped on the H100: segment-td-red-h100).
echo "see the comments"
