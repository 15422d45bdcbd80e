"""LAB probe (issue 35, batch 16; not product): the CUDA streaming attention kernel
(lab/attn_cuda/attn_stream.cu, built into libattn.so) plus today's Triton merge, against today's
attention decode (Triton, 128 x 2 x 8 warps), 27B shape, 16 layers in a CUDA graph, span 2304,
batch 16, 4 and 1. The CUDA kernel takes the query normed and rotated (torch here) and the new
key and value already in the cache (today's kernel wrote them in the check step), so its time
leaves out that prep. Checks every (layer, row, head) against today's outputs (bf16 tolerance)
with the scratch and outputs poisoned first.

    nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -shared -Xcompiler -fPIC \\
        lab/attn_cuda/attn_stream.cu -o lab/attn_cuda/libattn.so
    PYTHONPATH=. python lab/attn_cuda/probe_cuda.py [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "bench"))
from bench_matmul import graph_time_us, read_bandwidth_gbs  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pyq2.runtime import mixer_kernels  # noqa: E402
from pyq2.runtime.mixer_kernels import _norm_rope  # noqa: E402
from pyq2.runtime.mixers import Attention, Dims, Rope  # noqa: E402


@triton.jit
def _attention_prep(q_gate, k_in, v_in, k_cache, v_cache, positions, q_norm, k_norm, cos, sin,
                    q_out, s_qg, s_k, s_v, s_cb, s_ch, s_cs, eps, H: tl.constexpr,
                    G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                    NROT: tl.constexpr):  # fmt: skip
    """The prep today's partial kernel fuses, for the CUDA stream: the group's queries normed
    and rotated into q_out (bf16 [B, H, D]), the new key normed and rotated and the new value
    into the cache at the row's position (the same arithmetic as _attention_partial)."""
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    d = tl.arange(0, D)
    g = tl.arange(0, BG)
    pos = tl.load(positions + b)
    heads = kvh * G + tl.minimum(g, G - 1)
    cos_row = cos + pos * HALF
    sin_row = sin + pos * HALF
    q = _norm_rope(q_gate + b * s_qg + heads[:, None] * (2 * D) + d[None, :], d[None, :], q_norm,
                   cos_row, sin_row, eps, D, HALF, NROT)  # fmt: skip
    dt = k_cache.dtype.element_ty
    tl.store(q_out + (b * H + heads[:, None]) * D + d[None, :], q.to(dt), mask=(g < G)[:, None])
    k_new = _norm_rope(k_in + b * s_k + kvh * D + d, d, k_norm, cos_row, sin_row, eps, D, HALF,
                       NROT)  # fmt: skip
    v_new = tl.load(v_in + b * s_v + kvh * D + d).to(tl.float32)
    cache = b * s_cb + kvh * s_ch + pos * s_cs
    tl.store(k_cache + cache + d, k_new.to(dt))
    tl.store(v_cache + cache + d, v_new.to(dt))

D27 = Dims(n_head=24, n_head_kv=4, head_dim=256, rope_dim=64, rope_base=1e7, eps=1e-6,
           conv_kernel=4, k_heads=16, v_heads=48, k_dim=128, v_dim=128)  # fmt: skip
LAYERS, CONTEXT, POS, CH = 16, 4096, 2300, 256

lib = ctypes.CDLL(os.path.join(HERE, "libattn.so"))
lib.attn_stream_launch.restype = ctypes.c_int
lib.attn_stream_launch.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int] * 3 + [
    ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                           ctypes.c_int, ctypes.c_void_p]  # fmt: skip


def q_rotated(q_gate, w, rope, pos, d):
    """The queries normed and rotated as _norm_rope does (fp32), in bf16: [B, H, D]."""
    b = q_gate.shape[0]
    x = q_gate.view(b, d.n_head, 2, d.head_dim)[:, :, 0].float()
    inv = torch.rsqrt((x * x).mean(-1, keepdim=True) + d.eps)
    xn = x * inv * w["q_norm"].float()
    half, nrot = rope.half, rope.n_rot
    c = rope.cos[pos][:, None, :]  # [B, 1, half]
    s = rope.sin[pos][:, None, :]
    out = xn.clone()
    lo, hi = xn[..., :half], xn[..., half:nrot]
    out[..., :half] = lo * c - hi * s
    out[..., half:nrot] = hi * c + lo * s
    return out.to(torch.bfloat16).contiguous()


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
    for b in (8, 16, 4, 1):  # 8: positions at tile and chunk edges, checked only
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
        if b == 8:  # a warp's positions all masked in its first tile; one-position chunks
            pos = torch.tensor([0, 7, 8, 31, 32, 255, 256, 257], dtype=torch.long, device=dev)
        span = int(pos.max()) + 4
        outs = [torch.empty(b, 24 * 256, device=dev) for _ in range(LAYERS)]
        kv_bytes = LAYERS * 2 * 4 * 256 * 2 * int((pos + 1).sum())

        def today():
            for m, o in zip(layers, outs, strict=True):
                m.decode(q_gate, k, v, pos, span, o)

        today()
        torch.cuda.synchronize()
        ref = torch.stack(outs).float().clone()
        # today's several-sequence programs cover 128 x 2 = 256 positions in the same slots:
        # the partial sums compare slot by slot (chunks 0 .. pos // 256 of each row)
        parts = None
        if b > 1 and mixer_kernels.attention_chunk(b) * mixer_kernels.attention_tiles(b) == CH:
            parts = [(m.scratch.m.clone(), m.scratch.l.clone(), m.scratch.acc.clone())
                     for m in layers]  # fmt: skip
        live = torch.zeros(b, 24, layers[0].scratch.n_chunks, dtype=torch.bool, device=dev)
        for r in range(b):
            live[r, :, : int(pos[r]) // CH + 1] = True
        q_rot = q_rotated(q_gate, w, rope, pos, D27)
        def mine(stages, qr=None, ch=CH):
            q_src = q_rot if qr is None else qr
            chunks = -(-span // ch)
            merge = max(1, min(mixer_kernels.MERGE_SPAN // ch, mixer_kernels.MERGE_TILE // 256))
            merge = 1 << (merge.bit_length() - 1)

            def f():
                st = torch.cuda.current_stream().cuda_stream
                for m, o in zip(layers, outs, strict=True):
                    sc = m.scratch
                    rc = lib.attn_stream_launch(
                        q_src.data_ptr(), m.k.data_ptr(), m.v.data_ptr(), pos.data_ptr(),
                        sc.m.data_ptr(), sc.l.data_ptr(), sc.acc.data_ptr(), b, 24, 4,
                        m.k.stride(0), m.k.stride(1), m.k.stride(2), sc.n_chunks, chunks,
                        m.scale, stages, ch, st)  # fmt: skip
                    assert rc == 0, rc
                    mixer_kernels._attention_merge[(24, b)](
                        q_gate, pos, sc.m, sc.l, sc.acc, o, q_gate.stride(0), o.stride(0),
                        sc.n_chunks, H=24, D=256, BS=ch, BC=merge, PDL=False, num_warps=4)  # fmt: skip
            return f

        q_buf = torch.empty(b, 24, 256, dtype=torch.bfloat16, device=dev)

        def full(stages, ch=CH):
            """prep (Triton) + stream (CUDA) + merge (Triton): today's work, all of it"""
            stream = mine(stages, q_buf, ch)

            def f():
                for m in layers:
                    _attention_prep[(4, b)](
                        q_gate, k, v, m.k, m.v, pos, m.q_norm, m.k_norm, rope.cos, rope.sin,
                        q_buf, q_gate.stride(0), k.stride(0), v.stride(0), m.k.stride(0),
                        m.k.stride(1), m.k.stride(2), D27.eps, H=24, G=6, BG=16, D=256,
                        HALF=rope.half, NROT=rope.n_rot, num_warps=4)  # fmt: skip
                stream()
            return f

        variants = {"today (Triton 128x2x8)": today}
        for stages, ch in ((2, 256), (3, 256), (4, 256), (3, 128)):
            name = f"cuda stream S{stages} CH{ch} + merge"
            for m in layers:
                sc = m.scratch
                sc.m.fill_(float("nan")), sc.l.fill_(float("nan")), sc.acc.fill_(float("nan"))
            for o in outs:
                o.fill_(float("nan"))
            try:
                mine(stages, None, ch)()
                torch.cuda.synchronize()
            except Exception as e:
                print(f"check b{b} {name}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                fails.append((b, name))
                continue
            y = torch.stack(outs).float()
            yh, rh = y.reshape(*y.shape[:2], 24, 256), ref.reshape(*ref.shape[:2], 24, 256)
            err = float(((yh - rh).norm(dim=-1) / rh.norm(dim=-1)).max())
            ok = bool(torch.isfinite(y).all()) and err < 2e-2
            if parts is not None and ch == CH:  # the partial sums, slot by slot
                perr = 0.0
                for m, (pm, pl, pa) in zip(layers, parts, strict=True):
                    sc = m.scratch
                    dm = (sc.m - pm).abs()[live].max()
                    dl = ((sc.l - pl).abs() / pl.abs())[live].max()
                    da = ((sc.acc - pa).norm(dim=-1) / pa.norm(dim=-1))[live].max()
                    perr = max(perr, float(dm), float(dl), float(da))
                print(f"check b{b} {name}: partial sums worst {perr:.2e}", flush=True)
                ok = ok and perr < 2e-2
            res["checks"].append({"batch": b, "variant": name, "err": err})
            print(f"check b{b} {name}: rel {err:.2e}{'' if ok else '  FAIL'}", flush=True)
            if ok:
                variants[name] = mine(stages, None, ch)
            else:
                fails.append((b, name))
        # the full path: poison the cache rows at the positions too (the prep must write them)
        for m in layers:
            sc = m.scratch
            sc.m.fill_(float("nan")), sc.l.fill_(float("nan")), sc.acc.fill_(float("nan"))
        kept = [(m.k.clone(), m.v.clone()) for m in layers]
        for m in layers:
            for r in range(b):
                m.k[r, :, int(pos[r])] = float("nan")
                m.v[r, :, int(pos[r])] = float("nan")
        for o in outs:
            o.fill_(float("nan"))
        name = "full: prep + stream S3 + merge"
        try:
            full(3)()
            torch.cuda.synchronize()
        except Exception as e:
            print(f"check b{b} {name}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            fails.append((b, name))
            for m, (kk, vv) in zip(layers, kept, strict=True):  # today's rows back
                m.k.copy_(kk), m.v.copy_(vv)
            if b == 8:
                continue
            full = None
        y = torch.stack(outs).float()
        yh, rh = y.reshape(*y.shape[:2], 24, 256), ref.reshape(*ref.shape[:2], 24, 256)
        err = float(((yh - rh).norm(dim=-1) / rh.norm(dim=-1)).max())
        rows = torch.arange(b, device=dev)

        def close(x, y):  # the rows the prep wrote against today's (bits, or one bf16 rounding)
            xr, yr = x[rows, :, pos].float(), y[rows, :, pos].float()
            return bool(torch.isfinite(xr).all()) and float(
                ((xr - yr).norm(dim=-1) / yr.norm(dim=-1)).max()) < 1e-2

        cache_ok = all(close(m.k, kk) and close(m.v, vv)
                       for m, (kk, vv) in zip(layers, kept, strict=True))  # fmt: skip
        qerr = float(((q_buf.float() - q_rot.float()).norm(dim=-1) / q_rot.float().norm(dim=-1)).max())
        ok = bool(torch.isfinite(y).all()) and err < 2e-2 and cache_ok and qerr < 1e-2
        print(f"check b{b} {name}: rel {err:.2e}, cache rows {'ok' if cache_ok else 'DIFFER'}"
              f", q vs torch {qerr:.1e}{'' if ok else '  FAIL'}", flush=True)  # fmt: skip
        res["checks"].append({"batch": b, "variant": name, "err": err, "cache_ok": cache_ok})
        if ok and full is not None:
            variants[name] = full(3)
            if "cuda stream S3 CH128 + merge" in variants:  # the same prep, checked above
                variants["full: prep + stream S3 CH128 + merge"] = full(3, 128)
        elif full is not None:
            fails.append((b, name))
        if b == 8:
            continue
        times = {n: [] for n in variants}
        for _ in range(a.rounds):
            for n, f in variants.items():
                us, _ = graph_time_us([f], replays=10, warmup_ms=5.0)
                times[n].append(us)
        floor = kv_bytes / (read_gbs * 1e3)
        for n in variants:
            us = statistics.median(times[n])
            res["rows"].append({"batch": b, "variant": n, "us": us, "floor_us": floor,
                                "all": times[n]})  # fmt: skip
            print(f"b{b:2d} {n:28s}: {us:8.1f} us for {LAYERS} layers "
                  f"({floor:.1f} us floor, x{us / floor:.2f})", flush=True)
    print(f"CHECKS: {'all passed' if not fails else 'FAILED ' + str(fails)}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
