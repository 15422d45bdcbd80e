#!/usr/bin/env bash
# A/B of the M = 1 decode pass (257 dependent calls) across source trees in ONE device call:
# builds libpq2 from each tree, then times the pass of each tree in ROUNDS alternating rounds
# (bench_decode.py --ms 1 --shapes out --layouts tiles:2 --no-cublas: read bandwidth, out at
# M = 1 and the pass), so variants compare without the drift between calls.
#
# Usage (device tool, carry .whl and the trees): [ROUNDS=2] bash tools/ab_pass.sh NAME...
#   NAME "cur" is this working tree; any other NAME is a tree at exp/NAME (tools/knockout_trees.py
#   makes knockout trees; `git archive <commit> | tar -x -C exp/NAME` any commit). A tree's
#   .commit file names the commit its results record.
# AB_SKIP_BUILD=1: the trees were built already (ab_build in the same call).
# Writes $OUT/pass_NAME_ROUND.json and prints one line per run (bench/NOTES.md v16e).
set -eo pipefail
source "$(dirname "$0")/ab_trees.sh"
[ -n "${AB_SKIP_BUILD:-}" ] || ab_build "$@"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in "$@"; do
    src=$(ab_src "$v") commit=$(ab_commit "$v")  # (before the cd: both are relative to the root)
    json=$OUT/pass_${v}_$round.json
    (cd "$src/tools" && PQ2_COMMIT="$commit" PYTHONPATH=$src:/tmp/site PYQ2_LIBRARY=/tmp/ab_$v/libpq2.so \
      python3 bench_decode.py --ms 1 --shapes out --layouts tiles:2 --no-cublas --json "$json" > /dev/null 2>&1) \
      || { echo "round $round $v: bench failed"; continue; }
    python3 - "$json" "$round" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["decode_pass_m1"][0]
out = [r["us"] for r in d["rows"] if r["shape"] == "out"][0]
print(f"round {sys.argv[2]} {sys.argv[3]}: pass {p['pass_ms']:.3f} ms = {p['ratio_to_floor']:.3f}x the floor "
      f"({p['floor_ms']:.3f} ms); out M=1 {out:.2f} us; read bandwidth {d['read_bandwidth_gbs'][0]:.0f} GB/s")
PY
  done
done
