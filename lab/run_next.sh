# The next session's GPU calls, most wanted first (written 2026-12-07, seventh session).
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Build: cmake --build build/dev-gpu; the seg library and the ring probe:
#   nvcc -O3 -arch=sm_90a -std=c++17 -shared -Xcompiler -fPIC -Inative/src/cuda -Inative/src -Inative/include lab/seg/seg.cu -o lab/seg/libseg.so
#   nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -Inative/src/cuda -Inative/include -o build/lab-ring-probe lab/seg/ring.cu
# carry build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so; wheels in .whl (lab/dev.sh).
#   call 1 (an H200 preferred; an H100 still answers the compute question): bash lab/run_w.sh —
#           the consumer core unrolled over a whole chunk (ring probe compute 5/6, WR th 2) against
#           today's loop (compute 1/2, th 0), stalls of 0-3 us, Nsight Compute on it alone.
#           Expected (NOTES segment-consumer-bound): about 35 instructions a unit instead of 74, the
#           core alone at 0.25-0.3 of the H100 floor instead of 0.45-0.52, WR mode 0 toward its
#           copies-only time, and on the H200 stalls of 2 us absorbed.
#   call 2: if call 1 holds, WR th 2 at more shapes (NW 8/16 x CH 4/8, PACK and not), modes 2/7,
#           with stamps, on the H200.
echo "see the comments: run lab/run_w.sh first"
