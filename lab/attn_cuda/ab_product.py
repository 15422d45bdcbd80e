"""LAB (issue 35): the product's attention decode through libpq2's kernel (pq2_attention_decode_cuda,
STREAM_MIN_BATCH = 2) against the Triton programs (STREAM_MIN_BATCH out of reach), 27B shape, 16
layers in a CUDA graph, span ~2304, batch 2/4/8/16, 3 alternating rounds, median; outputs of the
two paths compared (bf16 tolerance).

    PYTHONPATH=. python lab/attn_cuda/ab_product.py [--json out.json]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    read_gbs = read_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: read {read_gbs:.0f} GB/s", flush=True)
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(), "read_gbs": read_gbs, "rows": []}
    bad = 0
    for b in (16, 4, 2, 8, 1):
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
        pos -= torch.arange(b, device=dev) * 37
        span = int(pos.max()) + 4
        outs = [torch.empty(b, 24 * 256, device=dev) for _ in range(LAYERS)]
        kv_bytes = LAYERS * 2 * 4 * 256 * 2 * int((pos + 1).sum())

        def run():
            for m, o in zip(layers, outs, strict=True):
                m.decode(q_gate, k, v, pos, span, o)

        got = {}
        for name, min_batch in (("triton", 1 << 30), ("libpq2", 2)):
            mixer_kernels.STREAM_MIN_BATCH = min_batch
            for o in outs:
                o.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            got[name] = torch.stack(outs).float().clone()
        err = float((got["libpq2"] - got["triton"]).norm() / got["triton"].norm())
        ok = bool(torch.isfinite(got["libpq2"]).all()) and err < 2e-2
        bad += not ok
        times = {"triton": [], "libpq2": []}
        for _ in range(a.rounds):
            for name, min_batch in (("triton", 1 << 30), ("libpq2", 2)):
                mixer_kernels.STREAM_MIN_BATCH = min_batch
                times[name].append(graph_time_us([run], replays=20)[0])
        t = {n: statistics.median(v) for n, v in times.items()}
        floor = kv_bytes / (read_gbs * 1e3)
        print(f"b{b:2d}: triton {t['triton']:8.1f} us  libpq2 {t['libpq2']:8.1f} us  "
              f"({t['libpq2'] / t['triton']:.3f}x; floor {floor:.1f} us)  rel {err:.2e} "
              f"{'ok' if ok else 'FAIL'}", flush=True)  # fmt: skip
        res["rows"].append({"batch": b, "us": t, "rounds": times, "floor_us": floor, "rel": err})
    mixer_kernels.STREAM_MIN_BATCH = 2
    print("CHECKS:", "all passed" if bad == 0 else f"{bad} FAILED")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
