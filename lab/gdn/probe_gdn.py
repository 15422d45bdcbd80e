"""LAB probe (issue 35, batch 16; not product): the Gated-DeltaNet decode kernel's program shape
(GDN_BV state columns, GDN_WARPS, EARLY_STATE) on the 27B's recurrence (48 layers, 48 V heads,
16 K heads, 128 x 128 float32 state), 48 layers of distinct states in a CUDA graph, batch 1, 4
and 16. Each variant's state and output are checked against today's (float32, 1e-5).

    PYTHONPATH=. python lab/gdn/probe_gdn.py [--json out.json]
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

from pyq2.runtime import mixer_kernels as mk  # noqa: E402
from pyq2.runtime.mixers import Dims, GatedDeltaNet  # noqa: E402

D27 = Dims(n_head=24, n_head_kv=4, head_dim=256, rope_dim=64, rope_base=1e7, eps=1e-6,
           conv_kernel=4, k_heads=16, v_heads=48, k_dim=128, v_dim=128)  # fmt: skip
LAYERS = 48
# (BV, warps, early) ; early None = today's rule
VARIANTS = [(32, 2, None), (32, 4, None), (64, 2, None), (64, 4, None), (64, 8, None),
            (128, 4, None), (128, 8, None), (16, 1, None), (16, 2, None),
            (32, 2, 1000), (64, 4, 1000)]  # fmt: skip


def set_variant(bv, warps, early):
    mk.GDN_BV, mk.GDN_WARPS = bv, warps
    mk.EARLY_STATE = 3 if early is None else early


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="16,4,1")
    ap.add_argument("--json")
    a = ap.parse_args()
    read_gbs = read_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: read {read_gbs:.0f} GB/s", flush=True)
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(), "read_gbs": read_gbs, "rows": [], "checks": []}
    fails = []
    d = D27
    C = 2 * d.k_heads * d.k_dim + d.v_heads * d.v_dim
    for b in [int(x) for x in a.batches.split(",")]:
        g = torch.Generator(device="cpu").manual_seed(b)
        layers = []
        for _ in range(LAYERS):
            w = {"conv": 0.3 * torch.randn(C, d.conv_kernel, generator=g),
                 "a": -torch.rand(d.v_heads, generator=g) * 2,
                 "dt_bias": torch.randn(d.v_heads, generator=g),
                 "norm": 1 + 0.1 * torch.randn(d.v_dim, generator=g)}  # fmt: skip
            m = GatedDeltaNet(d, {k: v.to(dev) for k, v in w.items()}, b, dev, use_fla=False)
            m.state.normal_()
            m.conv.normal_()
            layers.append(m)
        qkv = torch.randn(b, C, generator=g).to(dev)
        z = torch.randn(b, d.v_heads * d.v_dim, generator=g).to(dev)
        alpha = torch.randn(b, d.v_heads, generator=g).to(dev)
        beta = torch.randn(b, d.v_heads, generator=g).to(dev)
        pos = torch.arange(b, device=dev) * 7 + 100
        outs = [torch.empty(b, d.v_heads * d.v_dim, device=dev) for _ in range(LAYERS)]
        state_bytes = 2 * LAYERS * layers[0].state.numel() * 4

        def fn(v):
            def f():
                set_variant(*v)
                for m, o in zip(layers, outs, strict=True):
                    m.decode(qkv, z, alpha, beta, pos, o, gate=False)
            return f

        s0 = [m.state.clone() for m in layers[:4]]
        c0 = [m.conv.clone() for m in layers[:4]]
        ref = None
        for v in VARIANTS:
            for m, s, c in zip(layers[:4], s0, c0):
                m.state.copy_(s), m.conv.copy_(c)
            for o in outs[:4]:
                o.fill_(float("nan"))
            set_variant(*v)
            for m, o in zip(layers[:4], outs[:4]):
                m.decode(qkv, z, alpha, beta, pos, o, gate=False)
            torch.cuda.synchronize()
            y = torch.cat([o.flatten() for o in outs[:4]] + [m.state.flatten() for m in layers[:4]])
            if ref is None:
                ref, err = y.clone(), 0.0
            else:
                err = float((y - ref).abs().max() / ref.abs().max())
            ok = bool(torch.isfinite(y).all()) and err < 1e-5
            res["checks"].append({"batch": b, "variant": v, "err": err})
            print(f"check b{b} {v}: {err:.2e}{'' if ok else '  FAIL'}", flush=True)
            if not ok:
                fails.append((b, v))
        times = {v: [] for v in VARIANTS}
        for _ in range(a.rounds):
            for v in VARIANTS:
                us, _ = graph_time_us([fn(v)], replays=10, warmup_ms=5.0)
                times[v].append(us)
        floor = state_bytes / (read_gbs * 1e3)
        for v in VARIANTS:
            us = statistics.median(times[v])
            res["rows"].append({"batch": b, "variant": v, "us": us, "floor_us": floor,
                                "all": times[v]})  # fmt: skip
            print(f"b{b:2d} BV {v[0]:3d} warps {v[1]} early {v[2]}: {us:8.1f} us / {LAYERS} "
                  f"layers ({floor:.0f} us state r+w at read rate, x{us / floor:.2f})",
                  flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    print(f"CHECKS: {'all passed' if not fails else 'FAILED ' + str(fails)}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
