#!/usr/bin/env python3
"""Source trees with one link of a decode call knocked out, for timing only (their results are
wrong on purpose): bench/NOTES.md v11d, v16b, v16e. Each tree is `git archive REV` into exp/NAME
(without bench/results) with one patch applied and REV's commit in exp/NAME/.commit; time them
beside the real code in one device call with tools/ab_tune.sh (tuned per shape and M) or
tools/ab_pass.sh (the M = 1 pass):

    python3 tools/knockout_trees.py base qempty qnoload qnodiv qnobits
    # device tool, carry [".whl", "exp/base", "exp/qempty", ...]:
    #   bash tools/ab_pass.sh base qempty qnoload qnodiv qnobits
    #   MS=1 bash tools/ab_tune.sh base nowait qempty

    base     no knockout: REV itself, the reference to time them against

Knockouts (M = 1 row-block kernels and the quantiser):
    nowait   the matmul does not wait for the quantiser grid (PDL launch only)
    qempty   the quantiser returns right after its PDL wait (and the counter clearing)
    qnobits  the quantiser writes no bit slices
    qnoload  the quantiser loads no x (values from the lane and group instead)
    qnodiv   the quantiser rounds x * (1 / scale) without its near-half check (and the divisions
             that check can call; before v17b: instead of its four correctly rounded divisions)
    noact    the M = 1 loop loads no activations (constants instead)
    noquant  pq2_matmul_cuda at m == 1 launches no quantiser: each matmul waits on the previous
             matmul directly (one grid per call; the workspace's stale activations)
M > 2 (v16b; the stages 1 loop without running pointers, which the tuned M = 4/8 kernels run):
    actg2    the B fragments and records come from two groups only (L1-resident)
    acttok0  every B column reads token 0 (one line per fragment load instead of m)
    wl2      the weights of every batch after the first re-read batch 0 or 1 (L2-resident; the
             running-pointer loops of m == 1 and m <= 8 re-read batch 0)
    wnone    no weight loads after the first batch (its codes perturbed per batch instead)
    compute  wnone and no activation loads at m > 2 (B fragments and records from the group index)
A name A+B applies both knockouts to one tree, exp/A-B (e.g. noquant+noact).
Patches are (path, anchor, replacement, anchor, replacement, ...).
A patch whose anchor text is gone fails loudly: update it with the code it knocks out.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWBLOCK = "native/src/cuda/decode_rowblock.cu"
QUANT = "native/src/cuda/quantize.cu"

# The weight loads after the first batch, knocked out (wnone; compute too).
NO_WEIGHT_LOADS = (
    "                if (i > 0) src.load(b0, i, min(len - i, U));\n",
    "                if (i > 0)  // KNOCKOUT (timing only): no weight loads after the first batch\n"
    "                    for (int u = 0; u < U; ++u)\n"
    "                        for (int r = 0; r < RT; ++r) b0.codes[u][r].x ^= (unsigned)i;\n",
    "                src.advance(U), a.template advance<TOKS>(U);\n"
    "                src.load(b0, 0, min(len - i, U));\n",
    "                a.template advance<TOKS>(U);  // KNOCKOUT: no weight loads after the first batch\n"
    "                for (int u = 0; u < U; ++u)\n"
    "                    for (int r = 0; r < RT; ++r) b0.codes[u][r].x ^= (unsigned)i;\n"
)

PATCHES = {
    "base": (ROWBLOCK,),  # no patch: the reference tree (REV as it is, without bench/results)
    "nowait": (ROWBLOCK,
               "    if (STAGES == 2 && len > U) src.load(b1, U, min(len - U, U));\n"
               "    pq2_pdl_handoff();  // the quantiser's outputs are read only after this\n",
               "    if (STAGES == 2 && len > U) src.load(b1, U, min(len - U, U));\n"
               "    // KNOCKOUT (timing only): m == 1 does not wait for the quantiser.\n"
               "    if constexpr (TOKS == 1) {\n"
               "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
               "        asm volatile(\"griddepcontrol.launch_dependents;\");\n"
               "#endif\n"
               "    } else {\n"
               "        pq2_pdl_handoff();\n"
               "    }\n"),
    "qempty": (QUANT,
               "    const int lane = threadIdx.x & 31;\n    const int64_t groups = k >> 7;",
               "    if (n_zero >= 0) return;  // KNOCKOUT (timing only): no work after the PDL wait\n"
               "    const int lane = threadIdx.x & 31;\n    const int64_t groups = k >> 7;"),
    "qnobits": (QUANT,
                "    if (bits) bitslice_group(qs, lane, bits + (size_t)task * PQ2_BITS_GROUP_WORDS);",
                "    (void)qs;  // KNOCKOUT (timing only): no bit slices"),
    "noact": (ROWBLOCK,
              "        const uint4 bx = __ldg(A.xb + (unsigned)g * (PQ2_BITS_GROUP_WORDS / 4));\n"
              "        const int ns = __ldg(A.sums + (unsigned)g) * lc.c_neg;\n"
              "        const float xs = __ldg(A.xs + (unsigned)g);",
              "        // KNOCKOUT (timing only): no activation loads.\n"
              "        const uint32_t h = (unsigned)g * 0x9E3779B9u ^ (uint32_t)lc.f2;\n"
              "        const uint4 bx = make_uint4(h, h * 3u, h & 0xAAAAAAAAu, (h * 3u) & 0xAAAAAAAAu);\n"
              "        const int ns = lc.c_neg;\n"
              "        const float xs = 1.0f;"),
    "actg2": (ROWBLOCK,
              "        const unsigned ug = (unsigned)(g + A.g0);\n",
              "        const unsigned ug = (unsigned)((g & 1) + A.g0);  // KNOCKOUT (timing only): two groups\n"),
    "acttok0": (ROWBLOCK,
                "        const int b_tok = CP ? min(gid & 1, p.m - 1) : min(nt * 8 + gid, p.m - 1);\n",
                "        const int b_tok = CP ? min(gid & 1, p.m - 1) : 0;  // KNOCKOUT (timing only): token 0\n"),
    "wl2": (ROWBLOCK,
            "                if (i > 0) src.load(b0, i, min(len - i, U));\n",
            "                if (i > 0) src.load(b0, ((i / U) & 1) * U, min(len - i, U));  // KNOCKOUT: L2-resident\n",
            "                src.advance(U), a.template advance<TOKS>(U);\n",
            "                a.template advance<TOKS>(U);  // KNOCKOUT: the weights of batch 0 again\n",
            "                    src.advance(1);\n",
            "                    // KNOCKOUT: the weights of unit 0 again\n"),
    "wnone": (ROWBLOCK, *NO_WEIGHT_LOADS),
    "compute": (ROWBLOCK, *NO_WEIGHT_LOADS,
                "                ld_planes8(A.q[nt] + ug * 128u, bq[nt]);\n",
                "                for (int s = 0; s < 4; ++s)  // KNOCKOUT: no activation loads\n"
                "                    bq[nt][s] = make_uint2(ug * 0x9E3779B9u + s, ug ^ (unsigned)(s + nt));\n",
                "                for (int s = 0; s < 4; ++s) bq[nt][s] = __ldg(reinterpret_cast<const uint2 *>(A.q[nt] + ug * 128u + s * 32));\n",
                "                for (int s = 0; s < 4; ++s)  // KNOCKOUT: no activation loads\n"
                "                    bq[nt][s] = make_uint2(ug * 0x9E3779B9u + s, ug ^ (unsigned)s);\n",
                "                const int4 rc = __ldg(A.rec + ug * PQ2_TC_PAIRS);\n",
                "                const int4 rc = make_int4(-(int)ug, 1 - (int)ug, 0x3f800000, 0x3f000000);  // KNOCKOUT\n"),
    "noquant": ("native/src/cuda/dispatch.cu",
                "    PQ2_CHECK(pq2_quantize_launch(fn, x, x_dtype, m, c.v.k, c.bits ? nullptr : q8, xs, sums, c.bits,",
                "    if (m > 1 || n_counters > 0)  // KNOCKOUT (timing only): m == 1 launches no quantiser\n"
                "    PQ2_CHECK(pq2_quantize_launch(fn, x, x_dtype, m, c.v.k, c.bits ? nullptr : q8, xs, sums, c.bits,"),
    "qnoload": (QUANT,
                "    load4<DTYPE>(xp, v);\n",
                "    for (int j = 0; j < 4; ++j)  // KNOCKOUT (timing only): no x load\n"
                "        v[j] = (float)((lane * 4 + j) * 37 % 255 - 127) * (float)(g + 1);\n"),
    "qnodiv": (QUANT,
               "    rint_quotients(v, div, rcp, q);\n",
               "    for (int j = 0; j < 4; ++j) q[j] = rintf(v[j] * rcp);  // KNOCKOUT (timing only): no near-half check\n"),
}


def make_tree(name: str, rev: str) -> Path:
    """exp/NAME ('+' becomes '-'): REV with the knockouts of NAME's '+'-separated parts."""
    dest = ROOT / "exp" / name.replace("+", "-")
    if dest.exists():
        raise SystemExit(f"{dest} exists; remove it first")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = [m for m in tar.getmembers() if not m.name.startswith("bench/results/")]
        tar.extractall(dest, members=members, filter="data")
    for part in name.split("+"):
        path, *pairs = PATCHES[part]
        src = dest / path
        text = src.read_text()
        for anchor, replacement in zip(pairs[::2], pairs[1::2]):
            if text.count(anchor) != 1:
                raise SystemExit(f"{part}: the anchor text occurs {text.count(anchor)} times in {path} at {rev} "
                                 "(expected once); update PATCHES")
            text = text.replace(anchor, replacement)
        src.write_text(text)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                            capture_output=True, text=True).stdout.strip()
    (dest / ".commit").write_text(commit if name == "base" else f"{commit} knockout {name}")
    return dest


def knockout_name(arg: str) -> str:
    """argparse type: one knockout or several joined by '+'."""
    parts = arg.split("+")
    unknown = [p for p in parts if p not in PATCHES]
    if unknown or (len(parts) > 1 and "base" in parts):
        raise argparse.ArgumentTypeError(f"unknown knockout {', '.join(unknown) or 'base'} in {arg!r} "
                                         f"(choose from {', '.join(sorted(PATCHES))})")
    return arg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", type=knockout_name, metavar="NAME",
                    help=f"one of {', '.join(sorted(PATCHES))}, or several joined by '+'")
    ap.add_argument("--rev", default="HEAD", help="commit to patch (default HEAD)")
    args = ap.parse_args()
    for name in args.names:
        dest = make_tree(name, args.rev)
        print(f"{dest.relative_to(ROOT)}: {args.rev} with the '{name}' knockout", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
