#!/usr/bin/env bash
# LAB (issue 37, E1 and E3): libpq2 for sm_90a with the E1 ping-pong variants of the wide GEMM
# block and the E3 trimmed consumer loops (narrow and wide blocks).
#
# Copies the repository's native/, bindings/ and CMakeLists.txt to build/lab-e1-src, adds
# lab/e1/kernel_wgmma_e1.cuh, lab/e1/kernel_wgmma_e3.cuh and lab/e1/e3_kernels.cu (twice: the
# narrow and the wide E3 kernels, each its own translation unit, compiled beside launch.cu) and
# applies lab/e1/launch.patch there (the checkout is not touched), builds build/lab-e1/libpq2.so
# (the product's kernel set plus the E1 and E3 kernels, sm_90a only; the three lab translation
# units with -Xptxas -v), then reports the wide, E1 and E3 kernels' registers and spills (the
# build's ptxas output) and, when a cuobjdump is found ($CUOBJDUMP, PATH, or /tmp/e1venv from
# `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`), their consumer loops' SASS from the
# built library (build/lab-e1/e1_report.txt, copied to lab/e1/e1_report.txt).
#
#   bash lab/e1/build.sh            # from the repository root
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SRC=build/lab-e1-src
OUT=build/lab-e1
JOBS=${JOBS:-$(nproc)}
t0=$(date +%s)

# cp -a keeps the sources' times, so a rebuild compiles only the lab translation units (the
# patched launcher and the generated E3 files are new every time) and what changed
rm -rf "$SRC"
mkdir -p "$SRC"
cp -a native bindings CMakeLists.txt "$SRC"/
cp -p lab/e1/kernel_wgmma_e1.cuh lab/e1/kernel_wgmma_e3.cuh "$SRC"/native/src/cuda/gemm/
for form in narrow wide; do
    wide=$([ $form = wide ] && echo 1 || echo 0)
    { echo "#define PQ2_E3_WIDE $wide"; cat lab/e1/e3_kernels.cu; } \
        >"$SRC/native/src/cuda/gemm/e3_kernels_$form.cu"
done
patch -s -p1 -d "$SRC" --no-backup-if-mismatch < lab/e1/launch.patch
# ptxas -v for the lab translation units (their registers and spills, for the report)
cat >>"$SRC"/CMakeLists.txt <<'CMAKE'

# LAB (lab/e1/build.sh): ptxas -v for the lab translation units
if(PQ2_WITH_CUDA)
  set_source_files_properties(
    ${CMAKE_CURRENT_SOURCE_DIR}/native/src/cuda/gemm/launch.cu
    ${CMAKE_CURRENT_SOURCE_DIR}/native/src/cuda/gemm/e3_kernels_narrow.cu
    ${CMAKE_CURRENT_SOURCE_DIR}/native/src/cuda/gemm/e3_kernels_wide.cu
    PROPERTIES COMPILE_OPTIONS "-Xptxas=-v")
endif()
CMAKE
git rev-parse --short HEAD > "$SRC"/BASE_COMMIT 2>/dev/null || true

cmake -S "$SRC" -B "$OUT" -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS=90a-real -DPQ2_TUNING_KERNELS=OFF \
    -DCMAKE_BUILD_TYPE=Release >"$OUT.configure.log" 2>&1 ||
    { cat "$OUT.configure.log"; exit 1; }
# -Otarget: each object's output (its ptxas -v lines) in one piece
if ! cmake --build "$OUT" -j "$JOBS" -- -Otarget >"$OUT/build.log" 2>&1; then
    grep -B2 -A8 -i 'error' "$OUT/build.log" | head -80
    exit 1
fi
t1=$(date +%s)
ls -l "$OUT/libpq2.so"
echo "build: $((t1 - t0)) s (base commit $(cat "$SRC"/BASE_COMMIT 2>/dev/null || echo '?'))"
size=$(stat -c %s "$OUT/libpq2.so")
if [ "$size" -ge 40000000 ]; then
    echo "WARNING: libpq2.so is $size bytes (the lab budget is 40 MB)" >&2
fi

# registers and spills: the lab translation units' ptxas -v lines in the build log
grep -E "ptxas|Compiling entry|Function properties|stack frame|Used [0-9]+ registers" \
    "$OUT/build.log" >"$OUT/ptxas_launch.log" || true
if ! grep -q "wgmma_e3_kernel" "$OUT/ptxas_launch.log"; then
    echo "no ptxas -v lines for the E3 kernels in $OUT/build.log" >&2
    exit 1
fi

CUOBJ=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -z "$CUOBJ" ] && [ -x /tmp/e1venv/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump ]; then
    CUOBJ=/tmp/e1venv/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump
fi
{
    echo "# E1 / E3 compile report ($(date -u +%F), base $(cat "$SRC"/BASE_COMMIT 2>/dev/null ||
        echo '?'); build $((t1 - t0)) s on $JOBS cores, libpq2.so $((size / 1000000)) MB)"
    if [ -n "$CUOBJ" ]; then
        PATH="$(dirname "$CUOBJ"):$PATH" CUOBJDUMP="$CUOBJ" \
            python3 lab/e1/sass_e1.py "$OUT/libpq2.so" --ptxas "$OUT/ptxas_launch.log"
    else
        echo "(no cuobjdump: registers and spills only)"
        python3 lab/e1/sass_e1.py - --ptxas "$OUT/ptxas_launch.log"
    fi
} >"$OUT/e1_report.txt" 2>&1 || { cat "$OUT/e1_report.txt"; exit 1; }
cat "$OUT/e1_report.txt"
cp "$OUT/e1_report.txt" lab/e1/e1_report.txt
if grep -q 'C7519\|SPILLS\|SERIALISED' "$OUT/e1_report.txt"; then
    echo "WARNING: see the report above" >&2
fi
