# Issue 36, call TP (written 2026-12-07, tenth session; not yet run): the tile dataflow's producer
# in one warp with the product's arithmetic (lab/seg/tprod.cu): SwiGLU (17 tiles of 17408) and the
# exact RMSNorm (5 tiles of 5120, the row bulk-copied into shared memory), checked bit for bit
# against pq2_swiglu_rotate_q8_cuda and pq2_norm_rotate_q8_cuda (q8, scales, sums, bit slices,
# poisoned first); then a warp's latency per tile with the inputs in L2 and after an L2 flush.
# (carry build/lab-tprod build/dev-gpu/libpq2.so)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 120 build/lab-tprod $OUT/tprod.json 2>&1 | tee $OUT/tprod.txt; echo "tprod rc ${PIPESTATUS[0]}"
