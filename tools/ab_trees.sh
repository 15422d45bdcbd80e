# Sourced by tools/ab_tune.sh and tools/ab_pass.sh: the source trees of a same-call A/B on the GPU
# machine. NAME "cur" is the working tree, any other NAME the tree at exp/NAME.

# Installs the carried wheels into /tmp/site and builds libpq2 from each named tree into
# /tmp/ab_NAME (logs /tmp/ab_NAME.log, shown on failure); copies each build's generated
# declarations into its tree's package (trees may differ in ABI or layout version).
ab_build() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  local v src
  for v in "$@"; do
    src=$(ab_src "$v")
    test -f "$src/CMakeLists.txt" || { echo "$(basename "$0"): no source tree at $src" >&2; exit 2; }
    cmake -S "$src" -B "/tmp/ab_$v" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS="90a-real" \
      > "/tmp/ab_$v.log" 2>&1
  done
  # In parallel: one translation unit (decode_rowblock.cu) dominates each build, so the trees'
  # builds share the cores better than one build at a time.
  local pids=() i=0 failed=0
  for v in "$@"; do
    cmake --build "/tmp/ab_$v" >> "/tmp/ab_$v.log" 2>&1 &
    pids+=($!)
  done
  for v in "$@"; do
    wait "${pids[$i]}" || { echo "build $v failed"; tail -n 20 "/tmp/ab_$v.log"; failed=1; }
    i=$((i + 1))
  done
  [ "$failed" = 0 ] || exit 1
  for v in "$@"; do cp "/tmp/ab_$v/_cdef.py" "$(ab_src "$v")/pyq2/_cdef.py"; done
}

# The absolute path of tree NAME.
ab_src() { if [ "$1" = cur ]; then echo "$PWD"; else echo "$PWD/exp/$1"; fi; }

# The commit tree NAME's results name: its .commit file if the caller (or knockout_trees.py)
# wrote one, else "tree NAME" (a copied tree has no .git of its own, and git would find an
# unrelated one above it).
ab_commit() {
  local src; src=$(ab_src "$1")
  if [ -f "$src/.commit" ]; then echo "$(cat "$src/.commit") (tree $1)"; else echo "tree $1"; fi
}
