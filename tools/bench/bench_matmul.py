#!/usr/bin/env python3
"""Matmul benchmark: pyq2 against the GPU's read bandwidth and cuBLAS bf16, in ONE run.

Measures, on the current GPU:
  1. the read bandwidth (a Triton streaming read of 2 GiB);
  2. cuBLAS bf16 dense (torch x @ w.T) and pyq2 (pq2_matmul_cuda, activation quantisation
     included) on the six projection shapes of Ternary-Bonsai-2-27B (shapes.py) at M = 1, 2, 4,
     8, 16, with rotating weight copies
     (>= 4 copies and >= 256 MB, so HBM is measured, not L2) of real ternary content (codes
     0/1/2 about a third each), each as CUDA-graph replays after a 50 ms warm-up of replays, median
     of repeated replays;
  3. the whole 257-projection decode pass at M = 1: 257 distinct resident weight matrices
     (6.8 GB) in one CUDA graph, against its byte floor (bytes / read bandwidth).
Prints a table last and writes JSON (--json). Needs torch with CUDA, triton, and pyq2 installed
with CUDA (or PYQ2_LIBRARY pointing at a CUDA build of libpq2).

    python3 tools/bench/bench_matmul.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch
from shapes import SHAPES, pq2_bytes

from pyq2.lib import cpu as host
from pyq2.lib import native as _native
from pyq2.lib.cuda import PQ2Weights
from pyq2.runtime.timing import environment

TARGET_M1 = {
    "gate_up": 0.85,
    "lm_head": 0.85,
    "in_proj": 0.75,
    "qkv": 0.75,
    "down": 0.75,
    "out": 0.55,
}
ROTATE_BYTES = 256 << 20
# Warm-up of every benchmark measurement, in milliseconds of graph replays. The first ~10 ms of
# heavy streaming after a multi-GB free (the cuBLAS timing of the shape before) run ~10% slow
# whatever the idle time between (lm_head M=1: 90.6 us, then 81.2 us): three replays are not
# enough for the big shapes.
WARMUP_MS = 50.0


# ---- timing ---------------------------------------------------------------------------------


def graph_time_us(fns, replays=30, warmup=3, warmup_ms=0.0):
    """Median microseconds per call of fns (run in order) captured once in a CUDA graph, after
    `warmup` replays and then more until warmup_ms of them have run."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:  # warm up outside capture (module load, handles)
            f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for f in fns:
            f()
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    if warmup_ms > 0:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(100000):
            g.replay()
            if i % 8 == 7:
                b.record()
                b.synchronize()
                if a.elapsed_time(b) >= warmup_ms:
                    break
        torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / len(fns))
    del g
    return statistics.median(times), times


def read_bandwidth_gbs(nbytes=2 << 30, reps=30):
    import triton
    import triton.language as tl

    @triton.jit
    def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0)
        tl.store(out_ptr + pid, tl.sum(v, axis=0))

    x = torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device="cuda")
    BLOCK = 8192
    grid = (triton.cdiv(x.numel(), BLOCK),)
    out = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    f = lambda: _read[grid](x, out, x.numel(), BLOCK=BLOCK)  # noqa: E731
    us, _ = graph_time_us([f], replays=reps)
    return nbytes / (us * 1e-6) / 1e9


# ---- weights --------------------------------------------------------------------------------


def ternary_planes(n, k, seed=0):
    """Real-ternary-like planes bytes (codes 0/1/2 uniformly, fp16 scales) on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    c = torch.randint(0, 3, (n, k // 4, 4), dtype=torch.uint8, device="cuda", generator=g)
    codes = c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)
    scales = (torch.rand(n, k // 128, device="cuda", generator=g) * 0.02 + 0.001).half()
    return torch.cat([codes.reshape(-1), scales.reshape(-1).view(torch.uint8)])


def resident(n, k, layout, rt, copies, seed=0):
    planes = ternary_planes(n, k, seed)
    if layout == "tiles":
        buf = torch.from_numpy(
            host.convert_layout(planes.cpu().numpy(), n, k, "planes", "tiles", 0, rt)
        ).cuda()
    else:
        buf = planes
    out = [
        PQ2Weights(buf if i == 0 else buf.clone(), n, k, layout, rt if layout == "tiles" else 0)
        for i in range(copies)
    ]
    return out


def copies_for(nbytes):
    return max(4, math.ceil(ROTATE_BYTES / nbytes))


# ---- measurements ---------------------------------------------------------------------------


def time_pq2(ws, m, cfg=None, replays=30, warmup_ms=0.0):
    x = torch.randn(m, ws[0].k, device="cuda").to(torch.bfloat16)
    y = torch.empty(m, ws[0].n, dtype=torch.bfloat16, device="cuda")
    work = torch.empty(max(w.workspace_size(m, cfg) for w in ws), dtype=torch.uint8, device="cuda")
    structs = [w.struct() for w in ws]
    fns = [
        lambda w=w, s=s: w.matmul(x, out=y, workspace=work, cfg=cfg, w_struct=s)
        for w, s in zip(ws, structs, strict=False)
    ]
    return graph_time_us(fns, replays=replays, warmup_ms=warmup_ms)[0]


def time_cublas(n, k, m, replays=30, warmup_ms=0.0):
    copies = copies_for(n * k * 2)
    w0 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    ws = [w0] + [w0.clone() for _ in range(copies - 1)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    fns = [lambda w=w: torch.matmul(x, w.T) for w in ws]
    us = graph_time_us(fns, replays=replays, warmup_ms=warmup_ms)[0]
    del ws, w0
    torch.cuda.empty_cache()
    return us


def decode_pass(layout, rt, read_gbs, replays=20, warmup_ms=0.0):
    """257 distinct resident matrices at M = 1 in one graph, in layer order."""
    per_shape = {}
    for name, (n, k, calls) in SHAPES.items():
        per_shape[name] = resident(n, k, layout, rt, calls, seed=1)
    order = []
    for layer in range(64):
        full_attn = layer % 4 == 3  # 16 full-attention layers, 48 Gated-DeltaNet
        if full_attn:
            order.append(per_shape["qkv"][layer // 4])
        else:
            order.append(per_shape["in_proj"][layer - layer // 4])
        order += [per_shape["out"][layer], per_shape["gate_up"][layer], per_shape["down"][layer]]
    order.append(per_shape["lm_head"][0])
    assert len(order) == 257 and len({id(w) for w in order}) == 257
    total = sum(pq2_bytes(w.n, w.k) for w in order)
    xs = {k_: torch.randn(1, k_, device="cuda").to(torch.bfloat16) for k_ in (5120, 6144, 17408)}
    ys = {
        n_: torch.empty(1, n_, dtype=torch.bfloat16, device="cuda") for n_ in {w.n for w in order}
    }
    work = torch.empty(max(w.workspace_size(1) for w in order), dtype=torch.uint8, device="cuda")
    structs = [w.struct() for w in order]
    fns = [
        lambda w=w, s=s: w.matmul(xs[w.k], out=ys[w.n], workspace=work, w_struct=s)
        for w, s in zip(order, structs, strict=False)
    ]
    us_per_call = graph_time_us(fns, replays=replays, warmup_ms=warmup_ms)[0]
    pass_ms = us_per_call * 257 / 1000
    floor_ms = total / (read_gbs * 1e9) * 1000
    del per_shape, order, fns
    torch.cuda.empty_cache()
    return {
        "layout": layout,
        "rt": rt,
        "bytes": total,
        "pass_ms": pass_ms,
        "floor_ms": floor_ms,
        "ratio_to_floor": pass_ms / floor_ms,
        "tokens_per_s": 1000 / pass_ms,
    }


def write_results(path, env, read_gbs, **results):
    """The JSON every benchmark writes: the environment, the read bandwidth of the same run,
    the warm-up, then its own results."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        payload = {"env": env, "read_bandwidth_gbs": read_gbs, "warmup_ms": WARMUP_MS}
        json.dump({**payload, **results}, f, indent=1)


def start_run():
    """libpq2 initialised, then (environment, read bandwidth in GB/s) of this run, announced on one
    line."""
    _native.check(_native.load()[1].pq2_cuda_init())
    env = environment()
    read_gbs = read_bandwidth_gbs()
    print(
        f"# {env['gpu']} | {env['nvidia_smi']} | commit {env['commit']} | read {read_gbs:.0f} GB/s",
        flush=True,
    )
    return env, read_gbs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the full results here")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--layouts", default="tiles:2,planes:0", help="layout:rt list")
    ap.add_argument("--no-cublas", action="store_true")
    ap.add_argument("--no-pass", action="store_true")
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args(argv)
    ms = [int(v) for v in args.ms.split(",")]
    layouts = [(a, int(b)) for a, b in (v.split(":") for v in args.layouts.split(","))]
    env, read_gbs = start_run()
    read_gbs_2 = read_bandwidth_gbs()
    print(f"# read bandwidth repeated: {read_gbs_2:.0f} GB/s", flush=True)
    rows = []
    for name in args.shapes.split(","):
        n, k, _ = SHAPES[name]
        nbytes = pq2_bytes(n, k)
        cublas = (
            {} if args.no_cublas else {m: time_cublas(n, k, m, args.replays, WARMUP_MS) for m in ms}
        )
        for layout, rt in layouts:
            ws = resident(n, k, layout, rt, copies_for(nbytes))
            for m in ms:
                us = time_pq2(ws, m, replays=args.replays, warmup_ms=WARMUP_MS)
                cfg = ws[0].config_for(m)
                gbs = nbytes / (us * 1e-6) / 1e9
                row = {
                    "shape": name,
                    "n": n,
                    "k": k,
                    "m": m,
                    "layout": layout,
                    "rt": rt,
                    "us": us,
                    "gbs": gbs,
                    "pct_read_bw": 100 * gbs / read_gbs,
                    "config": cfg,
                    "cublas_us": cublas.get(m),
                    "speedup_vs_cublas": (cublas[m] / us) if m in cublas else None,
                }
                rows.append(row)
                print(
                    f"{name:8s} {layout}{rt if layout == 'tiles' else ''} M={m:2d} {us:8.1f} us "
                    f"{gbs:6.0f} GB/s {row['pct_read_bw']:5.1f}%  "
                    f"cuBLAS {cublas.get(m, float('nan')):7.1f} us  cfg {cfg}",
                    flush=True,
                )
            del ws
            torch.cuda.empty_cache()
    passes = (
        []
        if args.no_pass
        else [decode_pass(layout, rt, read_gbs, warmup_ms=WARMUP_MS) for layout, rt in layouts]
    )

    if args.json:
        write_results(args.json, env, [read_gbs, read_gbs_2], rows=rows, decode_pass_m1=passes)

    # ---- the table, last ----
    print()
    print(
        f"read bandwidth {read_gbs:.0f} GB/s; times in us incl. activation quantisation; "
        "% of read bandwidth; x = speed-up over cuBLAS bf16"
    )
    for layout, rt in layouts:
        tag = f"{layout}{rt if layout == 'tiles' else ''}"
        print(f"{tag:8s} " + " ".join(f"{'M=' + str(m):>22s}" for m in ms))
        for name in args.shapes.split(","):
            cells = []
            for m in ms:
                r = next(
                    r
                    for r in rows
                    if r["shape"] == name
                    and r["m"] == m
                    and r["layout"] == layout
                    and r["rt"] == rt
                )
                sp = f"{r['speedup_vs_cublas']:.1f}x" if r["speedup_vs_cublas"] else "-"
                cells.append(f"{r['us']:7.1f} {r['pct_read_bw']:5.1f}% {sp:>6s}")
            print(f"{name:8s} " + " ".join(f"{c:>22s}" for c in cells))
    for p in passes:
        print(
            f"257-projection pass M=1 ({p['layout']}{p['rt'] or ''}): {p['pass_ms']:.3f} ms, "
            f"byte floor {p['floor_ms']:.3f} ms, ratio {p['ratio_to_floor']:.2f}x, "
            f"{p['tokens_per_s']:.0f} tok/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
