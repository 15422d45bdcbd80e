#!/usr/bin/env bash
# Runs tools/sanitize/cases.cu (small calls of every libpq2 CUDA kernel) under compute-sanitizer's
# memcheck, racecheck, initcheck and synccheck. Needs a GPU, nvcc and a CUDA build of libpq2:
#   bash tools/sanitize/run_sanitizers.sh build/libpq2.so [OUT_DIR]
# Prints one line per tool and exits non-zero when any tool reports an error.
set -u
lib=${1:?usage: run_sanitizers.sh path/to/libpq2.so [out_dir]}
out=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
libdir=$(cd "$(dirname "$lib")" && pwd)
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$sanitizer" ] || { echo "run_sanitizers: compute-sanitizer not found"; exit 2; }
mkdir -p "$out"
nvcc -std=c++17 -O1 -I "$root/native/include" "$here/cases.cu" -L "$libdir" -lpq2 \
  -Xlinker -rpath="$libdir" -o "$out/cases" || exit 2
"$out/cases" > "$out/plain.log" 2>&1 || { echo "cases fail without a sanitizer:"; cat "$out/plain.log"; exit 1; }
rc=0
for tool in memcheck racecheck initcheck synccheck; do
  extra=""
  [ "$tool" = memcheck ] && extra="--leak-check no"
  "$sanitizer" --tool "$tool" $extra --error-exitcode 9 "$out/cases" > "$out/$tool.log" 2>&1
  status=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log" | tail -1)
  echo "$tool: exit $status; ${summary:-no summary}"
  [ "$status" -eq 0 ] || { rc=1; grep -m 12 -E "^=========  |Invalid|race|Uninitialized" "$out/$tool.log"; }
done
exit "$rc"
