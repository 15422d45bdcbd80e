#!/usr/bin/env python3
"""Write a GGUF file of a preset's shapes with random ternary weights (pyq2.offline.synthetic):
the 27B-shaped model that `pyq2 generate` runs without a download. The bonsai-2-27b file is
7.2 GB; progress goes to stderr.

    python3 tools/bench/synthetic_gguf.py bonsai-2-27b /tmp/synthetic-27b.gguf
    pyq2 generate /tmp/synthetic-27b.gguf -p "The ship came back" -n 256 --json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

try:  # the installed package; a bare source checkout runs from the repository
    import pyq2  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pyq2.offline.synthetic import write_synthetic_model  # noqa: E402
from pyq2.plan.decode import PRESETS  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace an existing file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    shown = [-1]

    def progress(done: int, total: int) -> None:
        pct = done * 100 // total
        if pct != shown[0] and (pct % 10 == 0 or done == total):
            shown[0] = pct
            print(
                f"\r{args.out}: {done / 1e9:.2f} of {total / 1e9:.2f} GB", end="", file=sys.stderr
            )

    try:
        path = write_synthetic_model(args.out, args.preset, args.seed, args.force, progress)
    except (ValueError, OSError) as e:
        print(f"synthetic_gguf: {e}", file=sys.stderr)
        return 1
    print(f"\nwrote {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
