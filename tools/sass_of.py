#!/usr/bin/env python3
"""SASS of selected kernel instances of a built libpq2, with an opcode histogram per function.

Needs cuobjdump (the GPU machine's CUDA toolkit). Instances are named as tools/ptxas_report.py
prints them, e.g. "rowblock_kernel<2, 2, 1, 1, 1, false>":

    python3 tools/sass_of.py build/gpu/libpq2.so "rowblock_kernel<2, 2, 1, 1, 1, false>" > sass.txt
"""
from __future__ import annotations

import collections
import re
import subprocess
import sys

from ptxas_report import demangle


def functions(sass: str):
    """(mangled name, text) of every function in cuobjdump -sass output."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for i in range(1, len(parts) - 1, 2):
        yield parts[i], parts[i + 1]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    lib, wanted = argv[0], {w.replace(" ", "") for w in argv[1:]}
    sass = subprocess.run(["cuobjdump", "-sass", lib], capture_output=True, text=True, check=True).stdout
    found = set()
    for name, text in functions(sass):
        pretty = demangle(name).replace(" ", "")
        if pretty not in wanted:
            continue
        found.add(pretty)
        ops = collections.Counter()
        for line in text.splitlines():
            m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[\w.]+)?", line)
            if m:
                ops[m.group(1)] += 1
        print(f"==== {pretty}: {sum(ops.values())} instructions")
        print("  " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
        print(text)
    missing = wanted - found
    if missing:
        print(f"not found: {sorted(missing)}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
