# Session after 2026-12-07 (fourth), call I (issue 35, batch 16): the ring kernel capped at 96
# registers (bash lab/m16ring/build.sh; CARVEOUT=-1 bash lab/m16ring/build.sh; LANE=1 bash
# lab/m16ring/build.sh; carry build/lab-ring/libpq2.so build/lab-ring-c-1/libpq2.so
# build/lab-ring-lane/libpq2.so .whl build/dev-gpu/libpq2.so): bits against the register kernel,
# then the tuner over m = 16 (bulk ring at both carve-outs, lane ring) and m = 8, 4.
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for lib in lab-ring-lane lab-ring lab-ring-c-1; do
  export PYQ2_LIBRARY=$PWD/build/$lib/libpq2.so
  timeout 100 python lab/m16ring/check_ring.py > $OUT/check_$lib.txt 2>&1; echo "check $lib rc $?"; tail -2 $OUT/check_$lib.txt
  timeout 120 python3 tools/tune/tune_matmul.py --ms 16 --layouts tiles:2 --search rowblock,persistent --warps 2,4,8 --replays 10 --json $OUT/tune16_$lib.json > $OUT/tune16_$lib.txt 2>&1; echo "tune16 $lib rc $?"; grep best $OUT/tune16_$lib.txt
done
PYQ2_LIBRARY=$PWD/build/lab-ring-lane/libpq2.so timeout 120 python3 tools/tune/tune_matmul.py --ms 8,4 --layouts tiles:2 --search rowblock --warps 2,4,8 --replays 10 --json $OUT/tune8ring.json > $OUT/tune8ring.txt 2>&1; echo "tune8 rc $?"; grep best $OUT/tune8ring.txt
