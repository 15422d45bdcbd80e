#!/usr/bin/env bash
# LAB (issue 37, E2 at 128 tokens): libpq2 with the wide block's two-groups-an-iteration consumer
# (PAIRS) compiled at 128 tokens, under the 40/232 register split (the product: PAIRS at 96 only,
# 56/224; at 128 tokens the consumer then spills, NOTES: wide-blocks-measured, compile-only). The
# measurement the issue's E2 route still lacks: does E2 at 128 tokens beat n128s6 despite its
# spills? Copies native/, bindings/ and CMakeLists.txt to build/lab-e2-src (the checkout is not
# touched), builds build/lab-e2/libpq2.so (sm_90a) and prints the wide kernels' registers and
# spills.    bash lab/e2/build.sh       # from the repository root
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SRC=build/lab-e2-src
OUT=build/lab-e2
rm -rf "$SRC" && mkdir -p "$SRC" "$OUT"
cp -a native bindings CMakeLists.txt "$SRC"/
K="$SRC"/native/src/cuda/gemm/kernel_wgmma.cuh
sed -i 's/constexpr int kWideProducerRegs = 56, kWideConsumerRegs = 224;/constexpr int kWideProducerRegs = 40, kWideConsumerRegs = 232;/' "$K"
grep -q "kWideProducerRegs = 40, kWideConsumerRegs = 232" "$K"
python3 - "$SRC"/native/src/cuda/gemm/launch.cu <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = """        return cfg.tokens == 128 && cfg.unroll == 1 ? wgmma_kernel<128, false, true>(cfg.stages)
                                                    : nullptr;"""
new = """        if (cfg.tokens == 128)
            return cfg.unroll == 2 ? wgmma_kernel<128, false, true, true>(cfg.stages)
                                   : wgmma_kernel<128, false, true>(cfg.stages);
        return nullptr;"""
assert old in s, "launch.cu changed: update lab/e2/build.sh"
s = s.replace(old, new)
old = "unroll 2 only"
assert old in s
open(p, "w").write(s)
PY
cat >>"$SRC"/CMakeLists.txt <<'CMAKE'

# LAB (lab/e2/build.sh): ptxas -v for the GEMM launch unit (the wgmma kernels)
if(PQ2_WITH_CUDA)
  set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/native/src/cuda/gemm/launch.cu
                              PROPERTIES COMPILE_OPTIONS "-Xptxas=-v")
endif()
CMAKE
git rev-parse --short HEAD >"$SRC"/BASE_COMMIT
cmake -S "$SRC" -B "$OUT" -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS=90a-real -DCMAKE_BUILD_TYPE=Release \
    >"$OUT.configure.log" 2>&1 || { cat "$OUT.configure.log"; exit 1; }
cmake --build "$OUT" -j "${JOBS:-$(nproc)}" -- -Otarget >"$OUT/build.log" 2>&1 ||
    { grep -B2 -A8 -i error "$OUT/build.log" | head -60; exit 1; }
ls -l "$OUT/libpq2.so"
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | grep -A2 "wgmma_kernel" |
    grep -v "^--" | paste - - - | grep "ELb0ELb1E" |
    sed -E 's/.*wgmma_kernelILi([0-9]+)ELi([0-9])ELb0ELb1ELb([01])E.*stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads.*Used ([0-9]+) registers.*/BN \1 stages \2 pairs \3: spill st \4 ld \5, regs \6/'
