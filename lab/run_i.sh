# Session after 2026-12-07 (fourth), call I (issue 35, batch 16): the ring kernel capped at 96
# registers (bash lab/m16ring/build.sh; carry build/lab-ring/libpq2.so): bits against the register
# kernel, then the tuner over m = 16, 8, 4 with the ring instances, then Nsight Compute of gate_up
# m = 16 at the ring's best configuration (the tuner's JSON names it; edit the ncu line).
source lab/dev.sh
export PYTHONUNBUFFERED=1
export PYQ2_LIBRARY=$PWD/build/lab-ring/libpq2.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 120 python lab/m16ring/check_ring.py > $OUT/check_ring.txt 2>&1; echo "check rc $?"; tail -3 $OUT/check_ring.txt
timeout 200 python3 tools/tune/tune_matmul.py --ms 16 --layouts tiles:2 --search rowblock,persistent --warps 2,4,8 --replays 10 --json $OUT/tune16ring.json > $OUT/tune16ring.txt 2>&1; echo "tune16 rc $?"; grep best $OUT/tune16ring.txt
timeout 150 python3 tools/tune/tune_matmul.py --ms 8,4 --layouts tiles:2 --search rowblock --warps 2,4,8 --replays 10 --json $OUT/tune8ring.json > $OUT/tune8ring.txt 2>&1; echo "tune8 rc $?"; grep best $OUT/tune8ring.txt
