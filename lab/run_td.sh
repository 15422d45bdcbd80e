# Issue 36, call TD (2026-12-07, ninth session): the tile dataflow's stall structure, synthetic
# (lab/seg/td.cu): variants 0 (no dependency), 1 (every boundary full), 2 (exact norms: only the
# SwiGLU boundary tile-local), 3 (rstd after Q8: two boundaries a layer tile-local), producer spins
# 0 / 1 us, each with every tile copied into every CTA and with only the tiles a CTA's cells use;
# tile slots taken in copy order and freed per tile, cells balanced over CTAs (bal 1) (2026-12-07,
# tenth session), stamps of the
# boundaries (one untimed launch a variant); variant 0 also without the per-cell releases (rel 0: the protocol's release cost);
# partials checked bit-identical to variant 0's on poisoned buffers.
# (carry build/lab-td)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 240 build/lab-td $OUT/td.json 2>&1 | tee $OUT/td.txt; echo "td rc ${PIPESTATUS[0]}"
