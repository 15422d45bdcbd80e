#!/usr/bin/env python3
"""SASS of selected kernel instances, with an opcode histogram per function and, with --loops,
the size and histogram of each hot loop (a backward branch whose body holds an IMMA or BMMA).

Works without a GPU: give a built libpq2 or a native/src/cuda/**/*.cu file (compiled here for
sm_90a to a cubin). Needs cuobjdump: the CUDA toolkit's, or the one in the pip wheel
nvidia-cuda-cuobjdump (`pip download nvidia-cuda-cuobjdump --no-deps`, unzip, then point
$CUOBJDUMP at nvidia/cu13/bin/cuobjdump; it needs nvdisasm beside it or on PATH, from the wheel
nvidia-cuda-nvdisasm). Instances are named as ptxas_report.py prints them, e.g.
"rowblock_kernel<2, 2, 2, 1, 1, 0, 2>":

    python3 tools/kernel_report/sass_of.py build/libpq2.so "rowblock_kernel<2,2,2,1,1,0,2>" >s.txt
    python3 tools/kernel_report/sass_of.py --loops native/src/cuda/rowblock/kernels_m1.cu \
        "rowblock_kernel<2,2,2,1,1,0,2>"
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ptxas_report import demangle, nvcc


def functions(sass: str):
    """(mangled name, text) of every function in cuobjdump -sass output."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for i in range(1, len(parts) - 1, 2):
        yield parts[i], parts[i + 1]


def opcode(text: str):
    m = re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text)
    return m.group(1) if m else "?"


def instructions(text: str):
    """(address, instruction text) of a function's SASS."""
    return [
        (int(m.group(1), 16), m.group(2).strip())
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)
    ]


def hot_loops(ins):
    """Bodies of the backward-branch loops that hold an IMMA or BMMA (innermost first by
    address)."""
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if any(opcode(t) in ("IMMA", "BMMA") for t in body):
                yield body


def sass_text(target: str) -> str:
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    if target.endswith(".cu"):
        with tempfile.TemporaryDirectory() as tmp:
            cubin = str(Path(tmp) / "k.cubin")
            subprocess.run(nvcc() + ["-cubin", "-o", cubin, target], check=True)
            return subprocess.run(
                [tool, "-sass", cubin], capture_output=True, text=True, check=True
            ).stdout
    return subprocess.run(
        [tool, "-sass", target], capture_output=True, text=True, check=True
    ).stdout


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    loops_only = "--loops" in argv
    argv = [a for a in argv if a != "--loops"]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    target, wanted = argv[0], {w.replace(" ", "") for w in argv[1:]}
    found = set()
    for name, text in functions(sass_text(target)):
        pretty = demangle(name).replace(" ", "")
        if pretty not in wanted:
            continue
        found.add(pretty)
        ins = instructions(text)
        if loops_only:
            for body in hot_loops(ins):
                ops = collections.Counter(opcode(t) for t in body)
                print(
                    f"{pretty}: loop of {len(body)} instructions: "
                    + ", ".join(f"{k} {v}" for k, v in ops.most_common())
                )
            continue
        ops = collections.Counter(opcode(t) for _, t in ins)
        print(f"==== {pretty}: {sum(ops.values())} instructions")
        print("  " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
        print(text)
    missing = wanted - found
    if missing:
        print(f"not found: {sorted(missing)}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
