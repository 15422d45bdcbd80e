"""LAB probe (issue 35 batch 16; not product): m16w.cu, the wgmma decode matmul for 9..16 tokens,
against today's row-block path (matmul_q8 on the same Q8 operand), in one run.

1. Checks: every variant on every 27B shape at m 16, 9 and 13 (and K slices), fp32 output,
   relative error against matmul_q8 (both compute the same exact integer dots; the float
   promotion and summation orders differ), the same bits on a second launch.
2. Times: us per call at m 16, rotating weight copies (>= 256 MB), CUDA-graph replays,
   alternating rounds, medians; the byte floor per shape at the measured read bandwidth.
Table last; --json.

    PYTHONPATH=. PYQ2_LIBRARY=build/dev-gpu/libpq2.so python lab/m16w/probe_m16w.py
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
from bench_matmul import copies_for, graph_time_us, read_bandwidth_gbs  # noqa: E402
from shapes import SHAPES  # noqa: E402

from pyq2.lib.cuda import PQ2Weights, quantize_q8  # noqa: E402

VARIANTS = [  # (warpgroups per CTA, units in flight per warp, 64-row halves, overlapped)
    (4, 4, 1, 0),
    (4, 4, 1, 1),
    (3, 4, 1, 1),
    (2, 8, 1, 1),
    (2, 4, 2, 1),
    (3, 4, 2, 1),
    (3, 2, 2, 1),
]


def ternary_tiles(n, k, gen):
    """Random tiles rt 2 bytes (n a multiple of 32: no padding rows): codes 0/1/2, fp16 scales."""
    nb = n * k // 4
    codes = torch.empty(nb, dtype=torch.uint8, device="cuda")
    step = 1 << 26
    for a in range(0, nb, step):
        b = min(nb, a + step)
        c = torch.randint(0, 3, (b - a, 4), dtype=torch.uint8, device="cuda", generator=gen)
        codes[a:b] = c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)
    scales = (torch.rand(n * (k // 128), device="cuda", generator=gen) * 0.02 + 0.001).half()
    return torch.cat([codes, scales.view(torch.uint8)])


def valid(k, s, dep, ov):
    """The overlapped kernel takes whole blocks of dep groups in a slice."""
    return not ov or (k // 128 // s) % dep == 0


def slices_for(k):
    g = k // 128
    return [1] if g <= 64 else [s for s in (2, 4) if g % s == 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    a = ap.parse_args()
    torch.cuda.init()
    lib = ctypes.CDLL(os.path.join(HERE, "libm16w.so"))
    lib.m16w_workspace.restype = ctypes.c_longlong
    lib.m16w_workspace.argtypes = [ctypes.c_int] * 7 + [ctypes.POINTER(ctypes.c_longlong)]
    lib.m16w_run.argtypes = (
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        + [ctypes.c_void_p] * 3
        + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        + [ctypes.c_int] * 6
        + [ctypes.c_void_p]
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    read_gbs = read_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, read {read_gbs:.0f} GB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    xgen = torch.Generator(device="cuda").manual_seed(2)
    res = {"gpu": torch.cuda.get_device_name(), "read_gbs": read_gbs, "checks": [], "rows": []}
    fails = []
    shapes = a.shapes.split(",")
    data = {}
    for name in shapes:
        n, k, _ = SHAPES[name]
        base = ternary_tiles(n, k, gen)
        nbytes = base.numel()
        copies = copies_for(nbytes)
        ws = [PQ2Weights(base if i == 0 else base.clone(), n, k, "tiles", 2) for i in range(copies)]
        data[name] = (ws, nbytes)
        cat = ctypes.c_longlong()
        # one zeroed workspace per (slices, variant): its counters must start at zero, and a
        # variant's counters would otherwise sit on another's partial sums
        works = {
            (s, v): torch.zeros(
                lib.m16w_workspace(
                    n, k, s, sms, v[0], v[2], v[1] if v[3] else 1, ctypes.byref(cat)
                ),
                dtype=torch.uint8,
                device="cuda",
            )
            for s in slices_for(k)
            for v in VARIANTS
        }
        data[name] = (ws, nbytes, works)
        for m in (16, 9, 13):
            x = torch.randn(m, k, device="cuda", generator=xgen).to(torch.bfloat16)
            q = quantize_q8(x)
            ref = torch.empty(m, n, dtype=torch.float32, device="cuda")
            ws[0].matmul_q8(q, ref)
            torch.cuda.synchronize()
            for s in slices_for(k):
                for nwg, dep, hv, ov in VARIANTS:
                    if m != 16 and (nwg, dep, hv, ov) not in (
                        (4, 4, 1, 0),
                        (3, 4, 1, 1),
                        (2, 4, 2, 1),
                    ):
                        continue
                    if not valid(k, s, dep, ov):
                        continue
                    work = works[(s, (nwg, dep, hv, ov))]
                    y = torch.full((m, n), float("nan"), device="cuda")
                    st = torch.cuda.current_stream().cuda_stream
                    r = lib.m16w_run(
                        ws[0].data.data_ptr(),
                        n,
                        k,
                        q.q8.data_ptr(),
                        q.scales.data_ptr(),
                        q.sums.data_ptr(),
                        m,
                        y.data_ptr(),
                        work.data_ptr(),
                        s,
                        sms,
                        nwg,
                        dep,
                        hv,
                        ov,
                        st,
                    )
                    try:
                        torch.cuda.synchronize()
                    except RuntimeError as e:
                        print(f"FAULT {name} m{m} S{s} {nwg}/{dep}/{hv}/{ov}: {e}", flush=True)
                        raise
                    if r != 0:
                        fails.append(f"{name} m{m} S{s} {nwg}/{dep}/{hv}/{ov}: rc {r}")
                        continue
                    err = ((y - ref).norm() / ref.norm()).item()
                    y1 = y.clone()
                    lib.m16w_run(
                        ws[0].data.data_ptr(),
                        n,
                        k,
                        q.q8.data_ptr(),
                        q.scales.data_ptr(),
                        q.sums.data_ptr(),
                        m,
                        y.data_ptr(),
                        work.data_ptr(),
                        s,
                        sms,
                        nwg,
                        dep,
                        hv,
                        ov,
                        st,
                    )
                    torch.cuda.synchronize()
                    same = bool(torch.equal(y, y1))
                    ok = err == err and err < 2e-5 and same
                    res["checks"].append(
                        {
                            "shape": name,
                            "m": m,
                            "S": s,
                            "v": [nwg, dep, hv, ov],
                            "err": err,
                            "same_bits": same,
                        }
                    )
                    print(
                        f"check {name:8s} m{m:2d} S{s} {nwg}/{dep}/{hv}/{ov}: rel {err:.2e} "
                        f"bits again {same}{'' if ok else '  FAIL'}",
                        flush=True,
                    )
                    if not ok:
                        fails.append(f"{name} m{m} S{s} {nwg}/{dep}/{hv}/{ov}")
    print(f"CHECKS: {'all passed' if not fails else 'FAILED ' + str(fails)}", flush=True)
    res["failures"] = fails

    # times at m = 16
    m = 16
    rows = []
    for name in shapes:
        ws, nbytes, works = data[name]
        n, k, _ = SHAPES[name]
        x = torch.randn(m, k, device="cuda", generator=xgen).to(torch.bfloat16)
        q = quantize_q8(x)
        y = torch.empty(m, n, dtype=torch.float32, device="cuda")
        wk = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # today's call's workspace
        rows.append(
            (
                name,
                "today matmul_q8",
                [lambda w=w: w.matmul_q8(q, y, workspace=wk) for w in ws],
                nbytes,
            )
        )
        for s in slices_for(k):
            for nwg, dep, hv, ov in VARIANTS:
                if not valid(k, s, dep, ov):
                    continue
                work = works[(s, (nwg, dep, hv, ov))]

                def mk(w, s=s, nwg=nwg, dep=dep, hv=hv, ov=ov, n=n, k=k, q=q, y=y, work=work):
                    def f():
                        st = torch.cuda.current_stream().cuda_stream
                        r = lib.m16w_run(
                            w.data.data_ptr(),
                            n,
                            k,
                            q.q8.data_ptr(),
                            q.scales.data_ptr(),
                            q.sums.data_ptr(),
                            m,
                            y.data_ptr(),
                            work.data_ptr(),
                            s,
                            sms,
                            nwg,
                            dep,
                            hv,
                            ov,
                            st,
                        )
                        if r:
                            raise RuntimeError(f"m16w_run {r}")

                    return f

                rows.append((name, f"m16w S{s} {nwg}/{dep}/{hv}/{ov}", [mk(w) for w in ws], nbytes))
    times = {(r[0], r[1]): [] for r in rows}
    for _ in range(a.rounds):
        for name, label, fns, _ in rows:
            us, _ = graph_time_us(fns, replays=10, warmup_ms=10.0)
            times[(name, label)].append(us)
    print(f"\n{'shape':8s} {'variant':24s} {'us':>8s} {'x floor':>8s}")
    for name, label, fns, nbytes in rows:
        us = statistics.median(times[(name, label)])
        floor = nbytes / (read_gbs * 1e3)
        res["rows"].append(
            {
                "shape": name,
                "label": label,
                "us": us,
                "floor_us": floor,
                "all": times[(name, label)],
            }
        )
        print(f"{name:8s} {label:24s} {us:8.2f} {us / floor:8.2f}", flush=True)
    # a decode step's projections at m = 16 (SHAPES' calls per step), today vs the best variant
    tot_today = tot_best = 0.0
    for name in shapes:
        calls = SHAPES[name][2]
        t_today = statistics.median(times[(name, "today matmul_q8")])
        t_best = min(
            statistics.median(times[(name, lbl)])
            for (nm, lbl) in times
            if nm == name and lbl.startswith("m16w")
        )
        tot_today += calls * t_today
        tot_best += calls * t_best
    print(
        f"per step at m 16 (shapes {shapes}): today {tot_today / 1000:.3f} ms, "
        f"best m16w per shape {tot_best / 1000:.3f} ms; CHECKS: "
        f"{'all passed' if not fails else 'FAILED'}",
        flush=True,
    )
    res["step_today_ms"], res["step_best_ms"] = tot_today / 1000, tot_best / 1000
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
