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

sys.path.insert(0, HERE)
import persist  # noqa: E402
from persist import attention_decode_persist  # noqa: E402

ORIGINAL = mixer_kernels.attention_decode
from pyq2.runtime.mixers import Attention, Dims, Rope  # noqa: E402

D27 = Dims(n_head=24, n_head_kv=4, head_dim=256, rope_dim=64, rope_base=1e7, eps=1e-6,
           conv_kernel=4, k_heads=16, v_heads=48, k_dim=128, v_dim=128)  # fmt: skip
LAYERS, CONTEXT, POS = 16, 4096, 2300
K = 1024
# (chunk, tiles, warps, stage bytes[, persistent programs a multiprocessor[, store first]]):
# today first
B16 = [(128, 2, 8, 160 * K), (128, 2, 4, 160 * K), (64, 4, 8, 128 * K), (64, 4, 4, 128 * K),
       (64, 4, 4, 64 * K), (64, 8, 4, 128 * K), (32, 8, 4, 64 * K), (32, 8, 4, 96 * K),
       (32, 8, 2, 64 * K), (32, 4, 4, 64 * K), (64, 2, 4, 128 * K), (128, 1, 4, 160 * K),
       # the persistent grid (lab/attn/persist.py), programs per multiprocessor last
       (128, 1, 8, 160 * K, 1), (128, 2, 8, 160 * K, 1), (64, 1, 4, 128 * K, 2),
       (64, 2, 4, 128 * K, 2), (32, 2, 4, 64 * K, 2), (32, 4, 4, 64 * K, 3),
       # ... reading the new key and value back from the cache (no spills at 64 x 4 x 8 warps)
       (64, 4, 8, 128 * K, 1, True), (64, 4, 8, 128 * K, 2, True), (32, 8, 4, 64 * K, 2, True),
       (32, 4, 4, 64 * K, 3, True), (128, 1, 8, 160 * K, 1, True)]
VARIANTS = {16: B16, 4: [(128, 2, 8, 160 * K), (64, 4, 4, 128 * K), (32, 8, 4, 64 * K),
                         (128, 2, 4, 160 * K), (128, 1, 8, 160 * K, 1), (64, 2, 4, 128 * K, 2)],
            1: [(128, 1, 8, 160 * K), (128, 1, 4, 160 * K), (64, 1, 4, 160 * K),
                (32, 1, 4, 64 * K), (32, 2, 4, 64 * K), (64, 1, 8, 128 * K),
                (32, 1, 4, 64 * K, 2, True), (64, 1, 8, 128 * K, 2, True)]}  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    read_gbs = read_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: read {read_gbs:.0f} GB/s", flush=True)
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(), "read_gbs": read_gbs, "rows": [], "checks": []}
    fails = []
    mixer_kernels.CHUNK_ONE = 32  # the scratch holds the partial sums of the smallest chunk
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

        def fn(ch, tiles, warps, sb, per=0, sf=False):
            def f():
                mixer_kernels.attention_decode = ORIGINAL if per == 0 else attention_decode_persist
                persist.PER_SM = max(per, 1)
                persist.STORE_FIRST = sf
                mixer_kernels.attention_chunk = lambda batch: ch
                mixer_kernels.attention_tiles = lambda batch: tiles
                mixer_kernels.ATTENTION_WARPS = warps  # the persistent grid reads this one
                mixer_kernels.attention_warps = lambda batch: warps
                mixer_kernels.STAGE_BYTES = sb
                for m, o in zip(layers, outs, strict=True):
                    m.decode(q_gate, k, v, pos, span, o)
            return f

        ref = None
        for var in variants:
            ch, tiles = var[:2]
            for o in outs:
                o.fill_(float("nan"))
            # a variant must write every partial sum and read the new key and value it stored:
            # poison each layer's scratch and its cache rows at the positions
            for m in layers:
                sc = m.scratch
                sc.m.fill_(float("nan")), sc.l.fill_(float("nan")), sc.acc.fill_(float("nan"))
                for r in range(b):
                    m.k[r, :, int(pos[r])] = float("nan")
                    m.v[r, :, int(pos[r])] = float("nan")
            try:
                fn(*var)()
                torch.cuda.synchronize()
            except Exception as e:  # a variant that does not compile or launch: left out
                print(f"check b{b} {var}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                fails.append((b, var))
                continue
            y = torch.stack(outs).float()
            if ref is None:
                if var != variants[0]:
                    print(f"b{b}: today's variant failed; no reference", flush=True)
                    break
                ref = y.clone()
                err = 0.0
            else:  # the worst (layer, row, head)
                yh, rh = y.reshape(*y.shape[:2], 24, 256), ref.reshape(*ref.shape[:2], 24, 256)
                err = float(((yh - rh).norm(dim=-1) / rh.norm(dim=-1)).max())
            ok = bool(torch.isfinite(y).all()) and err < 2e-2
            res["checks"].append({"batch": b, "variant": var, "err": err})
            print(f"check b{b} {var}: rel {err:.2e}{'' if ok else '  FAIL'}",
                  flush=True)
            if not ok:
                fails.append((b, var))
        variants = [v for v in variants if (b, v) not in fails]
        times = {v: [] for v in variants}
        for _ in range(a.rounds):
            for var in variants:
                # graph_time_us captures fns: the lambdas set the variant at capture time
                us, _ = graph_time_us([fn(*var)], replays=10, warmup_ms=5.0)
                times[var].append(us)
        floor = kv_bytes / (read_gbs * 1e3)
        for var in variants:
            us = statistics.median(times[var])
            res["rows"].append({"batch": b, "variant": var, "us": us,
                                "floor_us": floor, "all": times[var]})  # fmt: skip
            print(f"b{b:2d} {var}: {us:8.1f} us for {LAYERS} layers "
                  f"({floor:.1f} us floor, x{us / floor:.2f})", flush=True)
    print(f"CHECKS: {'all passed' if not fails else 'FAILED ' + str(fails)}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
