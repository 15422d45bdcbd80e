#!/usr/bin/env python3
"""Tune the matmul's configuration table on the GPU and write it back.

For each projection shape (tools/bench/shapes.py), each M bucket that --ms names (by default 1, 2,
4, 8, 16: m 1, 2, 3-4, 5-8, 9-16; above 16 the GEMM families', e.g. 32, 64, 128, 256, 512, 1024,
2048 as the table holds them; each timed at its largest M) and each resident layout, times every
configuration of the search space as CUDA-graph replays over rotating weight copies of ternary
content (activation quantisation included), keeps the fastest, and writes
native/src/cuda/dispatch/tuned_configs.inc (--write) plus the full measurements (--json). Needs a
tuning build of libpq2 (cmake -DPQ2_TUNING_KERNELS=ON: every configuration of the search space
compiled).

    python3 tools/tune/tune_matmul.py --write native/src/cuda/dispatch/tuned_configs.inc \
        --json tune.json

--write also regenerates the compiled kernel list (tools/tune/instances.py). Rebuild libpq2
afterwards: the table is compiled in. --from-json re-picks the entries of a saved tune without a
GPU; --partial replaces only the (layout, M bucket, shape) entries tuned in this run. Each entry
the table gets names the results file its measurements are in (the --json or --from-json file's
name; file it under tools/bench/results/), and no times: those, and the run's GPU, driver, date
and commit, are in that file.

A signal (Ctrl-C, SIGTERM from `timeout`) stops the run with exit status 128 + its number. During
the timing no table is written; with --json the measurements of every (shape, layout, M) finished
by then are saved, marked "interrupted", for --from-json --partial to re-pick. The table and the
kernel list derived from it are each written whole, and both or neither.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import instances  # noqa: E402
from shapes import SHAPES, pq2_bytes  # noqa: E402

from pyq2.lib.cuda import CONFIG_FIELDS, FAMILY_GEMM, FAMILY_GEMM_SM90, FAMILY_ROWBLOCK  # noqa: E402

M_BUCKETS = [1, 2, 4, 8, 16]  # each entry serves m up to this value
SEARCH_CHOICES = ("rowblock", "persistent", "splits", "coarse")  # what --search can name
# A configuration is a tuple in pq2_matmul_config's field order (CONFIG_FIELDS, pq2.h): the
# table's columns after (layout, m_max, n, k, layout_rt).
ROWBLOCK, GEMM, GEMM_SM90 = FAMILY_ROWBLOCK, FAMILY_GEMM, FAMILY_GEMM_SM90
FAMILY_NAMES = {ROWBLOCK: "ROWBLOCK", GEMM: "GEMM", GEMM_SM90: "GEMM_SM90"}
ROWBLOCK_MAX_M = instances.ROWBLOCK_MAX_M
# Within this fraction of the fastest, the lighter configuration wins (footprint()).
TIE = 0.02


def cfg(row_subtiles, warps, unroll, stages, blocks=0, splits=0):
    """A row-block configuration as a CONFIG_FIELDS tuple."""
    return (ROWBLOCK, row_subtiles, 0, warps, unroll, stages, blocks, splits)


def persistent_blocks(w):
    """Blocks per SM of a persistent grid of w-warp blocks: half or all of what 64 warps allow."""
    return sorted({max(1, 32 // w), 64 // w})


def search_space(layout, layout_rt, m, parts=SEARCH_CHOICES, warps=None, k=5120):
    """Configurations to time (refused ones are skipped when timed). parts: which grids and row
    shapes to search; warps: the warps per block to try instead of the defaults (powers of two).
    Above m = 16 only the GEMM families serve (tiles): their token tiles, depths and splits (the
    sm_90a family's are refused, so skipped, on other devices and where k is not a multiple of
    512)."""
    if m > ROWBLOCK_MAX_M:
        if layout == "tiles":
            for tokens, stages, splits in itertools.product((32, 64, 128), (2, 3, 4), (1, 2, 4, 8)):
                if k // 128 // splits >= 8:
                    yield (GEMM, 8, tokens, 8, 1, stages, 0, splits)
            for tokens, stages, splits in itertools.product((32, 64, 96, 128), (4, 6), (1, 2, 4)):
                if k // 128 // splits >= 8:
                    yield (GEMM_SM90, 8, tokens, 8, 1, stages, 0, splits)
            # wide blocks (a producer warpgroup), one or two groups a consumer iteration
            for (tokens, unroll), stages, splits in itertools.product(
                ((96, 1), (96, 2), (128, 1)), (4, 6), (1, 2, 4)
            ):
                if k // 128 // splits >= 8:
                    yield (GEMM_SM90, 8, tokens, 12, unroll, stages, 0, splits)
            # stream-K grids: as many blocks per SM as its launch bounds let stay resident
            for tokens, stages in itertools.product((32, 64, 96, 128), (4, 6)):
                for blocks in (1, 2) if tokens == 32 else (1,):
                    yield (GEMM_SM90, 8, tokens, 8, 1, stages, blocks, 1)
        return
    W = lambda default: tuple(warps) if warps else default  # noqa: E731
    if "rowblock" in parts and layout == "tiles":  # one block per row block, registers or ring
        for w, u, s in itertools.product(W((2, 4, 8, 16)), (1, 2), (1, 2, 3, 4, 6)):
            yield cfg(layout_rt, w, u, s)
        for w in W((4, 8, 16)):  # batches of 4 units (rt 2, m <= 8)
            yield cfg(layout_rt, w, 4, 1)
    if "persistent" in parts and layout == "tiles":  # register kernels on a persistent grid
        for w, u, s in itertools.product(W((2, 4, 8, 16)), (1, 2, 4), (1, 2)):
            for b in persistent_blocks(w):
                yield cfg(layout_rt, w, u, s, b)
    if "rowblock" in parts and layout == "planes":  # register kernels only (no ring)
        for rs, w, u, s in itertools.product((1, 2), W((2, 4, 8, 16)), (1, 2), (1, 2)):
            yield cfg(rs, w, u, s)
    if "splits" in parts:  # register kernels, row blocks split over 2-4 blocks
        row_subtiles = [layout_rt] if layout == "tiles" else [1, 2]
        for rs, w, u, s, sp in itertools.product(
            row_subtiles, W((4, 8, 16)), (1, 2), (1, 2), (2, 3, 4)
        ):
            yield cfg(rs, w, u, s, 0, sp)
    if "coarse" in parts and layout == "tiles" and layout_rt == 2 and 2 < m <= 8:
        # row blocks of two tile rows: each activation fragment serves 4 sub-tiles
        for w, s in itertools.product(W((4, 8, 16)), (1, 2)):
            yield cfg(4, w, 1, s)
        for w in W((4, 8, 16)):
            for b in persistent_blocks(w):
                yield cfg(4, w, 1, 1, b)


def footprint(c):
    """Order among near-equal configurations: register kernels before the shared-memory ring
    (stages >= 3), unsplit row blocks and tile grids before split ones and stream-K grids (less
    workspace). A call that holds 100 KB of shared memory per block keeps the next call's blocks
    from starting early in a chain of calls (one such table entry cost the M = 1 pass 0.26 ms
    while timing within 1% of the register kernel on its own)."""
    stages, splits = c[CONFIG_FIELDS.index("stages")], c[CONFIG_FIELDS.index("splits")]
    family, blocks = c[CONFIG_FIELDS.index("family")], c[CONFIG_FIELDS.index("blocks")]
    streamk = family == GEMM_SM90 and blocks > 0
    return (stages >= 3, splits > 1 or streamk)


def pick(cands):
    """(us, cfg) to keep from the timed (us, cfg) candidates of one shape and M."""
    fastest = min(us for us, _ in cands)
    near = [(footprint(c), us, c) for us, c in cands if us <= fastest * (1 + TIE)]
    return min(near, key=lambda t: (t[0], t[1]))[1:]


def picks(cands):
    """The (us, cfg) entries to keep for one shape and M: the fastest, and when that is an sm_90a
    configuration also the fastest of the other families, which serves where sm_90a does not run
    (dispatch/select.cu passes over sm_90a lines there)."""
    family = CONFIG_FIELDS.index("family")
    best = pick(cands)
    others = [(us, c) for us, c in cands if c[family] != GEMM_SM90]
    return [best, pick(others)] if best[1][family] == GEMM_SM90 and others else [best]


def tune(shapes, layouts, ms, replays, log, entries, rows, parts=SEARCH_CHOICES, warps=None):
    """Times the search space; appends to entries (table entries) and rows (every measurement)
    as each (shape, layout, M) finishes, so that an interrupted run keeps the finished ones."""
    import torch  # the GPU side only: --from-json runs without it
    from bench_matmul import copies_for, resident, time_pq2

    from pyq2.errors import Pq2Error
    from pyq2.lib.cuda import gemm_config, matmul_config

    for name in shapes:
        n, k, _ = SHAPES[name]
        for layout, layout_rt in layouts:
            ws = resident(n, k, layout, layout_rt, copies_for(pq2_bytes(n, k)))
            for m in ms:
                cands, measured = [], []
                space = list(search_space(layout, layout_rt, m, parts, warps, k))
                log(f"{name:8s} {layout}{layout_rt or ''} M={m:2d}: {len(space)} configurations")
                for c in space:
                    try:
                        cf = dict(zip(CONFIG_FIELDS, c, strict=True))
                        if cf["family"] in (GEMM, GEMM_SM90):
                            config = gemm_config(
                                cf["tokens"], cf["stages"], cf["splits"], cf["family"], cf["blocks"]
                            )
                        else:
                            del cf["family"], cf["tokens"]
                            config = matmul_config(**cf)
                        us = time_pq2(ws, m, config, replays=replays)
                    except Pq2Error as e:
                        if e.status_name != "PQ2_ERR_UNSUPPORTED":
                            raise
                        continue
                    measured.append(
                        {
                            "shape": name,
                            "layout": layout,
                            "layout_rt": layout_rt,
                            "m": m,
                            "config": dict(zip(CONFIG_FIELDS, c, strict=False)),
                            "us": us,
                        }
                    )
                    cands.append((us, c))
                kept = picks(cands)
                entries += [(layout, m, n, k, layout_rt, c, us) for us, c in kept]
                rows += measured
                best = kept[0]
                current = f"{time_pq2(ws, m, None, replays=replays):.1f} us"
                gbs = pq2_bytes(n, k) / (best[0] * 1e-6) / 1e9
                log(
                    f"{name:8s} {layout}{layout_rt or ''} M={m:2d}: best {best[0]:8.1f} us "
                    f"({gbs:5.0f} GB/s) {dict(zip(CONFIG_FIELDS, best[1], strict=True))}  "
                    f"(table now {current})"
                )
            del ws
            torch.cuda.empty_cache()


def table_key(line):
    """(LAYOUT, m_max, n, k, layout_rt) of a PQ2_TUNED(...) line of tuned_configs.inc."""
    f = [v.strip() for v in line[len("PQ2_TUNED(") :].split(")")[0].split(",")]
    return (f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4]))


def entry_line(layout, m, n, k, layout_rt, c, us, source=""):
    """A PQ2_TUNED(...) line; `source` (the results file of its measurements) follows it as a
    comment. The time `us` is not written: it is in that file."""
    family, *rest = c
    args = ", ".join(
        str(v) for v in (layout.upper(), m, n, k, layout_rt, FAMILY_NAMES[family], *rest)
    )
    return f"PQ2_TUNED({args})  // {source}" if source else f"PQ2_TUNED({args})"


def render_table(old_text, entries, source, partial):
    """The new table: the old file's header (less the per-run provenance lines older tables had:
    each entry names its results file instead) and fallback lines, the tuned entries citing
    `source`, and the old entries this run does not replace (another layout's, or with `partial`
    every entry whose (layout, m_max, n, k) was not tuned now)."""
    tuned_layouts = {e[0].upper() for e in entries}
    tuned_keys = {(e[0].upper(), e[1], e[2], e[3]) for e in entries}
    lines = old_text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("PQ2_TUNED("))
    header = [h for h in lines[:first] if not h.startswith("// Tuned on ")]
    keep, fallback = [], []
    in_fallback = False
    for line in lines[first:]:
        if line.startswith("// Fallback"):
            in_fallback = True
        if in_fallback:
            fallback.append(line)
        elif line.startswith("PQ2_TUNED("):
            key = table_key(line)
            replaced = key[:4] in tuned_keys if partial else key[0] in tuned_layouts
            if not replaced:
                keep.append((key, line))
    new = [(table_key(entry_line(*e)), entry_line(*e, source)) for e in entries]
    # an sm_90a line before a portable one of the same range: it serves first where it runs
    order = lambda kl: (*kl[0][:1], *kl[0][2:], kl[0][1], "GEMM_SM90," not in kl[1])  # noqa: E731
    body = [line for _, line in sorted(keep + new, key=order)]
    return "\n".join(header + body + [""] + fallback) + "\n"


def entries_from_json(path):
    """Re-pick the table entries of a saved tune (--json) without a GPU: (entries, env, the
    signal that interrupted the run or None)."""
    with open(path) as f:
        saved = json.load(f)
    groups = {}
    for r in saved["rows"]:
        c = r["config"]
        if c.get("family") not in FAMILY_NAMES:
            continue  # a kernel family this library no longer has (older result files)
        c = {"row_subtiles": c.get("row_subtiles", c.get("rt")), **c}  # "rt": older result files
        groups.setdefault((r["shape"], r["layout"], r["layout_rt"], r["m"]), []).append(
            (r["us"], tuple(c.get(f, 0) for f in CONFIG_FIELDS))
        )
    entries = []
    for (name, layout, layout_rt, m), cands in groups.items():
        n, k, _ = SHAPES[name]
        entries += [(layout, m, n, k, layout_rt, c, us) for us, c in picks(cands)]
    return entries, saved["env"], saved.get("interrupted")


def write_table(path, entries, partial, source):
    """Writes the table, its new entries citing the results file `source` (a file name, or "" for
    none), and, for the product's table, the compiled kernel list derived from it: each file
    whole or not at all (pyq2.atomic), and both or neither (a signal waits)."""
    from pyq2 import interrupts
    from pyq2.atomic import atomic_output

    with open(path) as f:
        old = f.read()
    text = render_table(old, entries, source, partial)
    files = [(path, text)]
    if os.path.abspath(path) == str(instances.TABLE):
        keys = instances.product_keys(instances.table_entries(text))
        files.append((str(instances.PRODUCT), instances.render(keys)))
    with interrupts.deferred():
        for out, content in files:
            with atomic_output(out, force=True) as tmp, open(tmp, "w") as f:
                f.write(content)
    if len(files) > 1:
        print(f"wrote {path} and {instances.PRODUCT}: {len(keys)} kernels; rebuild libpq2")


def parse_warps(ap, text):
    try:
        warps = [int(w) for w in text.split(",")]
    except ValueError:
        ap.error(f"--warps {text!r}: a comma-separated list of integers")
    if not warps or any(not 1 <= w <= 16 for w in warps):
        ap.error(f"--warps {text!r}: warps per block are 1..16")
    return warps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, M_BUCKETS)))
    ap.add_argument("--layouts", default="tiles:2,planes:0")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--write", help="tuned_configs.inc to write")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument(
        "--search",
        default=",".join(SEARCH_CHOICES),
        help="what to search: rowblock (one block per row block), persistent (a "
        "persistent grid: config blocks > 0), splits (row blocks split over "
        "several blocks), coarse (tiles rt 2, 2 < m <= 8: row blocks of two tile "
        "rows)",
    )
    ap.add_argument(
        "--warps",
        help="warps per block to search, e.g. 3,4,5,6,8 (default: powers of two, 2 or 4 to 16)",
    )
    ap.add_argument("--from-json", help="no GPU: re-pick the entries of a saved --json tune")
    ap.add_argument(
        "--partial",
        action="store_true",
        help="--write replaces only the (layout, M bucket, shape) entries tuned now",
    )
    args = ap.parse_args(argv)
    warps = parse_warps(ap, args.warps) if args.warps is not None else None
    parts = tuple(args.search.split(","))
    if any(p not in SEARCH_CHOICES for p in parts):
        ap.error(f"--search {args.search!r}: choose from {', '.join(SEARCH_CHOICES)}")
    from pyq2 import interrupts

    installed = interrupts.install()
    try:
        if args.from_json:
            return repick(ap, args)
        return tune_and_write(args, parts, warps)
    except KeyboardInterrupt as e:  # a signal outside the tuning loop (tune_and_write's own)
        return interrupts.report(e, "tune_matmul")
    finally:
        if installed:
            interrupts.uninstall()


def repick(ap, args):
    """--from-json: the saved tune's picks, written to --write and printed."""
    entries, _, interrupted = entries_from_json(args.from_json)
    if interrupted and args.write and not args.partial:
        ap.error(
            f"--from-json {args.from_json}: that tune was interrupted ({interrupted}) and "
            "holds only part of the search; a full --write would drop every entry it lacks "
            "(add --partial)"
        )
    if args.write:
        write_table(args.write, entries, args.partial, os.path.basename(args.from_json))
    for e in sorted(entries, key=lambda e: (e[0], e[2], e[3], e[1])):
        print(
            f"{e[0]} n={e[2]} k={e[3]} M<={e[1]}: "
            f"{dict(zip(CONFIG_FIELDS, e[5], strict=True))} {e[6]:.1f} us"
        )
    return 0


def tune_and_write(args, parts, warps):
    """The GPU run of main(): tune, then write the table and the measurements; on a signal,
    only the measurements finished by then (exit status 128 + the signal's number)."""
    from pyq2 import interrupts

    layouts = [(a, int(b)) for a, b in (v.split(":") for v in args.layouts.split(","))]
    env, entries, rows = None, [], []
    try:
        env = gpu_environment()
        tune(
            args.shapes.split(","),
            layouts,
            [int(m) for m in args.ms.split(",")],
            args.replays,
            lambda s: print(s, flush=True),
            entries,
            rows,
            parts,
            warps,
        )
    except KeyboardInterrupt as e:
        signum = interrupts.signum_of(e)
        name = interrupts.signal_name(signum)
        done = len({(r["shape"], r["layout"], r["layout_rt"], r["m"]) for r in rows})
        saved = args.json and env is not None
        kept = f"; the {done} finished (shape, layout, M) saved to {args.json}" if saved else ""
        if args.json and env is None:
            kept = f"; nothing was measured, {args.json} is not written"
        print(f"tune_matmul: interrupted ({name}): the table is not written{kept}", file=sys.stderr)
        if saved:
            write_json(args.json, env, entries, rows, interrupted=name)
        return 128 + signum
    if args.write:
        source = os.path.basename(args.json) if args.json else ""
        write_table(args.write, entries, args.partial, source)
    if args.json:
        write_json(args.json, env, entries, rows)
    return 0


def gpu_environment():
    """Initialise libpq2 on the GPU (warning when it is not a tuning build); the run's env."""
    from pyq2.lib import native as _native
    from pyq2.runtime.timing import environment

    ffi, lib = _native.load()
    _native.check(lib.pq2_cuda_init())
    if not lib.pq2_built_with_tuning_kernels():
        print(
            "warning: libpq2 is not a tuning build (-DPQ2_TUNING_KERNELS=ON): only the tuned "
            "table's kernels are compiled, the rest of the search space is refused",
            file=sys.stderr,
        )
    return environment()


def write_json(path, env, entries, rows, interrupted=None):
    """The run's measurements (rows) and picks (best), whole or not at all (pyq2.atomic);
    `interrupted` names the signal that cut the run short."""
    from pyq2.atomic import atomic_output

    best = [
        dict(
            layout=e[0],
            m_max=e[1],
            n=e[2],
            k=e[3],
            layout_rt=e[4],
            config=dict(zip(CONFIG_FIELDS, e[5], strict=False)),
            us=e[6],
        )
        for e in entries
    ]
    saved = {"env": env, "rows": rows, "best": best}
    if interrupted:
        saved["interrupted"] = interrupted
    with atomic_output(path, force=True) as tmp, open(tmp, "w") as f:
        json.dump(saved, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
