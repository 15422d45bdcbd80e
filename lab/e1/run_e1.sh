#!/usr/bin/env bash
# LAB (issue 37, E1 and E3), on the GPU machine from the repository root:
#     bash lab/e1/run_e1.sh [probe options]       (e.g. --fast; --no-e1 for E3 alone)
# e.g. bash lab/e1/run_e1.sh --fast --budget-s 120 --repro   (about 3 min on an H100 / H200; the
# bits and a smoke check run first in child processes, so one faulting variant is left out of
# the timings instead of ending the run; their logs land beside e1.json)
# Needs build/lab-e1/libpq2.so (bash lab/e1/build.sh, then carried). Writes e1.json and e1.log
# to $OUT (the device's result folder) or build/lab-e1.
set -uo pipefail
cd "$(dirname "$0")/../.."
# the other lab runs' environment (wheels into /tmp/site, PYTHONPATH), when present
if [ -f lab/dev.sh ]; then source lab/dev.sh; fi
export PYQ2_LIBRARY=$PWD/build/lab-e1/libpq2.so
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
DEST=${OUT:-build/lab-e1}
mkdir -p "$DEST"
if [ ! -f "$PYQ2_LIBRARY" ]; then
    echo "missing $PYQ2_LIBRARY: build it with bash lab/e1/build.sh and carry build/lab-e1/libpq2.so"
    exit 2
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader
timeout 355 python3 lab/e1/probe_e1.py --json "$DEST/e1.json" "$@" 2>&1 | tee "$DEST/e1.log"
exit "${PIPESTATUS[0]}"
