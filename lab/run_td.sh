# Issue 36, call TD: the tile dataflow's stall structure, synthetic (lab/seg/td.cu). Variants 0 (no
# dependency), 1 (every boundary full), 2 (exact norms: only the SwiGLU boundary tile-local), 3 (rstd
# after Q8: two boundaries a layer tile-local); producer spins 0 / 1 us. Each with every tile copied
# into every CTA, with only the tiles a CTA's cells use (needed), with cells balanced over the CTAs
# (bal), with the row blocks' sums made by their last arrival (red), and with the tile's last
# arrival making the successor's tile (fused), and with real producers (prodns -1: SwiGLU or the
# norm, the transform and Q8 in one warp) instead of the spin. Variant 0 also without the per-cell
# releases (rel 0). And own: no producer warps, no copies; every CTA makes the tiles its cells
# use in its own shared memory (spin 0 and real producers).
# Stamps of every boundary by role; partials (and row-block sums) checked bit-identical on poisoned
# buffers. First run 2026-12-07 (ninth session, H100); slots, bal, stamps, red and fused added in
# the tenth session, not yet run.
# (carry build/lab-td)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 300 build/lab-td $OUT/td.json 2>&1 | tee $OUT/td.txt; echo "td rc ${PIPESTATUS[0]}"
