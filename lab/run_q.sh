# Session 2026-12-07 (sixth), call Q (issue 36): the weight stream's ceiling (lab/seg/ring.cu),
# built here: nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-ring-probe lab/seg/ring.cu
# carry build/lab-ring-probe .whl
source lab/dev.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python -c "from pyq2.runtime.timing import read_bandwidth_gbs as r; print('pyq2 read bandwidth GB/s', round(r()))"
timeout 240 build/lab-ring-probe $OUT/ring.json > $OUT/ring.txt 2>&1; echo "ring rc $?"
cat $OUT/ring.txt
