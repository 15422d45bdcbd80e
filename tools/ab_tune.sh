#!/usr/bin/env bash
# A/B of kernel variants in ONE device call: builds libpq2 from each source tree, tunes each with
# tools/tune_decode.py (tiles rt 2; families rowblock, persistent, splits, coarse) and prints the best
# tuned time per shape and M side by side. Same machine, same minutes: variants compare without
# the run-to-run drift of separate calls.
#
# Usage (device tool, carry .whl and the trees): [MS=1,2] [FAMILIES=...] [LAYOUTS=tiles:2] bash tools/ab_tune.sh NAME...
#   NAME "cur" is this working tree; any other NAME is a tree at exp/NAME, e.g. made with
#   `git archive <commit> | tar -x -C exp/NAME` (exp/ is listed in .git/info/exclude, so carry it);
#   write the commit to exp/NAME/.commit (and ./.commit for "cur") so the results name it.
# Writes $OUT/tune_NAME.{json,log} (the device tool returns at most 8 files: 3 trees and the
# caller's own 2 logs fit); the cmake and build logs stay in /tmp/ab_NAME.log, shown on failure.
set -eo pipefail
source "$(dirname "$0")/ab_trees.sh"
ab_build "$@"
# Each tree tunes with its own package and tools.
for v in "$@"; do
  src=$(ab_src "$v") commit=$(ab_commit "$v")  # (before the cd: both are relative to the root)
  (cd "$src/tools" && PQ2_COMMIT="$commit" PYTHONPATH=$src:/tmp/site PYQ2_LIBRARY=/tmp/ab_$v/libpq2.so python3 tune_decode.py \
    --ms "${MS:-1}" --layouts "${LAYOUTS:-tiles:2}" --families "${FAMILIES:-rowblock,persistent,splits,coarse}" --json "$OUT/tune_$v.json" \
    > "$OUT/tune_$v.log" 2>&1) || echo "tune $v failed"
done
python3 - "$@" <<'PY'
import json, os, sys
out, names = os.environ["OUT"], sys.argv[1:]
res = {v: json.load(open(f"{out}/tune_{v}.json")) for v in names if os.path.exists(f"{out}/tune_{v}.json")}
shapes = ["gate_up", "down", "in_proj", "qkv", "out", "lm_head"]
for m in sorted({r["m"] for d in res.values() for r in d["rows"]}):
    print(f"M={m}: " + "  ".join(f"{v:>7}" for v in res))
    for s in shapes:
        best = [min((r["us"] for r in d["rows"] if r["shape"] == s and r["m"] == m and r.get("us")), default=float("nan"))
                for d in res.values()]
        print(f"  {s:8} " + "  ".join(f"{x:7.1f}" for x in best))
PY
