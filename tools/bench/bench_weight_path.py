#!/usr/bin/env python3
"""Weight-path benchmark: the rotation and producer ops, and one whole decode step's weight path.

Measures, on the current GPU, in ONE run:
  1. the read bandwidth (bench_matmul.read_bandwidth_gbs);
  2. each op at m = 1, 16, 512 on the Ternary-Bonsai-2-27B widths (B = 1024): rotate, the three
     producers of the Q8 operand (norm + rotate + Q8 with a residual, SwiGLU + rotate + Q8, the
     gdn_v_grouped permutation + rotate + Q8), get_rows of the token embedding with the inverse,
     and dequantise (gate_up to bf16): microseconds and the share of the read bandwidth their
     bytes need (inputs read once, outputs written once);
  3. THE DECODE STEP'S WEIGHT PATH at m = 1 as one CUDA graph, in model order with distinct
     weights: embedding + inverse, then per layer (48 Gated-DeltaNet, 16 attention) a producer
     before each projection (norm -> in_proj or qkv; permute/rotate -> out; norm -> gate_up;
     SwiGLU -> down), then norm -> lm_head: 257 producers and 257 projections. Timed bare and
     with one small kernel that is not pyq2's (a 1 x 5120 bf16 copy) before each producer,
     standing in for the attention, recurrence or residual work a host runs there; the copies
     are also timed alone. Against the byte floor of everything the path must read.
Prints a table last and writes JSON (--json). Needs torch with CUDA, triton, and pyq2 with CUDA.

    python3 tools/bench/bench_weight_path.py --json out.json
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_matmul import (
    WARMUP_MS,
    graph_time_us,
    resident,
    start_run,
    write_results,
)
from shapes import SHAPES, pq2_bytes

from pyq2.lib.cuda import (
    DeviceRotation,
    Q8Operand,
    norm_rotate_q8,
    quantize_q8,
    rotate,
    rotate_q8,
    swiglu_rotate_q8,
)

HIDDEN, INNER, FFN, VOCAB = 5120, 6144, 17408, 248320
BLOCK = 1024
V_HEADS, K_HEADS = 48, 16
BF16 = torch.bfloat16


def rotation(width, seed=0):
    g = torch.Generator().manual_seed(seed + width)
    s = (torch.randint(0, 2, (width,), generator=g, dtype=torch.int8) * 2 - 1).cuda()
    return DeviceRotation(BLOCK, s)


def q8_bytes(m, width):
    # q8, scales and sums, and the kernel operand (bit slices at m = 1, records at m <= 8)
    extra = width * 4 if m == 1 else width // 128 * 64 if m <= 8 else 0
    return m * width + m * width // 128 * 8 + extra


def time_op(fn, replays=30, calls=20):
    """Microseconds per call of `calls` dependent calls in one graph (a single call would time the
    graph's launch)."""
    return graph_time_us([fn] * calls, replays=replays, warmup_ms=WARMUP_MS)[0]


def ops_at(m, emb):
    """{name: (function, bytes)} of the ops at batch m (inputs read once, outputs written once)."""
    h = torch.randn(m, HIDDEN, device="cuda").to(BF16)
    res = torch.randn(m, HIDDEN, device="cuda").to(BF16)
    h_out = torch.empty_like(h)
    nw = torch.ones(HIDDEN, device="cuda")
    gu = torch.randn(m, 2 * FFN, device="cuda").to(BF16)
    att = torch.randn(m, INNER, device="cuda").to(BF16)
    rot_h, rot_i, rot_f = rotation(HIDDEN), rotation(INNER), rotation(FFN)
    q_h, q_i, q_f = Q8Operand.empty(m, HIDDEN), Q8Operand.empty(m, INNER), Q8Operand.empty(m, FFN)
    ids = torch.randint(0, VOCAB, (m,), dtype=torch.int32, device="cuda")
    emb_out = torch.empty(m, HIDDEN, device="cuda")
    rot_out = torch.empty_like(h)
    q_plain = Q8Operand.empty(m, HIDDEN)
    return {
        "quantize_q8 5120 (reference)": (
            lambda: quantize_q8(h, out=q_plain),
            2 * m * HIDDEN + q8_bytes(m, HIDDEN),
        ),
        "rotate 5120": (lambda: rotate(h, rot_h, out=rot_out), 4 * m * HIDDEN),
        "norm+rotate+q8 5120": (
            lambda: norm_rotate_q8(h, nw, 1e-6, rot_h, residual=res, h_out=h_out, out=q_h),
            6 * m * HIDDEN + 4 * HIDDEN + q8_bytes(m, HIDDEN),
        ),
        "swiglu+rotate+q8 17408": (
            lambda: swiglu_rotate_q8(gu[:, :FFN], gu[:, FFN:], rot_f, out=q_f),
            4 * m * FFN + q8_bytes(m, FFN),
        ),
        "permute+rotate+q8 6144": (
            lambda: rotate_q8(att, rot_i, V_HEADS, K_HEADS, out=q_i),
            2 * m * INNER + q8_bytes(m, INNER),
        ),
        "get_rows+inverse 5120": (
            lambda: emb.get_rows(ids, rotation=rot_h, out=emb_out),
            m * pq2_bytes(1, HIDDEN) + 4 * m * HIDDEN,
        ),
    }


def row(name, m, us, nbytes, read_gbs):
    return {
        "op": name,
        "m": m,
        "us": us,
        "bytes": nbytes,
        "pct_read_bw": 100 * nbytes / (us * 1e-6) / 1e9 / read_gbs,
    }


def op_rows(read_gbs, ms):
    rows = []
    emb = resident(VOCAB, HIDDEN, "tiles", 2, 1, seed=3)[0]
    for m in ms:
        for name, (fn, nbytes) in ops_at(m, emb).items():
            rows.append(row(name, m, time_op(fn), nbytes, read_gbs))
    gate_up = resident(*SHAPES["gate_up"][:2], "tiles", 2, 1, seed=4)[0]
    dense = torch.empty(gate_up.n, gate_up.k, dtype=BF16, device="cuda")
    us = time_op(lambda: gate_up.dequantize(out=dense), replays=10)
    nbytes = pq2_bytes(gate_up.n, gate_up.k) + 2 * gate_up.n * gate_up.k
    rows.append(row("dequantize gate_up -> bf16", None, us, nbytes, read_gbs))
    return rows


def decode_step(read_gbs, replays=20):
    """The 27B decode step's weight path at m = 1 (module docstring, 3.)."""
    per_shape = {
        name: resident(n, k, "tiles", 2, calls, seed=1) for name, (n, k, calls) in SHAPES.items()
    }
    emb = resident(VOCAB, HIDDEN, "tiles", 2, 1, seed=2)[0]
    rot_h, rot_i, rot_f = rotation(HIDDEN), rotation(INNER), rotation(FFN)
    ws = torch.empty(
        max(w.workspace_size(1) for ws_ in per_shape.values() for w in ws_),
        dtype=torch.uint8,
        device="cuda",
    )
    h = torch.randn(1, HIDDEN, device="cuda").to(BF16)
    res = torch.randn(1, HIDDEN, device="cuda").to(BF16)
    h_out = torch.empty_like(h)
    nw = torch.ones(HIDDEN, device="cuda")
    q_h, q_i, q_f = Q8Operand.empty(1, HIDDEN), Q8Operand.empty(1, INNER), Q8Operand.empty(1, FFN)
    ys = {n: torch.empty(1, n, dtype=BF16, device="cuda") for n, _, _ in SHAPES.values()}
    att = torch.randn(1, INNER, device="cuda").to(BF16)
    ids = torch.zeros(1, dtype=torch.int32, device="cuda")
    emb_out = torch.empty(1, HIDDEN, device="cuda")
    foreign_src = torch.randn(1, HIDDEN, device="cuda").to(BF16)
    foreign_dst = torch.empty_like(foreign_src)

    def mm(w, q):
        w.matmul_q8(q, ys[w.n], ws)

    def step(foreign):
        def f():
            if foreign:
                foreign_dst.copy_(foreign_src)

        calls = [lambda: emb.get_rows(ids, rotation=rot_h, out=emb_out)]
        for layer in range(64):
            attn = layer % 4 == 3  # every 4th layer is full attention
            first = (
                per_shape["qkv"][layer // 4] if attn else per_shape["in_proj"][layer - layer // 4]
            )
            calls += [
                f,
                lambda: norm_rotate_q8(h, nw, 1e-6, rot_h, residual=res, h_out=h_out, out=q_h),
                lambda w=first: mm(w, q_h),
                f,
                lambda a=attn: rotate_q8(
                    att, rot_i, 0 if a else V_HEADS, 0 if a else K_HEADS, out=q_i
                ),
                lambda w=per_shape["out"][layer]: mm(w, q_i),
                f,
                lambda: norm_rotate_q8(h, nw, 1e-6, rot_h, residual=res, h_out=h_out, out=q_h),
                lambda w=per_shape["gate_up"][layer]: mm(w, q_h),
                f,
                lambda: swiglu_rotate_q8(ys[34816][:, :FFN], ys[34816][:, FFN:], rot_f, out=q_f),
                lambda w=per_shape["down"][layer]: mm(w, q_f),
            ]
        calls += [
            f,
            lambda: norm_rotate_q8(h, nw, 1e-6, rot_h, residual=res, h_out=h_out, out=q_h),
            lambda: mm(per_shape["lm_head"][0], q_h),
        ]
        return calls

    weight_bytes = sum(pq2_bytes(w.n, w.k) for ws_ in per_shape.values() for w in ws_) + pq2_bytes(
        1, HIDDEN
    )
    floor_ms = weight_bytes / (read_gbs * 1e9) * 1000
    bare = (
        graph_time_us(step(False), replays=replays, warmup_ms=WARMUP_MS)[0]
        * len(step(False))
        / 1000
    )
    with_foreign = (
        graph_time_us(step(True), replays=replays, warmup_ms=WARMUP_MS)[0] * len(step(True)) / 1000
    )
    copies = [lambda: foreign_dst.copy_(foreign_src)] * 257
    foreign_ms = graph_time_us(copies, replays=replays, warmup_ms=WARMUP_MS)[0] * 257 / 1000
    return {
        "weight_bytes": weight_bytes,
        "floor_ms": floor_ms,
        "bare_ms": bare,
        "bare_x_floor": bare / floor_ms,
        "with_foreign_ms": with_foreign,
        "foreign_alone_ms": foreign_ms,
        "with_foreign_x_floor_plus_foreign": with_foreign / (floor_ms + foreign_ms),
        "target_ms": 1.40 * floor_ms + foreign_ms,
        "tokens_per_s_bare": 1000 / bare,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the full results here")
    ap.add_argument("--ms", default="1,16,512", help="batch sizes of the op table")
    ap.add_argument("--no-ops", action="store_true")
    ap.add_argument("--no-step", action="store_true")
    args = ap.parse_args(argv)
    env, read_gbs = start_run()
    ops = [] if args.no_ops else op_rows(read_gbs, [int(m) for m in args.ms.split(",")])
    torch.cuda.empty_cache()
    step = None if args.no_step else decode_step(read_gbs)
    if args.json:
        write_results(args.json, env, read_gbs, ops=ops, decode_step_m1=step)
    print(
        f"\nread bandwidth {read_gbs:.0f} GB/s; us per call; % of the read bandwidth its bytes need"
    )
    for r in ops:
        m = "-" if r["m"] is None else r["m"]
        print(f"{r['op']:28s} m={m!s:>4s} {r['us']:9.2f} us {r['pct_read_bw']:6.1f}%")
    if step:
        print(
            f"decode step weight path, m = 1 (257 producers + 257 projections + embedding): "
            f"bare {step['bare_ms']:.3f} ms = {step['bare_x_floor']:.2f}x the byte floor "
            f"{step['floor_ms']:.3f} ms ({step['tokens_per_s_bare']:.0f} tok/s)"
        )
        print(
            f"with a foreign kernel before each producer {step['with_foreign_ms']:.3f} ms; the "
            f"foreign kernels alone {step['foreign_alone_ms']:.3f} ms; target 1.40 x floor + "
            f"foreign = {step['target_ms']:.3f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
