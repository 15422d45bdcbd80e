# The next session's GPU calls, most wanted first (written 2026-12-07, eighth session).
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Build: cmake --build build/dev-gpu; the seg library and the ring probe:
#   nvcc -O3 -arch=sm_90a -std=c++17 -shared -Xcompiler -fPIC -Inative/src/cuda -Inative/src -Inative/include lab/seg/seg.cu -o lab/seg/libseg.so
#   nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -Inative/src/cuda -Inative/include -o build/lab-ring-probe lab/seg/ring.cu
#   nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-flag lab/seg/flag.cu
# carry build/lab-flag build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so; wheels in .whl (lab/dev.sh).
#   call 1 (an H200 wanted: the stall question is the H200's; an H100 still answers the knockouts):
#           bash lab/run_x.sh (about 60 s of run) —
#           ring probe with 32-bit ranges and unrolled tails: compute 2/6 alone, 1/5 streamed with
#           uniform stalls of 1-3 us (bar 6-8) and staggered ones (bar 10-12: the tile-dataflow
#           design's waits, the last warp as long as 6-8's);
#           WR th 0/2/6/14 (loop / unrolled any count / + 32-bit ranges / + zero C) x modes 3/0/2/7,
#           and mode 8 (mode 7 with per-tile waits and copies: the tile dataflow's first step),
#           and mode-0 knockouts 1/2/4/16/7/31 with stamps of every row; ncu of compute 6 last;
#           the flag probe (lab/seg/flag.cu): the floor of a boundary's wait, flag / stores / copy.
#           Expected (NOTES segment-core-unrolled, segment-tile-dataflow): compute 6 alone well under
#           0.40 of the H100 floor; WR mode 0 closer to copies-only; on the H200, staggered stalls
#           cost less than uniform ones of the same length. Decide on the tile-dataflow build from it.
#   call 2 (an H200, if time is left; noticed in the seventh session, not yet rerun): the batch-4
#           recurrence rose from 0.582 to 0.824 ms in the H200 whole bench after bf4a4df's GDN_BV 64,
#           which an H100 probe favoured. source lab/dev.sh; PYTHONPATH=. python lab/gdn/probe_gdn.py
#           --json $OUT/gdn.json (BV 32 against 64 at batch 1/4/16, checked against today's).
echo "see the comments: run lab/run_x.sh first"
