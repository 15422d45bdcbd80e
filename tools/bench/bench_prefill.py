#!/usr/bin/env python3
"""Prefill benchmark (the GEMM family, m > 16): pyq2 against cuBLAS bf16 dense, in ONE run.

For the six projection shapes (shapes.py) at M = 17, 32, 64, 128, 256, 512, 2048, 8192: pyq2's
pq2_matmul_cuda (activation quantisation included, the dispatcher's configuration) and cuBLAS
bf16 (torch x @ w.T), both as CUDA-graph replays over rotating weight copies: microseconds,
effective TOPS (2 M N K / time) and the speed-up over cuBLAS. Then the prefill of a 2048-token
prompt through all 257 projections of Ternary-Bonsai-2-27B: pyq2 as one graph over 257 distinct
resident matrices, cuBLAS as the sum of its per-shape times (its 257 distinct bf16 copies would
take 52 GB). Prints a table last and writes JSON (--json). Needs torch with CUDA and triton.

    python3 tools/bench/bench_prefill.py --json out.json
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_matmul import (
    WARMUP_MS,
    copies_for,
    graph_time_us,
    resident,
    start_run,
    time_cublas,
    time_pq2,
    write_results,
)
from shapes import SHAPES, pq2_bytes

MS = "17,32,64,128,256,512,2048,8192"


def prefill_pass(m, replays=5):
    """The 257 projections at m in model order as one graph (distinct weights): ms."""
    per_shape = {
        n: resident(sn, sk, "tiles", 2, calls, seed=1) for n, (sn, sk, calls) in SHAPES.items()
    }
    order = []
    for layer in range(64):
        attn = layer % 4 == 3
        order.append(
            per_shape["qkv"][layer // 4] if attn else per_shape["in_proj"][layer - layer // 4]
        )
        order += [per_shape["out"][layer], per_shape["gate_up"][layer], per_shape["down"][layer]]
    order.append(per_shape["lm_head"][0])
    xs = {k: torch.randn(m, k, device="cuda").to(torch.bfloat16) for k in (5120, 6144, 17408)}
    ys = {w.n: torch.empty(m, w.n, dtype=torch.bfloat16, device="cuda") for w in order}
    work = torch.empty(max(w.workspace_size(m) for w in order), dtype=torch.uint8, device="cuda")
    structs = [w.struct() for w in order]
    fns = [
        lambda w=w, s=s: w.matmul(xs[w.k], out=ys[w.n], workspace=work, w_struct=s)
        for w, s in zip(order, structs, strict=True)
    ]
    us = graph_time_us(fns, replays=replays, warmup_ms=WARMUP_MS)[0] * len(fns)
    return us / 1000


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the full results here")
    ap.add_argument("--ms", default=MS)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--no-pass", action="store_true")
    args = ap.parse_args(argv)
    ms = [int(v) for v in args.ms.split(",")]
    env, read_gbs = start_run()
    rows = []
    for name in args.shapes.split(","):
        n, k, _ = SHAPES[name]
        ws = resident(n, k, "tiles", 2, copies_for(pq2_bytes(n, k)))
        for m in ms:
            us = time_pq2(ws, m, replays=args.replays, warmup_ms=WARMUP_MS)
            cub = time_cublas(n, k, m, args.replays, WARMUP_MS)
            cfg = ws[0].config_for(m)
            row = {
                "shape": name,
                "n": n,
                "k": k,
                "m": m,
                "us": us,
                "tops": 2 * m * n * k / us / 1e6,
                "cublas_us": cub,
                "speedup_vs_cublas": cub / us,
                "config": cfg,
            }
            rows.append(row)
            print(
                f"{name:8s} M={m:5d} {us:9.1f} us {row['tops']:7.1f} TOPS  cuBLAS {cub:9.1f} us "
                f"{row['speedup_vs_cublas']:5.2f}x  cfg tokens {cfg['tokens']} "
                f"splits {cfg['splits']}",
                flush=True,
            )
        del ws
        torch.cuda.empty_cache()
    passes = {}
    if not args.no_pass:
        pq2_ms = prefill_pass(2048)
        calls = {name: c for name, (_, _, c) in SHAPES.items()}
        cub = {r["shape"]: r["cublas_us"] for r in rows if r["m"] == 2048}
        cub_ms = sum(cub[s] * calls[s] for s in calls) / 1000 if len(cub) == len(calls) else None
        passes = {
            "m": 2048,
            "pq2_ms": pq2_ms,
            "cublas_sum_ms": cub_ms,
            "speedup": cub_ms / pq2_ms if cub_ms else None,
        }
    if args.json:
        write_results(args.json, env, read_gbs, rows=rows, prefill_pass=passes)
    print(
        "\nus per call incl. activation quantisation; TOPS = 2 M N K / time; x = over cuBLAS bf16"
    )
    print(f"{'shape':8s} " + " ".join(f"{'M=' + str(m):>20s}" for m in ms))
    for name in args.shapes.split(","):
        cells = [
            f"{r['us']:8.1f} {r['speedup_vs_cublas']:5.2f}x"
            for m in ms
            for r in rows
            if r["shape"] == name and r["m"] == m
        ]
        print(f"{name:8s} " + " ".join(f"{c:>20s}" for c in cells))
    if passes:
        cub = (
            f"{passes['cublas_sum_ms']:.2f} ms, {passes['speedup']:.2f}x"
            if passes["cublas_sum_ms"]
            else "-"
        )
        print(
            f"2048-token prefill, 257 projections: {passes['pq2_ms']:.2f} ms "
            f"(cuBLAS bf16 sum of calls {cub})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
