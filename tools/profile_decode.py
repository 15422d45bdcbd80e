#!/usr/bin/env python3
"""Decode kernel diagnostics: where the time of one call goes, and a target for Nsight Compute.

    python3 tools/profile_decode.py breakdown            # graph-timed pieces of a call, per shape
    python3 tools/profile_decode.py breakdown --copies 1 # the same with the weights resident in L2
    ncu --clock-control none -k regex:decode python3 tools/profile_decode.py run --shape gate_up
"""
from __future__ import annotations

import argparse
import sys

import torch

from bench_decode import copies_for, graph_time_us, resident
from decode_shapes import SHAPES, pq2_bytes
from pyq2 import _native
from pyq2.gpu import decode_config, quantize_q8


def parse_cfg(text):
    return decode_config(*[int(v) for v in text.split(",")]) if text else None


def breakdown(args):
    """Graph-timed pieces of one call: the quantiser alone, the q8 path (the matmul kernel, plus a
    counter memset for the stream family), the full call (quantiser + matmul kernel as its
    programmatic dependent)."""
    print(f"{'shape':8s} {'M':>2s} {'cfg':>16s} {'quant':>7s} {'q8 path':>10s} {'full':>7s} {'GB/s full':>9s}")
    cfgs = args.cfg.split(";") if args.cfg else [None]
    for name in args.shapes.split(","):
        n, k = (SHAPES[name][0], SHAPES[name][1]) if name in SHAPES else (64, 128)
        copies = args.copies or min(64, copies_for(pq2_bytes(n, k)))
        ws = resident(n, k, args.layout, args.rt, copies)
        # At least 16 calls per graph, cycling over the copies: with few copies (--copies 1) a
        # graph of one call would time the graph launch, not the call (bench/NOTES.md v9b).
        calls = [ws[i % len(ws)] for i in range(max(16, len(ws)))]
        for m in [int(v) for v in args.ms.split(",")]:
            for text in cfgs:
                cfg = parse_cfg(text)
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                work = ws[0].workspace(m, cfg)
                q8, xs, sums = quantize_q8(x)
                t_quant = graph_time_us([lambda: quantize_q8(x)] * len(calls))[0]
                t_q8 = graph_time_us([lambda w=w: w.matmul_q8(q8, xs, sums, y, work, cfg) for w in calls])[0]
                t_full = graph_time_us([lambda w=w: w.matmul(x, out=y, workspace=work, cfg=cfg) for w in calls])[0]
                print(f"{name:8s} {m:2d} {text or 'table':>16s} {t_quant:7.1f} {t_q8:10.1f} {t_full:7.1f} "
                      f"{pq2_bytes(n, k) / t_full / 1e3:9.0f}", flush=True)
        del ws
        torch.cuda.empty_cache()


def run(args):
    n, k = SHAPES[args.shape][0], SHAPES[args.shape][1]
    ws = resident(n, k, args.layout, args.rt, copies_for(pq2_bytes(n, k)))
    m = int(args.ms.split(",")[0])
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = parse_cfg(args.cfg)
    work = ws[0].workspace(m, cfg)
    for i in range(args.iters):
        ws[i % len(ws)].matmul(x, workspace=work, cfg=cfg)
    torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["breakdown", "run"])
    ap.add_argument("--shapes", default="tiny," + ",".join(SHAPES))
    ap.add_argument("--shape", default="gate_up")
    ap.add_argument("--ms", default="1,8,16")
    ap.add_argument("--layout", default="tiles")
    ap.add_argument("--rt", type=int, default=2)
    ap.add_argument("--cfg", help="rt,warps,unroll,stages,blocks,family[,splits] (default: the dispatcher's); "
                                   "breakdown takes several separated by ';'")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--copies", type=int, default=0,
                    help="breakdown: weight copies to rotate (default: past L2, as the benchmark; 1 = the "
                         "weights stay in L2 when they fit: the kernel's time without HBM)")
    args = ap.parse_args(argv)
    _native.check(_native.load()[1].pq2_cuda_init())
    (breakdown if args.mode == "breakdown" else run)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
