# Session 2026-12-07 (fourth), call H: the whole model on this GPU with the product at HEAD, then the attention tests.
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python -m pyq2 bench --synthetic bonsai-2-27b --whole --json $OUT/whole.json > $OUT/whole.txt 2>&1; echo "whole rc $?"; tail -4 $OUT/whole.txt
timeout 100 python -m pytest -q -x -m gpu tests/runtime/test_mixer_kernels_gpu.py -k attention -p no:cacheprovider 2>&1 | tail -2
# Nsight Compute of the batch-16 attention decode kernel (27B shape, span 2304)
timeout 100 ncu --clock-control none --kernel-name regex:_attention_partial --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
  python lab/attn/ncu_attn.py > $OUT/ncu_attn.txt 2>&1; echo "ncu attn rc $?"
grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Issued Warp|Eligible Warps|Active Warps|Theoretical Occ|Achieved Occ|Block Limit|Registers Per|Shared Memory Per|Stall (Long|Short|Wait|Barrier|Math|Not Sel|MIO|LG)" $OUT/ncu_attn.txt | head -24
# the CUDA streaming attention prototype against today's (carry lab/attn_cuda/libattn.so)
timeout 150 python lab/attn_cuda/probe_cuda.py --json $OUT/attn_cuda.json > $OUT/attn_cuda.txt 2>&1; echo "attn_cuda rc $?"; grep -v "^check" $OUT/attn_cuda.txt | tail -16; grep -c FAIL $OUT/attn_cuda.txt
