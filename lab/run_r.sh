# Issue 36, call R (written 2026-12-07, sixth session; not yet run): WR with its fixed costs out
# (32-bit sums, one bulk copy of the operand, cta_produce's loads ahead) and distributed producers
# (mode 7), the packed operand (PACK: 18.5 KB instead of 70 KB, rings of 157-174 KB instead of 136),
# then the ring-ceiling probe. 8 WR variants x modes 3/0/2/5/7/4 (1 and 3 us)/6; pass
# --quick to probe_seg.py for 3 variants x 3/0/2/5/7 when device time is short.
# Build here:
#   nvcc -O3 -arch=sm_90a -std=c++17 -shared -Xcompiler -fPIC -Inative/src/cuda -Inative/src -Inative/include lab/seg/seg.cu -o lab/seg/libseg.so
#   nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-ring-probe lab/seg/ring.cu
# carry build/lab-ring-probe .whl build/dev-gpu/libpq2.so lab/seg/libseg.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 450 python lab/seg/probe_seg.py --which wr --rounds 2 --json $OUT/wr.json > $OUT/wr.txt 2>&1; echo "wr rc $?"; grep -v "^check" $OUT/wr.txt | tail -44
timeout 60 build/lab-ring-probe $OUT/ring.json > $OUT/ring.txt 2>&1; echo "ring rc $?"
grep -E "floor|reader|fsum" $OUT/ring.txt; awk '$1=="shared" || $1=="warp" || $1=="reg"' $OUT/ring.txt | sort -k10 -n | head -16
