# Issue 36, call PDL (written 2026-12-08, eleventh session): the research note's alternative A'
# (lab/seg/pdl.cu): one kernel per projection, PDL-chained in a graph, one CTA an SM small enough
# that the next projection's CTAs share the SM, its ring filled before griddepcontrol.wait; rings
# of 35 / 70 / 104 / 209 KB, fill before / after the wait, producer stand-ins of 0 / 1 / 2 us
# between the projections, PDL off, and the same kernels as one launch over every unit.
# (carry build/lab-pdl)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 build/lab-pdl $OUT/pdl.json 2>&1 | tee $OUT/pdl.txt; echo "pdl rc ${PIPESTATUS[0]}"
