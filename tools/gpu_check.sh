#!/usr/bin/env bash
# On the GPU machine: install carried wheels, build libpq2 with CUDA, run the GPU tests.
# Usage (device tool, carry .whl): bash tools/gpu_check.sh [pytest args...]
set -eo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS="90a-real" > /tmp/cmake.log 2>&1 || { cat /tmp/cmake.log; exit 1; }
cmake --build build/gpu 2>&1 | grep -E "error|warning" || true
test -f build/gpu/libpq2.so
# Run the package from the source tree with the fresh library and its generated declarations.
cp build/gpu/_cdef.py pyq2/_cdef.py
export PYQ2_LIBRARY=$PWD/build/gpu/libpq2.so PYQ2_REQUIRE_NATIVE=1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m pytest -q -p no:cacheprovider --import-mode=importlib "$@"
