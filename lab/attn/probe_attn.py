"""LAB probe (issue 35, batch 16; not product): attention decode with several tiles of cache
positions per program (mixer_kernels.attention_tiles) against one tile (today), on the 27B's
attention shape (24 query heads, 4 KV heads, head 256, bf16 cache), 16 layers in a CUDA graph,
span 2304, batch 1, 4 and 16. Checks each variant's outputs against today's (bf16 tolerance).

    PYTHONPATH=. python lab/attn/probe_attn.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "bench"))
from bench_matmul import graph_time_us, read_bandwidth_gbs  # noqa: E402

from pyq2.runtime import mixer_kernels  # noqa: E402
from pyq2.runtime.mixers import Attention, Dims, Rope  # noqa: E402

D27 = Dims(n_head=24, n_head_kv=4, head_dim=256, rope_dim=64, rope_base=1e7, eps=1e-6,
           conv_kernel=4, k_heads=16, v_heads=48, k_dim=128, v_dim=128)  # fmt: skip
LAYERS, CONTEXT, POS = 16, 4096, 2300
VARIANTS = {1: [(128, 1), (128, 2), (64, 2), (128, 4)],
            4: [(64, 1), (64, 2), (64, 4), (128, 2), (64, 8)],
            16: [(64, 1), (64, 2), (64, 4), (64, 8), (128, 1), (128, 2), (128, 4)]}  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    read_gbs = read_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: read {read_gbs:.0f} GB/s", flush=True)
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(), "read_gbs": read_gbs, "rows": [], "checks": []}
    fails = []
    for b, variants in VARIANTS.items():
        g = torch.Generator(device="cpu").manual_seed(b)
        rope = Rope(D27, CONTEXT, dev)
        w = {"q_norm": (1 + 0.1 * torch.randn(256, generator=g)).to(dev),
             "k_norm": (1 + 0.1 * torch.randn(256, generator=g)).to(dev)}  # fmt: skip
        layers = [Attention(D27, w, b, CONTEXT, rope, dev, torch.bfloat16, kernels=True)
                  for _ in range(LAYERS)]  # fmt: skip
        for m in layers:
            m.k.normal_(), m.v.normal_()
        q_gate = torch.randn(b, 24 * 2 * 256, generator=g).to(dev)
        k = torch.randn(b, 4 * 256, generator=g).to(dev)
        v = torch.randn(b, 4 * 256, generator=g).to(dev)
        pos = torch.full((b,), POS, dtype=torch.long, device=dev)
        pos -= torch.arange(b, device=dev) * 37  # rows at different positions
        outs = [torch.empty(b, 24 * 256, device=dev) for _ in range(LAYERS)]
        span = POS + 4
        kv_bytes = LAYERS * 2 * 4 * 256 * 2 * int((pos + 1).sum())

        def fn(ch, tiles):
            def f():
                mixer_kernels.attention_chunk = lambda batch: ch
                mixer_kernels.attention_tiles = lambda batch: tiles
                for m, o in zip(layers, outs, strict=True):
                    m.decode(q_gate, k, v, pos, span, o)
            return f

        ref = None
        for ch, tiles in variants:
            for o in outs:
                o.fill_(float("nan"))
            fn(ch, tiles)()
            torch.cuda.synchronize()
            y = torch.stack(outs).float()
            if ref is None:
                ref = y.clone()
                err = 0.0
            else:
                err = float((y - ref).norm() / ref.norm())
            ok = bool(torch.isfinite(y).all()) and err < 2e-2
            res["checks"].append({"batch": b, "chunk": ch, "tiles": tiles, "err": err})
            print(f"check b{b} chunk {ch} tiles {tiles}: rel {err:.2e}{'' if ok else '  FAIL'}",
                  flush=True)
            if not ok:
                fails.append((b, ch, tiles))
        times = {v: [] for v in variants}
        for _ in range(a.rounds):
            for ch, tiles in variants:
                # graph_time_us captures fns: the lambdas set the variant at capture time
                us, _ = graph_time_us([fn(ch, tiles)], replays=10, warmup_ms=5.0)
                times[(ch, tiles)].append(us)
        floor = kv_bytes / (read_gbs * 1e3)
        for ch, tiles in variants:
            us = statistics.median(times[(ch, tiles)])
            res["rows"].append({"batch": b, "chunk": ch, "tiles": tiles, "us": us,
                                "floor_us": floor, "all": times[(ch, tiles)]})  # fmt: skip
            print(f"b{b:2d} chunk {ch:3d} tiles {tiles}: {us:8.1f} us for {LAYERS} layers "
                  f"({floor:.1f} us floor, x{us / floor:.2f})", flush=True)
    print(f"CHECKS: {'all passed' if not fails else 'FAILED ' + str(fails)}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
