#!/usr/bin/env python3
"""LAB (issue 37, E1 and E3): the consumer loops of the wide / E1 / E3 sm_90a GEMM kernels, from
SASS.

For every kernel whose demangled name matches a filter (default: the wide 128/96-token blocks,
the narrow 128-token blocks, the E1 and the E3 kernels), each innermost backward-branch loop
holding an IGMMA: its instruction count and the count per 128-deep group (a loop of 8 IGMMAs
holds two groups), split by purpose (promotion: FFMA, the integer bias adds, LDS.128 / LDS,
HADD2.F32, FMUL; plane expansion: LDS.64, the shifts by 2/4/6, the 0xc0c0c0c0 masks; wgmma:
IGMMA and WARPGROUP.*; bookkeeping: the rest), the IGMMAs between waits (WARPGROUP.DEPBAR),
named-barrier syncs and arrives, and where the LDS.128 (token constants) sit relative to the
IGMMAs and the wait.

    CUOBJDUMP=.../cuobjdump python3 lab/e1/sass_e1.py build/lab-e1/libpq2.so \
        [--ptxas build/lab-e1/ptxas_launch.log] [regex ...]
    python3 lab/e1/sass_e1.py - --ptxas LOG      # registers and spills only

Flags SPILLS (stack or spill bytes) and SERIALISED (a loop whose IGMMAs are not 4 to a wait, or
with more than one warpgroup arrive) and exits 1 then.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "kernel_report"))
from ptxas_report import demangle  # noqa: E402
from sass_of import functions, instructions, opcode  # noqa: E402

DEFAULT = [
    r"wgmma_e1_kernel<",
    r"wgmma_e3_kernel<",
    r"wgmma_kernel<(96|128), \d, false, true, (false|true)>",
    r"wgmma_kernel<128, (4|6), false, false, false>",
]


def loops(ins):
    """Innermost backward-branch loops that hold an IGMMA: (start index, end index)."""
    found = []
    for i, (addr, text) in enumerate(ins):
        m = re.search(r"BRA (?:`\(\.L_x_\d+\) )?(0x[0-9a-f]+)", text) or re.search(
            r"BRA\s+(0x[0-9a-f]+)", text
        )
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        j = next(k for k, (a, _) in enumerate(ins) if a >= target)
        body = [t for _, t in ins[j : i + 1]]
        # a loop holds an IGMMA; the out-of-line mbarrier retry stubs branch back into the
        # function from its end, over EXITs: not loops
        if any(opcode(t) == "IGMMA" for t in body) and not any(opcode(t) == "EXIT" for t in body):
            found.append((j, i))
    # innermost: no other found loop strictly inside
    return [
        (a, b)
        for a, b in found
        if not any((c, d) != (a, b) and a <= c and d <= b for c, d in found)
    ]


def purpose(text):
    """promotion / plane / wgmma / book(keeping) of one instruction of a consumer loop."""
    t = re.sub(r"^@!?U?P\w+\s+", "", text)
    op = t.split()[0]
    if op in ("FFMA", "HADD2.F32", "FMUL", "LDS", "LDS.128"):
        return "promotion"
    # the integer bias adds q + k: IMAD.IADD Ra, Rb, 0x1, Rc or IADD3 Ra, Rb, Rc, RZ
    if re.match(r"IMAD\.IADD R\d+, R\d+(\.reuse)?, 0x1, R\d+(\.reuse)?$", t) or re.match(
        r"IADD3 R\d+, R\d+(\.reuse)?, R\d+(\.reuse)?, RZ$", t
    ):
        return "promotion"
    if op == "LDS.64" or ("LOP3.LUT" in t and "0xc0c0c0c0" in t):
        return "plane"
    if re.match(r"(SHF\.L\.U32|IMAD\.SHL\.U32) R\d+, R\d+(\.reuse)?, 0x(2|4|6|10|40)\b", t):
        return "plane"
    if op.startswith("IGMMA") or op.startswith("WARPGROUP"):
        return "wgmma"
    return "book"


def describe(body):
    ops = [opcode(t) for t in body]
    full = [t for t in body]
    cnt = collections.Counter(ops)
    # IGMMAs between waits: split the sequence at each DEPBAR
    runs, cur = [], 0
    for t in full:
        if t.startswith("IGMMA") or " IGMMA" in t:
            cur += 1
        elif "WARPGROUP.DEPBAR" in t:
            runs.append(cur)
            cur = 0
    if cur:
        runs.append(cur)
    # positions of key instructions
    pos = {"igmma": [], "depbar": [], "lds128": [], "barsync": [], "bararv": [], "empty": [],
           "ffma": []}
    for k, t in enumerate(full):
        if "IGMMA" in t:
            pos["igmma"].append(k)
        if "WARPGROUP.DEPBAR" in t:
            pos["depbar"].append(k)
        if re.search(r"\bLDS\.128\b", t):
            pos["lds128"].append(k)
        if re.search(r"\bBAR\.SYNC", t):
            pos["barsync"].append(k)
        if re.search(r"\bBAR\.ARV\b", t):
            pos["bararv"].append(k)
        if "SYNCS.ARRIVE.TRANS64.A1T0" in t:
            pos["empty"].append(k)
        if opcode(t) == "FFMA":
            pos["ffma"].append(k)
    dep = pos["depbar"][0] if pos["depbar"] else None
    last_ig = pos["igmma"][-1] if pos["igmma"] else None
    lds_before_wait = sum(1 for k in pos["lds128"] if dep is not None and k < dep)
    lds_between_igmma = sum(
        1 for k in pos["lds128"] if pos["igmma"] and pos["igmma"][0] < k < last_ig
    )
    groups = max(1, cnt.get("IGMMA", 0) // 4)
    parts = collections.Counter(purpose(t) for t in body)
    return {
        "instructions": len(body),
        "groups": groups,
        "per_group": len(body) / groups,
        "parts_per_group": {k: parts.get(k, 0) / groups
                            for k in ("promotion", "plane", "wgmma", "book")},
        "r2ur": sum(1 for o in ops if o == "R2UR"),
        "bssy": sum(1 for o in ops if o == "BSSY"),
        "igmma": cnt.get("IGMMA", 0),
        "igmma_per_wait": runs,
        "warpgroup_arrive": sum(1 for t in full if "WARPGROUP.ARRIVE" in t),
        "depbar": len(pos["depbar"]),
        "bar_sync": len(pos["barsync"]),
        "bar_arv": len(pos["bararv"]),
        "lds": sum(1 for o in ops if o == "LDS"),
        "lds128_before_wait": lds_before_wait,
        "lds128_between_igmma": lds_between_igmma,
        "ffma": cnt.get("FFMA", 0),
        # where the stage's empty arrive sits: after how many of the loop's FFMAs
        "empty_after_ffma": [sum(1 for f in pos["ffma"] if f < e) for e in pos["empty"]],
        "hist": cnt.most_common(12),
    }


MODES = {1: "wide", 2: "pairs", 3: "PING", 4: "PING+PRE all", 5: "PING+PRE half",
         6: "PING+PRE quarter", 7: "PRE all", 8: "OFFSET",
         # E3 (kernel_wgmma_e3.cuh e3_form_of)
         9: "E3 U1", 10: "E3 U1+ALL", 11: "E3 U1+ALL noMAGIC", 12: "E3 U2",
         13: "E3 U2+PF", 14: "E3 U2+PF+PR+ALL", 15: "E3 U2+PF+PR+ALL+PING+PREq",
         16: "E3 U1+ALL+PING+PREh"}


def variant(pretty):
    """'e128s6 u4 PING+PRE all'-style label of a kernel's demangled name (the probe's labels:
    n = narrow, w = wide, p = pairs, e = E1 or a wide E3 block, n...u9.. = a narrow E3 block)."""
    m = re.match(r"wgmma_e3_kernel<(\d+), (\d+), (true|false), (\d+)>", pretty)
    if m:
        bn, st, wide, mode = int(m.group(1)), int(m.group(2)), m.group(3) == "true", int(m.group(4))
        return f"{'e' if wide else 'n'}{bn}s{st} u{mode} {MODES[mode]}"
    m = re.match(r"wgmma_e1_kernel<(\d+), (\d+), (\d+)>", pretty)
    if m:
        bn, st, mode = map(int, m.groups())
        return f"e{bn}s{st} u{mode} {MODES[mode]}"
    m = re.match(r"wgmma_kernel<(\d+), (\d+), false, false, false>", pretty)
    if m:
        return f"n{m.group(1)}s{m.group(2)} (narrow)"
    m = re.match(r"wgmma_kernel<(\d+), (\d+), false, true, (false|true)>", pretty)
    if m:
        bn, st = int(m.group(1)), int(m.group(2))
        return f"{'p' if m.group(3) == 'true' else 'w'}{bn}s{st} u{2 if m.group(3) == 'true' else 1}"
    return pretty


def ptxas_rows(log):
    """{demangled kernel: (registers, stack, spill stores, spill loads)} from ptxas -v output;
    and the warning lines."""
    rows, cur, st, warns = {}, None, (0, 0, 0), []
    for line in Path(log).read_text().splitlines():
        if "warning" in line.lower():
            warns.append(line.strip())
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = demangle(m.group(1))
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            st = tuple(map(int, m.groups()))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            rows[cur] = (int(m.group(1)),) + st
            cur = None
    return rows, warns


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    log = None
    if "--ptxas" in argv:
        i = argv.index("--ptxas")
        log = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    target, pats = argv[0], [re.compile(p) for p in (argv[1:] or DEFAULT)]
    regs, warns = ptxas_rows(log) if log else ({}, [])
    for w in warns:
        print("ptxas WARNING (C7519 = serialised wgmma):", w)
    loops_of = collections.defaultdict(list)
    if target != "-":
        tool = os.environ.get("CUOBJDUMP", "cuobjdump")
        sass = subprocess.run(
            [tool, "-sass", target], capture_output=True, text=True, check=True
        ).stdout
        for name, text in functions(sass):
            pretty = demangle(name)
            if not any(p.search(pretty) for p in pats):
                continue
            ins = instructions(text)
            for a, b in loops(ins):
                loops_of[pretty].append(describe([t for _, t in ins[a : b + 1]]))
            if not loops_of[pretty]:
                loops_of[pretty] = []
    names = sorted(
        {k for k in regs if any(p.search(k) for p in pats)} | set(loops_of),
        key=lambda k: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", k)],
    )
    print(
        "variant                                regs stack spill(st/ld) | per consumer loop: "
        "instructions per group (promotion/plane/wgmma/bookkeeping per group), IGMMA per wait, "
        "BAR.SYNC/BAR.ARV, LDS.128 before the wait (of them among the IGMMAs), R2UR/BSSY, the "
        "stage's empty arrive after FFMA n"
    )
    bad = 0
    for k in names:
        r = regs.get(k)
        head = f"{variant(k):38s} " + (
            f"{r[0]:4d} {r[1]:5d} {r[2]:5d}/{r[3]:<5d}" if r else "   -     -     -/-    "
        )
        if r and (r[1] or r[2] or r[3]):
            head += " SPILLS"
            bad += 1
        parts = []
        for d in loops_of.get(k, []):
            # a wait after fewer than a group's 4 IGMMAs, or a warpgroup arrive injected per IGMMA
            ser = any(n % 4 for n in d["igmma_per_wait"]) or d["warpgroup_arrive"] != d["igmma"] // 4
            bad += ser
            pp = d["parts_per_group"]
            parts.append(
                f"{d['per_group']:.1f}/group"
                + (f" ({d['instructions']} per {d['groups']})" if d["groups"] > 1 else "")
                + f" ({pp['promotion']:g}/{pp['plane']:g}/{pp['wgmma']:g}/{pp['book']:g}), "
                f"{d['igmma_per_wait']}, {d['bar_sync']}/{d['bar_arv']}, "
                f"{d['lds128_before_wait']} ({d['lds128_between_igmma']}), "
                f"{d['r2ur']}/{d['bssy']}, {d['empty_after_ffma']}"
                + (" SERIALISED" if ser else "")
            )
        print(head + " | " + " ; ".join(parts))
        if os.environ.get("E1_HIST"):
            for d in loops_of.get(k, []):
                print("    " + ", ".join(f"{o} {v}" for o, v in d["hist"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
