#!/usr/bin/env python3
"""Tune the decode family's configuration table on the GPU and write it back.

For each shape of TARGETS.md, each M bucket (1, 2, 3-4, 5-8, 9-16, timed at its largest M) and
each resident layout, times every configuration of the search space as CUDA-graph replays over
rotating weight copies of ternary content (activation quantisation included), keeps the fastest,
and writes native/src/cuda/decode_table.inc (--write) plus the full measurements (--json).

    python3 tools/tune_decode.py --write native/src/cuda/decode_table.inc --json tune.json
Rebuild libpq2 afterwards: the table is compiled in.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

from decode_shapes import SHAPES, pq2_bytes
from pyq2 import _native
from pyq2.errors import Pq2Error
from pyq2.gpu import CONFIG_FIELDS, FAMILIES, decode_config

M_BUCKETS = [1, 2, 4, 8, 16]  # each entry serves m up to this value
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout
FAMILY_CHOICES = ("stream", "rowblock", "persistent", "splits", "coarse")  # what --families can name


def persistent_blocks(w):
    """Blocks per SM of a persistent grid of w-warp blocks: half or all of what 64 warps allow."""
    return sorted({max(1, 32 // w), 64 // w})


def search_space(layout, layout_rt, m, wide=False, families=FAMILY_CHOICES, warps=None):
    """Configurations to time: tuples in CONFIG_FIELDS order (refused ones are skipped). warps:
    the warps per block of the register families (rowblock, persistent, splits, coarse) instead
    of their defaults (powers of two)."""
    reg_warps = tuple(warps) if warps else None
    W = lambda default: reg_warps or default  # noqa: E731
    rts = [layout_rt] if layout == "tiles" else [1, 2, 4]
    if "stream" in families:
        ws, unrolls, stages = ((2, 4, 8), (1, 2, 4), (2, 3, 4, 6)) if wide else ((4, 8), (1, 2, 4), (2, 3, 4))
        for rt, w, u, s in itertools.product(rts, ws, unrolls, stages):
            yield (rt, w, u, s, 0, 0, 0)
    if "rowblock" in families and layout == "tiles":  # one block per row block
        for w, u, s in itertools.product(W((2, 4, 8, 16)), (1, 2), (1, 2, 3, 4, 6)):
            yield (layout_rt, w, u, s, 0, 1, 0)
        for w in W((4, 8, 16)):  # batches of 4 units (rt 2, m <= 8)
            yield (layout_rt, w, 4, 1, 0, 1, 0)
    if "persistent" in families and layout == "tiles":  # register kernels on a persistent grid:
        for w, u, s in itertools.product(W((2, 4, 8, 16)), (1, 2, 4), (1, 2)):
            for b in persistent_blocks(w):
                yield (layout_rt, w, u, s, b, 1, 0)
    if "rowblock" in families and layout == "planes":  # register kernels only (no ring)
        for rt, w, u, s in itertools.product((1, 2), W((2, 4, 8, 16)), (1, 2), (1, 2)):
            yield (rt, w, u, s, 0, 1, 0)
    if "splits" in families:  # register kernels, row blocks split over 2-4 blocks
        rts = [layout_rt] if layout == "tiles" else [1, 2]
        for rt, w, u, s, sp in itertools.product(rts, W((4, 8, 16)), (1, 2), (1, 2), (2, 3, 4)):
            yield (rt, w, u, s, 0, 1, sp)
    if "coarse" in families and layout == "tiles" and layout_rt == 2 and 2 < m <= 8:  # rt 4 row blocks
        for w, s in itertools.product(W((4, 8, 16)), (1, 2)):  # on rt 2 tiles: two tile rows per
            yield (4, w, 1, s, 0, 1, 0)  # block, each activation fragment used for 4 sub-tiles
        for w in W((4, 8, 16)):
            for b in persistent_blocks(w):
                yield (4, w, 1, 1, b, 1, 0)


# Within this fraction of the fastest, the lighter configuration wins (footprint()).
TIE = 0.02


def footprint(cfg):
    """Order among near-equal configurations: register kernels before the shared-memory ring
    (stages >= 3), unsplit row blocks before split ones. A call that holds 100 KB of shared
    memory per block keeps the next call's blocks from starting early in a chain of calls
    (bench/NOTES.md v8c: one such table entry cost the decode pass 0.26 ms while timing within
    1% of the register kernel on its own)."""
    rt, warps, unroll, stages, blocks, family, splits = cfg
    return (stages >= 3, splits > 1)


def pick(cands):
    """(us, cfg) to keep from the timed (us, cfg) candidates of one shape and M."""
    fastest = min(us for us, _ in cands)
    return min(((footprint(c), us, c) for us, c in cands if us <= fastest * (1 + TIE)),
               key=lambda t: (t[0], t[1]))[1:]


def tune(shapes, layouts, ms, replays, log, wide=False, families=FAMILY_CHOICES, warps=None):
    import torch  # the GPU side only: --from-json runs without it

    from bench_decode import copies_for, resident, time_pq2

    entries, rows = [], []
    for name in shapes:
        n, k, _ = SHAPES[name]
        for layout, layout_rt in layouts:
            ws = resident(n, k, layout, layout_rt, copies_for(pq2_bytes(n, k)))
            for m in ms:
                cands = []
                for cfg in search_space(layout, layout_rt, m, wide, families, warps):
                    try:
                        us = time_pq2(ws, m, decode_config(*cfg), replays=replays)
                    except Pq2Error as e:
                        if e.status_name != "PQ2_ERR_UNSUPPORTED":
                            raise
                        continue
                    rows.append({"shape": name, "layout": layout, "layout_rt": layout_rt, "m": m,
                                 "config": dict(zip(CONFIG_FIELDS, cfg)), "us": us})
                    cands.append((us, cfg))
                best = pick(cands)
                try:  # the table being rewritten may name an instance the library no longer has
                    current = f"{time_pq2(ws, m, None, replays=replays):.1f} us"
                except Pq2Error as e:
                    if e.status_name != "PQ2_ERR_UNSUPPORTED":
                        raise
                    current = "unsupported by this build"
                gbs = pq2_bytes(n, k) / (best[0] * 1e-6) / 1e9
                log(f"{name:8s} {layout}{layout_rt or ''} M={m:2d}: best {best[0]:8.1f} us ({gbs:5.0f} GB/s) "
                    f"{dict(zip(CONFIG_FIELDS, best[1]))}  (current table/fallback {current})")
                entries.append((layout, m, n, k, layout_rt, best[1], best[0]))
            del ws
            torch.cuda.empty_cache()
    return entries, rows


FAMILY_NAMES = {v: k.upper() for k, v in FAMILIES.items()}  # the table macro's names


def tuned_keys(entries):
    """The (LAYOUT, m_max, n, k) keys of table entries."""
    return {(e[0].upper(), e[1], e[2], e[3]) for e in entries}


def table_fields(line):
    """(LAYOUT, m_max, n, k, layout_rt) of a PQ2_TUNED(...) line of decode_table.inc."""
    f = [v.strip() for v in line[len("PQ2_TUNED("):].split(")")[0].split(",")]
    return (f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4]))


def render_table(entries, env, keep=(), note=""):
    """The table text: the tuned entries plus `keep` (existing PQ2_TUNED lines of layouts not
    tuned in this run, with their provenance comments)."""
    lines = [
        "// The decode families' tuned configurations: one line per (layout, m range, shape).",
        "// Rewritten by tools/tune_decode.py from measurements on the GPU; shapes not listed use",
        "// fallback_config() in dispatch.cu.",
        f"// Generated {env['date']} on {env['gpu']} ({env['nvidia_smi']}), commit {env['commit']}"
        f" (layouts {', '.join(sorted({e[0] + str(e[4] or '') for e in entries}))}){note}.",
    ]
    lines += [line for line in keep if line.startswith("// ") and "Generated" in line]
    lines += ["//",
              "// PQ2_TUNED(layout, m_max, n, k, layout_rt, family, rt, warps, unroll, stages, blocks, splits)  // us"]
    rows = []
    for line in keep:
        if line.startswith("PQ2_TUNED("):
            layout, m, n, k, layout_rt = table_fields(line)
            rows.append(((layout, n, k, layout_rt, m), line))
    for layout, m, n, k, layout_rt, cfg, us in entries:
        rt, warps, unroll, stages, blocks, family, splits = cfg
        args = ", ".join(str(v) for v in (layout.upper(), m, n, k, layout_rt, FAMILY_NAMES[family],
                                          rt, warps, unroll, stages, blocks, splits))
        rows.append(((layout.upper(), n, k, layout_rt, m), f"PQ2_TUNED({args})  // {us:.1f} us"))
    lines += [line for _, line in sorted(rows)]
    return "\n".join(lines) + "\n"


def kept_lines(path, tuned_layouts, tuned=None):
    """Lines of an existing table this run does not replace: those of layouts it does not tune,
    or, with `tuned` (a set of (LAYOUT, m_max, n, k) keys), every entry whose key is not in it
    (a partial re-tune: --ms or --shapes a subset), plus the provenance comments."""
    try:
        with open(path) as f:
            old = f.read().splitlines()
    except FileNotFoundError:
        return []
    names = {layout.upper() for layout, _ in tuned_layouts}
    keep = []
    for line in old:
        if line.startswith("PQ2_TUNED("):
            key = table_fields(line)[:4]
            if (key not in tuned) if tuned is not None else (key[0] not in names):
                keep.append(line)
        elif line.startswith("// ") and "Generated" in line and (tuned is not None or any(
                f"layouts {n.lower()}" in line or f"{n} lines" in line for n in {"PLANES", "TILES"} - names)):
            keep.append(line)
    return keep


def entries_from_json(path):
    """Re-pick the table entries of a saved tune (--json) without a GPU: (entries, env)."""
    with open(path) as f:
        saved = json.load(f)
    groups = {}
    for r in saved["rows"]:
        cfg = tuple(r["config"].get(f, 0) for f in CONFIG_FIELDS)
        groups.setdefault((r["shape"], r["layout"], r["layout_rt"], r["m"]), []).append((r["us"], cfg))
    entries = []
    for (name, layout, layout_rt, m), cands in groups.items():
        us, cfg = pick(cands)
        n, k, _ = SHAPES[name]
        entries.append((layout, m, n, k, layout_rt, cfg, us))
    return entries, saved["env"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, M_BUCKETS)))
    ap.add_argument("--layouts", default="tiles:2,planes:0")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--write", help="decode_table.inc to write")
    ap.add_argument("--json")
    ap.add_argument("--wide", action="store_true", help="the larger search space")
    ap.add_argument("--families", default=",".join(FAMILY_CHOICES),
                    help="kernel families to search: stream, rowblock, persistent (row-block kernels "
                         "on a persistent grid: config blocks > 0), splits (row blocks split over "
                         "several blocks: config splits > 1), coarse (tiles rt 2, 2 < m <= 8: "
                         "rt 4 row blocks, two tile rows each)")
    ap.add_argument("--warps", help="warps per block to search in the register families, e.g. 3,4,5,6,8 "
                                    "(default: powers of two, 2 or 4 to 16)")
    ap.add_argument("--from-json", help="no GPU: re-pick the entries of a saved --json tune and --write them")
    ap.add_argument("--partial", action="store_true",
                    help="--write replaces only the (layout, M bucket, shape) entries tuned in this run "
                         "and keeps the rest of the table (a re-tune of some M buckets or shapes)")
    args = ap.parse_args(argv)
    warps = None  # the register families' defaults
    if args.warps is not None:
        try:
            warps = [int(w) for w in args.warps.split(",")]
        except ValueError:
            ap.error(f"--warps {args.warps!r}: a comma-separated list of integers")
        if not warps or any(not 1 <= w <= 16 for w in warps):
            ap.error(f"--warps {args.warps!r}: warps per block are 1..16")
    if args.from_json:
        entries, env = entries_from_json(args.from_json)
        if args.write:
            layouts = sorted({(e[0], e[4]) for e in entries})
            keep = kept_lines(args.write, layouts, tuned_keys(entries) if args.partial else None)
            with open(args.write, "w") as f:
                where = os.path.relpath(os.path.abspath(args.from_json), ROOT)
                note = f"; {'partial: these entries only, ' if args.partial else 'entries '}re-picked from {where}"
                f.write(render_table(entries, env, keep, note=note))
        for e in sorted(entries, key=lambda e: (e[0], e[2], e[3], e[1])):
            print(f"{e[0]} n={e[2]} k={e[3]} M<={e[1]}: {dict(zip(CONFIG_FIELDS, e[5]))} {e[6]:.1f} us")
        return 0
    from bench_decode import environment

    _native.check(_native.load()[1].pq2_cuda_init())
    env = environment()
    layouts = [(a, int(b)) for a, b in (v.split(":") for v in args.layouts.split(","))]
    entries, rows = tune(args.shapes.split(","), layouts, [int(m) for m in args.ms.split(",")],
                         args.replays, lambda s: print(s, flush=True), args.wide,
                         tuple(args.families.split(",")),
                         warps)
    if args.write:
        keep = kept_lines(args.write, layouts, tuned_keys(entries) if args.partial else None)
        with open(args.write, "w") as f:
            f.write(render_table(entries, env, keep, note="; partial: these entries only" if args.partial else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows,
                       "best": [dict(layout=e[0], m_max=e[1], n=e[2], k=e[3], layout_rt=e[4],
                                     config=dict(zip(CONFIG_FIELDS, e[5])), us=e[6]) for e in entries]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
