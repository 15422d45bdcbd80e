#!/usr/bin/env python3
"""Registers, shared memory and spills of every compiled CUDA kernel of libpq2 (no GPU needed).

Compiles each native/src/cuda/**/*.cu for sm_90a with `-Xptxas -v`, prints one line per kernel
instance and exits 1 if any kernel spills or uses a stack frame (local memory in a hot loop).
--tuning compiles the tuning build's kernels (-DPQ2_TUNING_KERNELS) instead of the product's.

With --baseline FILE it also exits 1 when an instance's registers rose enough to lower the warps
an SM can hold (an occupancy cliff: 64 -> 76 registers once cost the down projection at M = 1
45%). Refresh the file on purpose with --write-baseline FILE after checking the timings on the
GPU.

    python3 tools/kernel_report/ptxas_report.py [--tuning] [--baseline F | --write-baseline F]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def demangle(name: str) -> str:
    """rowblock_kernel<2, 2, 2, 1, 1, 0, 2> from its mangled name (integer and bool template
    arguments only)."""
    cut = name.find("ILi")
    if cut < 0:
        # A plain function in an anonymous namespace: the namespace's name hashes the source path
        # (it differs between checkouts), so keep only the function's own name.
        m = re.match(r"_ZN\d+_GLOBAL__N__\w*?_[0-9a-f]{8}(\d+)(\w+)", name)
        if m and len(m.group(2)) >= int(m.group(1)):
            return m.group(2)[: int(m.group(1))]
        return name
    prefix, base = name[:cut], name[:cut]
    # The template's name is the last length-prefixed component: <digits><identifier> whose
    # digits (possibly preceded by other digits of a hash) give the identifier's length.
    for j in range(len(prefix) - 1, 0, -1):
        if prefix[j - 1].isdigit() and not prefix[j].isdigit():
            i = j
            while i > 0 and prefix[i - 1].isdigit():
                i -= 1
            ident = prefix[j:]
            if any(int(prefix[a:j]) == len(ident) for a in range(i, j)):
                base = ident
                break
    # integer (Li<n>E) and bool (Lb<0|1>E) template arguments, in order
    args = [
        ("true" if v == "1" else "false") if t == "b" else v
        for t, v in re.findall(r"L([ib])(-?\d+)E", name[cut : name.find("EE", cut) + 1])
    ]
    return f"{base}<{', '.join(args)}>"


def nvcc(arch: str = "90a", tuning: bool = False) -> list[str]:
    """The nvcc command (and flags) these tools compile one libpq2 CUDA file with."""
    return [
        "nvcc",
        "-std=c++17",
        "-O3",
        "--expt-relaxed-constexpr",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        f"-I{ROOT / 'native/include'}",
        f"-I{ROOT / 'native/src'}",
        f"-I{ROOT / 'native/src/cuda'}",
    ] + (["-DPQ2_TUNING_KERNELS=1"] if tuning else [])


def report(src: Path, arch: str, tuning: bool = False):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = nvcc(arch, tuning) + ["-Xptxas", "-v", "-c", str(src), "-o", str(Path(tmp) / "k.o")]
        out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"nvcc failed on {src}:\n{out.stderr}")
    rows, cur = [], None
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = {"kernel": demangle(m.group(1)), "stack": 0, "spill_st": 0, "spill_ld": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        )
        if m:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
    return rows


def warps_per_sm(regs: int) -> int:
    """Warps one SM's 64K registers hold at this count (allocated per thread in steps of 8)."""
    per_thread = max(8, (regs + 7) // 8 * 8)
    return min(64, 65536 // (per_thread * 32))


def read_baseline(path: Path) -> dict:
    base = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, regs = line.rsplit(" ", 1)
            base[key] = int(regs)
    return base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="90a")
    ap.add_argument("--tuning", action="store_true", help="the tuning build's kernels")
    ap.add_argument(
        "--allow-stack", action="store_true", help="report stack frames without failing"
    )
    ap.add_argument(
        "--baseline", type=Path, help="fail when an instance holds fewer warps per SM than here"
    )
    ap.add_argument(
        "--write-baseline", type=Path, help="write the registers of every instance here"
    )
    args = ap.parse_args(argv)
    base = read_baseline(args.baseline) if args.baseline else {}
    bad = fell = 0
    current = []
    for src in sorted((ROOT / "native/src/cuda").rglob("*.cu")):
        name = src.relative_to(ROOT / "native/src/cuda").as_posix()
        for r in report(src, args.arch, args.tuning):
            flag = ""
            regs = r.get("regs", 0)
            key = f"{name} {r['kernel'].replace(' ', '')}"
            current.append(f"{key} {regs}")
            if r["spill_st"] or r["spill_ld"] or (r["stack"] and not args.allow_stack):
                flag, bad = "  <-- local memory", bad + 1
            if key in base and warps_per_sm(regs) < warps_per_sm(base[key]):
                flag, fell = (
                    flag + f"  <-- registers {base[key]} -> {regs}: "
                    f"{warps_per_sm(base[key])} -> {warps_per_sm(regs)} warps per SM",
                    fell + 1,
                )
            print(
                f"{name:24s} {r['kernel']:44s} regs {regs:3d}  stack {r['stack']:4d}  "
                f"spills {r['spill_st']}/{r['spill_ld']}{flag}"
            )
    if args.write_baseline:
        args.write_baseline.write_text(
            f"# tools/kernel_report/ptxas_report.py{' --tuning' if args.tuning else ''} "
            f"--write-baseline (sm_{args.arch}): kernel instance, registers\n"
            + "\n".join(current)
            + "\n"
        )
    # A renamed or removed instance would otherwise drop out of the comparison unnoticed.
    seen = {line.rsplit(" ", 1)[0] for line in current}
    gone = sorted(k for k in base if k not in seen)
    for key in gone:
        print(f"baseline instance not compiled any more: {key}", file=sys.stderr)
    if bad:
        print(f"{bad} kernel(s) use local memory", file=sys.stderr)
    if fell:
        print(
            f"{fell} kernel(s) hold fewer warps per SM than {args.baseline}; if intended (timed on "
            f"the GPU), refresh it with --write-baseline",
            file=sys.stderr,
        )
    if gone:
        print(
            f"{len(gone)} baseline instance(s) not found; if intended, refresh it with "
            "--write-baseline",
            file=sys.stderr,
        )
    return 1 if bad or fell or gone else 0


if __name__ == "__main__":
    sys.exit(main())
