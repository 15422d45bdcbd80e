#!/usr/bin/env bash
# LAB (issue 35, batch 16): libpq2 with the bulk-copy ring kernel capped at 96 registers and ring
# (and register ping-pong) instances for token classes 8 and 16, to see whether the ring's m = 16
# losses were the wave quantisation that register ping-pong showed (2026-12-07 fourth session:
# 98-106 registers give 4 warps a scheduler, so gate_up's 1088 two-warp blocks need 1.03 waves).
#
# Copies native/, bindings/ and CMakeLists.txt to build/lab-ring-src (the checkout is not
# touched), replaces the ring kernel's __launch_bounds__(512, 1) by __maxnreg__($MAXNREG, default
# 96), appends the instances, builds build/lab-ring/libpq2.so and prints the rowblock kernels'
# registers and spills.
#   bash lab/m16ring/build.sh        # from the repository root
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
# CARVEOUT: the ring kernel's preferred shared-memory carve-out (the product's 100, or -1: the
# driver's choice, which leaves L1 room for the activations' loads); the build goes to
# build/lab-ring (100) or build/lab-ring-c$CARVEOUT
# LANE=1: the ring's copies made by every lane with cp.async (lab/m16ring/lane_ring.cuh, no
# mbarriers) instead of lane 0's bulk copies; the build goes to build/lab-ring-lane...
MAXNREG=${MAXNREG:-96}
CARVEOUT=${CARVEOUT:-100}
LANE=${LANE:-0}
SUFFIX=$([ "$LANE" = 1 ] && echo "-lane" || echo "")$([ "$CARVEOUT" = 100 ] && echo "" || echo "-c$CARVEOUT")
SRC=build/lab-ring$SUFFIX-src
OUT=build/lab-ring$SUFFIX
rm -rf "$SRC" && mkdir -p "$SRC" "$OUT"
cp -a native bindings CMakeLists.txt "$SRC"/
K="$SRC"/native/src/cuda/rowblock/kernels.cuh
grep -q "__launch_bounds__(512, 1)" "$K"
sed -i "s/__launch_bounds__(512, 1)/__maxnreg__($MAXNREG)/" "$K"
if [ "$LANE" = 1 ]; then
    cp lab/m16ring/lane_ring.cuh "$SRC"/native/src/cuda/rowblock/
    I="$SRC"/native/src/cuda/rowblock/instantiate.cuh
    sed -i 's|#include "rowblock/kernels.cuh"|#include "rowblock/kernels.cuh"\n#include "rowblock/lane_ring.cuh"|' "$I"
    sed -i 's/k.ring = rowblock_ring_kernel<RS, U, TOKS>;/k.ring = rowblock_lane_ring_kernel<RS, U, TOKS>;/' "$I"
    grep -q "rowblock_lane_ring_kernel<RS, U, TOKS>" "$I"
fi
sed -i "s/cudaFuncAttributePreferredSharedMemoryCarveout, 100)/cudaFuncAttributePreferredSharedMemoryCarveout, $CARVEOUT)/" \
    "$SRC"/native/src/cuda/rowblock/launch.cu
grep -q "Carveout, $CARVEOUT)" "$SRC"/native/src/cuda/rowblock/launch.cu
cat >>"$SRC"/native/src/cuda/rowblock/instances.inc <<'INST'
PQ2_ROWBLOCK_KERNEL(RING, TILES, 2, 2, 1, 16, 0)
PQ2_ROWBLOCK_KERNEL(RING, TILES, 2, 2, 2, 16, 0)
PQ2_ROWBLOCK_KERNEL(RING, TILES, 2, 2, 1, 8, 0)
PQ2_ROWBLOCK_KERNEL(RING, TILES, 2, 2, 2, 8, 0)
PQ2_ROWBLOCK_KERNEL(ROWS, TILES, 2, 2, 1, 16, 2)
PQ2_ROWBLOCK_KERNEL(PERSIST, TILES, 2, 2, 1, 16, 2)
INST
cat >>"$SRC"/CMakeLists.txt <<'CMAKE'

# LAB (lab/m16ring/build.sh): ptxas -v for the token-class 8 and 16 row-block units
if(PQ2_WITH_CUDA)
  set_source_files_properties(
    ${CMAKE_CURRENT_SOURCE_DIR}/native/src/cuda/rowblock/kernels_m8.cu
    ${CMAKE_CURRENT_SOURCE_DIR}/native/src/cuda/rowblock/kernels_m16.cu
    PROPERTIES COMPILE_OPTIONS "-Xptxas=-v")
endif()
CMAKE
git rev-parse --short HEAD >"$SRC"/BASE_COMMIT
cmake -S "$SRC" -B "$OUT" -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS=90a-real -DCMAKE_BUILD_TYPE=Release \
    >"$OUT.configure.log" 2>&1 || { cat "$OUT.configure.log"; exit 1; }
cmake --build "$OUT" -j "${JOBS:-$(nproc)}" -- -Otarget >"$OUT/build.log" 2>&1 ||
    { grep -B2 -A8 -i error "$OUT/build.log" | head -60; exit 1; }
ls -l "$OUT/libpq2.so"
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | grep -A2 "ring_kernel\|ELi2ELi0ELi2E\|ELi2ELi1ELi2E" |
    sed 's/ptxas info    : //' | grep -v "^--" | paste - - - | grep -E "ELi16E|ELi8E" |
    sed -E 's/Compiling entry function .(_Z[0-9]+[a-z_]+)I([^ ]*)Ev.*sm_90a.\s*/\1<\2> /' | head -40
