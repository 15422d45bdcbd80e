# Session 2026-12-07 (third), call B: the attention test, ncu of the m = 16 gate_up kernel, the
# weight path by kinds of call, the segment kernel v3 (issue 36) on this GPU.
source lab/dev.sh
export PYTHONUNBUFFERED=1
timeout 100 python -m pytest -q -m gpu tests/runtime/test_mixer_kernels_gpu.py -k attention -p no:cacheprovider 2>&1 | tail -3
(cd tools/bench && timeout 90 ncu --clock-control none --kernel-name regex:rowblock --launch-skip 20 --launch-count 1 \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SpeedOfLight --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  python3 bench_matmul.py --ms 16 --shapes gate_up --layouts tiles:2 --no-cublas --no-pass --replays 3 > $OUT/ncu_m16.txt 2>&1)
echo "ncu rc $?"; grep -E "rowblock_kernel|stalled|Warp Cycles|Issued Ipc|Eligible Warps|Registers Per|Duration|Theoretical Occ|Achieved Occ|Memory Through|No Eligible" $OUT/ncu_m16.txt | awk '$NF+0 > 0.05 || !/stalled/' | head -50
timeout 80 python -m pyq2 bench --synthetic bonsai-2-27b --ms 1,16 --json $OUT/weights.json > $OUT/weights.txt 2>&1; echo "weights rc $?"; tail -12 $OUT/weights.txt
# issue 36: segment kernel v3 (lab/seg/seg.cu) on this machine beside today's calls; carry lab/seg/libseg.so
# (nvcc -O3 -arch=sm_90a -std=c++17 -shared -Xcompiler -fPIC -Inative/src/cuda -Inative/src -Inative/include lab/seg/seg.cu -o lab/seg/libseg.so)
timeout 200 python lab/seg/probe_seg.py --which v3 --rounds 2 --json $OUT/seg.json > $OUT/seg.txt 2>&1; echo "seg rc $?"; tail -30 $OUT/seg.txt
