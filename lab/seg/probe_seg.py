"""Lab probe for issue 36 (not product): the persistent segment-stream prototype (seg.cu) against
today's 257 matmul_q8 calls on the same weights and Q8 operands, in one run.

    python lab/seg/probe_seg.py [--layers 64] [--json $OUT/seg.json]
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
from shapes import SHAPES  # noqa: E402

from pyq2.lib.cuda import (  # noqa: E402
    DeviceRotation,
    PQ2Weights,
    Q8Operand,
    norm_rotate_q8,
    rotate_q8,
    swiglu_rotate_q8,
)

KIND = {"in_proj": 1, "qkv": 1, "out": 3, "gate_up": 1, "down": 2, "lm_head": 1}
EPS = 1e-6


class SegProd(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("x", ctypes.c_void_p),
        ("x2", ctypes.c_void_p),
        ("w", ctypes.c_void_p),
        ("signs", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("rsqrt_b", ctypes.c_float),
        ("h_out", ctypes.c_void_p),
    ]


class SegMat(ctypes.Structure):
    _fields_ = [
        ("codes", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("xbits", ctypes.c_void_p),
        ("xs", ctypes.c_void_p),
        ("sums", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("units", ctypes.c_longlong),
        ("G", ctypes.c_int),
        ("rbs", ctypes.c_int),
        ("prod", SegProd),
        ("dbg", ctypes.c_void_p),
        ("xpack", ctypes.c_void_p),
    ]


class Seg4Mat(ctypes.Structure):
    _fields_ = [
        ("codes", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("xbits", ctypes.c_void_p),
        ("xs", ctypes.c_void_p),
        ("sums", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("ws", ctypes.c_void_p),
        ("cnt", ctypes.c_void_p),
        ("units", ctypes.c_longlong),
        ("G", ctypes.c_int),
        ("rbs", ctypes.c_int),
        ("KS", ctypes.c_int),
        ("Gs", ctypes.c_int),
        ("prod", SegProd),
    ]


def k_slices(G):
    """Slices of at most 40 groups, as few as divide G evenly (seg4.cu's kSC)."""
    for ks in range(1, G + 1):
        if G % ks == 0 and G // ks <= 40:
            return ks
    raise ValueError(G)


def run_v4(ws, q8s, refs, order, read_gbs, floor_ms, base_fns, prod_fns, rounds, ins):
    """seg4.cu: K-slices, piece slots with last-warp sums, L2 prefetch ahead."""
    lib4 = ctypes.CDLL(os.path.join(HERE, "libseg4.so"))
    lib4.seg4_plan.restype = ctypes.c_void_p
    lib4.seg4_plan.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib4.seg4_gop.argtypes = [ctypes.c_void_p]
    lib4.seg4_max_slots.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib4.seg4_passes_fit.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib4.seg4_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_void_p] * 2
    y4 = torch.empty(sum(w.n for w in ws), dtype=torch.float32, device="cuda")
    mats = (Seg4Mat * len(ws))()
    off = 0
    for j, (w, q) in enumerate(zip(ws, q8s, strict=True)):
        m = mats[j]
        G = w.k // 128
        m.codes = w.data.data_ptr()
        m.scales = w.data.data_ptr() + w.n * w.k // 4
        m.xbits, m.xs, m.sums = q.kernel_operand.data_ptr(), q.scales.data_ptr(), q.sums.data_ptr()
        m.y = y4.data_ptr() + 4 * off
        m.units = (w.n // 32) * G
        m.G, m.rbs = G, w.n // 32
        m.KS = k_slices(G)
        m.Gs = G // m.KS
        kind, x, x2, nwt, signs, _, h_out, _ = ins[j]
        m.prod.kind = kind
        m.prod.x, m.prod.x2, m.prod.w = x.data_ptr(), x2.data_ptr(), nwt.data_ptr()
        m.prod.signs = signs.data_ptr()
        m.prod.eps, m.prod.rsqrt_b = EPS, 1.0 / 32.0
        m.prod.h_out = h_out.data_ptr()
        off += w.n
    plan = lib4.seg4_plan(ctypes.cast(mats, ctypes.c_void_p), len(ws))
    assert plan, "seg4_plan refused the matrices"
    print(f"v4: operand groups {lib4.seg4_gop(plan)}, slices {sorted({(m.G, m.KS) for m in mats})}",
          flush=True)

    def fn(nw, slots, mode, spin, pf):
        def f():
            st = torch.cuda.current_stream().cuda_stream
            r = lib4.seg4_launch(plan, nw, slots, mode, spin, pf, None, st)
            if r != 0:
                raise RuntimeError(f"seg4_launch {nw} {slots} {mode} {pf}: {r}")
        return f

    fails, out = [], {"rows": []}
    bits = {}
    for nw in (16, 8):
        mx = lib4.seg4_max_slots(plan, nw)
        print(f"v4 NW {nw}: up to {mx} slots of {40 * 1088 // 1024} KB", flush=True)
        for mode, pf in ((2, 0), (2, 4), (0, 8), (6, 4), (5, 4)):
            if mode >= 5 and not lib4.seg4_passes_fit(plan, nw):
                print(f"v4 NW{nw}: the producers need more passes than compiled; skipped")
                continue
            y4.fill_(float("nan"))
            for i in ins:
                i[6].fill_(float("nan"))
            try:
                fn(nw, mx, mode, 0, pf)()
                torch.cuda.synchronize()
            except RuntimeError as e:
                fails.append(f"v4 NW{nw} mode {mode} pf {pf}: {e}")
                continue
            worst, o = 0.0, 0
            for w, ref in zip(ws, refs, strict=True):
                y = y4[o : o + w.n]
                o += w.n
                e = ((y - ref[0]).norm() / ref[0].norm()).item()
                worst = max(worst, e if e == e else float("inf"))
            ok = worst < 1e-4
            print(f"check v4 NW{nw} mode {mode} pf {pf}: {worst:.2e}{'' if ok else '  FAIL'}",
                  flush=True)
            if not ok:
                fails.append(f"v4 NW{nw} mode {mode} pf {pf}")
            if mode >= 5 and not all(torch.equal(i[6], i[5]) for i in ins if i[0] == 1):
                fails.append(f"v4 NW{nw} mode {mode}: h_out differs")
            if nw in bits and not torch.equal(bits[nw], y4):
                # modes 5 and 6 too: the producers inside give today's operands, so the same bits
                fails.append(f"v4 NW{nw} mode {mode}: bits differ from the first launch")
            bits[nw] = y4.clone()
    rows = [("today: 257 matmul_q8 calls", base_fns), ("today: 257 producers + matmul_q8", prod_fns)]
    for nw in (16, 8):
        mx = lib4.seg4_max_slots(plan, nw)
        for slots in sorted({2, mx}):
            for mode, spin in ((3, 0), (0, 0), (2, 0), (4, 2000), (6, 0), (5, 0)):
                for pf in (0, 4, 8):
                    if slots != mx and (pf != 4 or mode >= 4):
                        continue
                    if mode >= 4 and pf == 0:
                        continue
                    if mode >= 5 and not lib4.seg4_passes_fit(plan, nw):
                        continue
                    rows.append((f"v4 NW{nw} slots {slots} mode {mode} spin {spin} pf {pf}",
                                 [fn(nw, slots, mode, spin, pf)]))
    times = {r[0]: [] for r in rows}
    for _ in range(rounds):
        for label, fns in rows:
            us, _ = graph_time_us(fns, replays=10, warmup_ms=20.0)
            times[label].append(us * len(fns) / 1000.0)
    # the counters after every timed launch (mode 3 too): the same bits again
    y4.fill_(float("nan"))
    fn(8, lib4.seg4_max_slots(plan, 8), 2, 0, 4)()
    torch.cuda.synchronize()
    if 8 in bits and not torch.equal(y4, bits[8]):
        fails.append("v4: bits differ after the timed replays")
    print(f"\n{'v4 variant':<62} {'ms':>7} {'x floor':>8}")
    for label, _ in rows:
        ms = statistics.median(times[label])
        out["rows"].append({"label": label, "ms": ms, "all": times[label]})
        print(f"{label:<62} {ms:7.3f} {ms / floor_ms:8.2f}")
    print(f"read {read_gbs:.0f} GB/s, floor {floor_ms:.3f} ms; v4 CHECKS: "
          f"{'all passed' if not fails else 'FAILED: ' + str(fails)}", flush=True)
    out["failures"] = fails
    return out


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


def pack_slices(ko):
    """The m = 1 bit slices (uint8, [G][32 lanes][4 words]) packed a word a lane: w0 | w1 << 1
    (producers.cuh bitslice_group_packed), as int32."""
    w = ko.view(torch.int32).view(-1, 4).to(torch.int64) & 0xFFFFFFFF
    p = (w[:, 0] & 0x55555555) | ((w[:, 1] & 0x55555555) << 1)
    return ((p + 2**31) % 2**32 - 2**31).to(torch.int32)


def unpack_slices(p):
    """pack_slices' inverse (producers.cuh unpack_slice), as uint8."""
    q = p.to(torch.int64) & 0xFFFFFFFF
    w0, w1 = q & 0x55555555, (q >> 1) & 0x55555555
    words = torch.stack([w0 * 3, w1 * 3, w0 << 1, w1 << 1], 1) & 0xFFFFFFFF
    return ((words + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.uint8).view(-1)


def run_wr(a, lib, plan, seg_fn, ys, ws, refs, q8s, ins, order, base_fns, prod_fns, variants,
           read_gbs, floor_ms, total, stamps, grid, xpacks):
    """WR (seg.cu seg_wr_kernel, det 3; det 4 with the packed operand, PACK): per-warp rings with REG's warp-owned fixed order. Checks
    every variant against matmul_q8, the same bits across modes, replays and the producers inside
    (mode 5: every CTA makes the whole operand; mode 7: CTA t makes tile t into the operand's
    global buffers, every CTA copies it in after a second counter), then times it beside today's
    calls and v3."""
    failures, errs = [], {}

    def check(f, label):
        ys.fill_(float("nan"))
        f()
        torch.cuda.synchronize()
        worst, off = 0.0, 0
        for w, ref in zip(ws, refs, strict=True):
            y = ys[off : off + w.n]
            off += w.n
            err = ((y - ref[0]).norm() / ref[0].norm()).item()
            worst = max(worst, err if err == err else float("inf"))
        ok = worst < 1e-4
        print(f"check {label}: worst relative error {worst:.2e}{'' if ok else '  FAIL'}", flush=True)
        if not ok:
            failures.append(label)
        return worst

    # the packed operand (PACK): every slice survives packing, on today's producers' operands
    ok = all(torch.equal(unpack_slices(xp), q.kernel_operand[: q.k // 128 * 512])
             for xp, q in zip(xpacks, q8s, strict=True))
    print(f"packed slices unpack to today's operands: {ok}", flush=True)
    if not ok:
        failures.append("packed slices")
    def poison():
        """The operand's global buffers poisoned (modes 7 and 8 must write every bit back); returns
        what they held."""
        saved = [(q.kernel_operand.clone(), q.scales.clone(), q.sums.clone(), xp.clone())
                 for q, xp in zip(q8s, xpacks, strict=True)]
        for q, xp in zip(q8s, xpacks, strict=True):
            q.kernel_operand.fill_(0xFF)
            q.scales.fill_(float("nan"))
            q.sums.fill_(-1)
            xp.fill_(-1)
        return saved

    def rewritten(saved, pk, label):
        """Whether the poisoned buffers hold today's operands again; restores them either way."""
        written = [(xp if pk else q.kernel_operand, sv[3] if pk else sv[0], q, sv)
                   for q, xp, sv in zip(q8s, xpacks, saved, strict=True)]
        same = all(torch.equal(now, was) and torch.equal(q.scales, sv[1])
                   and torch.equal(q.sums, sv[2]) for now, was, q, sv in written)
        print(f"{label}: the operands written bit-identical to today's: {same}", flush=True)
        if not same:
            failures.append(f"{label}: operand bits")
        for q, xp, (a_, b_, c_, d_) in zip(q8s, xpacks, saved, strict=True):
            q.kernel_operand.copy_(a_), q.scales.copy_(b_), q.sums.copy_(c_), xp.copy_(d_)

    def check_prod(nw, ch, mx, mode, evf, det, pk, label):
        """check(), with the operand's buffers poisoned first in modes 7 and 8."""
        saved = poison() if mode in (7, 8) else None
        err = check(seg_fn(nw, ch, mx, mode, 0, evf, det=det), label)
        if saved is not None:
            rewritten(saved, pk, label)
        return err

    wr, by_nw = [], {}
    trios = (((8, 4, 0), (8, 4, 1), (16, 3, 1)) if a.quick else
             ((8, 4, 0), (8, 8, 0), (16, 2, 0), (16, 4, 0), (8, 4, 1), (8, 6, 1), (16, 2, 1), (16, 3, 1)))
    if a.trios:
        trios = tuple(tuple(int(x) for x in t.split(",")) for t in a.trios.split(";"))
    fms = [int(x) for x in a.fms.split(",")]
    assert all(0 <= f <= 3 for f in fms), "fm is two bits"
    assert {int(x) for x in a.thermo.split(",")} <= set(range(16)), "th: a mask, 1 thermometer, 2 unrolled, 4 32-bit ranges, 8 zero C"
    for nw, ch, pk in trios:
        mx = lib.seg_wr_max_slots(plan, nw, ch, pk)
        print(f"WR NW {nw} CH {ch}{' PACK' if pk else ''}: {mx} slots a warp, ring "
              f"{nw * mx * ch * 1088 / 1024:.0f} KB", flush=True)
        if mx >= 2:
            wr.append((nw, ch, mx, pk))
    for nw, ch, mx, pk in wr:
        det = 3 + pk
        tag = f"{nw}x{ch}{'p' if pk else ''}"
        errs[f"wr {tag} mode 2"] = check(seg_fn(nw, ch, mx, 2, 0, 1, det=det), f"wr {tag} mode 2")
        first = ys.clone()
        # the sums' order depends only on NW: every variant of one NW gives the same bits
        ref = by_nw.setdefault(nw, first)
        if not torch.equal(first, ref):
            failures.append(f"wr {tag}: bits differ from the other NW {nw} variants")
        for mode in (0, 6, 5, 7, 8):
            for i in ins:
                i[6].fill_(float("nan"))  # h_out of the producers inside (NORM)
            errs[f"wr {tag} mode {mode}"] = check_prod(nw, ch, mx, mode, 1, det, pk, f"wr {tag} mode {mode}")
            if not torch.equal(ys, first):
                failures.append(f"wr {tag}: mode {mode} bits differ from mode 2")
            if mode in (5, 7, 8) and not all(torch.equal(i[6], i[5]) for i in ins if i[0] == 1):
                failures.append(f"wr {tag}: mode {mode} h_out differs from today's producer")
        for fm in fms[1:] if fms[0] == 0 else fms:  # the other matrix-end releases: the same bits
            for mode in (2, 7, 8):
                check_prod(nw, ch, mx, mode, 1 | fm << 1, det, pk, f"wr {tag} fm {fm} mode {mode}")
                if not torch.equal(ys, first):
                    failures.append(f"wr {tag}: fm {fm} mode {mode} bits differ")
        for th in {int(x) for x in a.thermo.split(",")} - {0}:  # 1 thermometer, 2 unrolled: the same bits
            for mode in (2, 7) + ((8,) if not th & 1 else ()):  # mode 8 traps on the thermometer core
                evf = 1 | fms[-1] << 1 | (th & 1) << 3 | (th >> 1) << 4
                check_prod(nw, ch, mx, mode, evf, det, pk, f"wr {tag} th {th} mode {mode}")
                if not torch.equal(ys, first):
                    failures.append(f"wr {tag}: th {th} mode {mode} bits differ")
        for pkb in [int(x) for x in a.pfs.split(",")]:
            pfc = pkb * 1024 // (nw * ch * 1088)
            if pfc:
                check(seg_fn(nw, ch, mx, 7, 0, 1 | fms[-1] << 1 | pfc << 7, det=det), f"wr {tag} pf {pkb} mode 7")
                if not torch.equal(ys, first):
                    failures.append(f"wr {tag}: pf {pkb} bits differ")
        f = seg_fn(nw, ch, mx, 2, 0, 1 | fms[-1] << 1, det=det)
        for _ in range(3):
            f()
        check(f, f"wr {tag} mode 2 after replays")
        if not torch.equal(ys, first):
            failures.append(f"wr {tag}: bits differ after replays")
    print(f"CHECKS: {'all passed' if not failures else 'FAILED: ' + str(failures)}", flush=True)

    rows = [("today: 257 matmul_q8 calls", base_fns, None),
            ("today: 257 producers + matmul_q8", prod_fns, None)]
    v3 = variants[1]  # 16 x 2
    rows.append((f"v3 NW16 V2 slots {v3[2]} mode 2", [seg_fn(16, 2, v3[2], 2, 0, 1)], None))
    for nw, ch, mx, pk in wr:
        for slots in (mx,):
            kos = [int(x) for x in a.kos.split(",")] if a.kos else []
            modes = ((3, 0), (0, 0), (2, 0), (5, 0), (7, 0))
            if not a.quick:
                modes += ((4, 1000), (4, 3000), (6, 0))
            if a.modes:
                modes = tuple((int(x), 0) for x in a.modes.split(","))
            for fm, th in [(f, t) for f in fms for t in (int(x) for x in a.thermo.split(","))]:
                for pkb in [int(x) for x in a.pfs.split(",")]:
                    pfc = pkb * 1024 // (nw * ch * 1088)
                    for mode, spin in modes + (tuple((0, k) for k in kos) if th == int(a.thermo.split(",")[-1]) else ()):
                        if mode == 8 and th & 1:
                            continue  # mode 8 traps on the thermometer core
                        rows.append((f"WR NW{nw} CH{ch}{' PACK' if pk else ''} slots {slots} fm {fm} th {th} pf {pkb} mode {mode}{(f' spin {spin}' if mode == 4 else f' ko {spin}') if spin else ''}",
                                     [seg_fn(nw, ch, slots, mode, spin, 1 | fm << 1 | (th & 1) << 3 | (th >> 1) << 4 | pfc << 7, det=3 + pk)],
                                     (nw, ch, slots, mode, pk, 1 | fm << 1 | (th & 1) << 3 | (th >> 1) << 4 | pfc << 7, spin)))
    times = {r[0]: [] for r in rows}
    for _ in range(a.rounds):
        for label, fns, _ in rows:
            us, _ = graph_time_us(fns, replays=10, warmup_ms=20.0)
            times[label].append(us * len(fns) / 1000.0)
    results = {"read_gbs": read_gbs, "bytes": total, "floor_ms": floor_ms, "errors": errs,
               "failures": failures, "rows": []}
    print(f"\n{'variant':<62} {'ms':>7} {'x floor':>8}")
    for label, _, c in rows:
        ms = statistics.median(times[label])
        results["rows"].append({"label": label, "cfg": c, "ms": ms, "all": times[label]})
        print(f"{label:<62} {ms:7.3f} {ms / floor_ms:8.2f}")
    print(f"read {read_gbs:.0f} GB/s, floor {floor_ms:.3f} ms; CHECKS: "
          f"{'all passed' if not failures else 'FAILED: ' + str(failures)}", flush=True)
    # stamps of the fastest WR variant with the producers inside (--stamp-all: of every WR row)
    best = min((r for r in results["rows"] if r["cfg"] and r["cfg"][3] in (5, 7, 8)),
               key=lambda r: r["ms"], default=None)
    chosen = [r for r in results["rows"] if r["cfg"]] if a.stamp_all else [best] if best else []
    results["stamps_rows"] = []
    for best in chosen:
        nw, ch, slots, mode, pk, evf, spin = best["cfg"]
        f = seg_fn(nw, ch, slots, mode, spin, evf, det=3 + pk, ts=True)
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        s = stamps.view(grid, len(ws), 4).cpu().double()
        s = (s - s[:, 0, 0].min()) / 1000.0
        wait = s[:, 1:, 1] - s[:, 1:, 0]
        stage = s[:, :, 2] - s[:, :, 1]
        body = s[:, :, 3] - s[:, :, 2]
        spread = s[:, :, 3].max(0).values - s[:, :, 3].min(0).values
        summary = {"variant": best["label"], "total_us": float(s[:, -1, 3].max()),
                   "wait_mean_us": float(wait.mean()), "wait_p90_us": float(wait.flatten().quantile(0.9)),
                   "producer_mean_us": float(stage.mean()), "body_mean_us": float(body.mean()),
                   "end_spread_mean_us": float(spread.mean())}
        print("stamps:", json.dumps(summary), flush=True)
        kinds = {}  # per kind of matrix: mean flag wait, operand (producer or copy), body, us
        for j, name in enumerate(order):
            k_ = kinds.setdefault(name, {"wait": [], "operand": [], "body": []})
            if j > 0:
                k_["wait"].append(float(wait[:, j - 1].mean()))
            k_["operand"].append(float(stage[:, j].mean()))
            k_["body"].append(float(body[:, j].mean()))
        by_kind = {n: {f: round(statistics.mean(v), 2) if v else None for f, v in d.items()}
                   for n, d in kinds.items()}
        print("stamps by kind:", json.dumps(by_kind), flush=True)
        summary["by_kind"] = by_kind
        results["stamps"] = summary
        results["stamps_rows"].append(summary)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trios", help="WR variants NW,CH,PACK;... (default: the built-in list)")
    ap.add_argument("--fms", default="0", help="WR matrix-end releases to time, e.g. 0,1,2")
    ap.add_argument("--modes", help="WR modes to time, e.g. 3,0,2,7")
    ap.add_argument("--thermo", default="0", help="WR cores to time, a mask: 1 the thermometer core, 2 whole chunks unrolled, 4 32-bit ranges, 8 the unrolled core's C zero")
    ap.add_argument("--kos", help="WR mode-0 knockout masks to time (seg.cu: 1 copy, 2 sums out, 4 flush, 8 barrier, 16 arithmetic)")
    ap.add_argument("--stamp-all", action="store_true", help="stamps of every WR row, not only the fastest mode 5/7")
    ap.add_argument("--pfs", default="0", help="WR L2 prefetch distances to time, KB an SM, e.g. 0,128")
    ap.add_argument("--which", default="all", choices=("v3", "v4", "wr", "all"))
    a = ap.parse_args()
    torch.cuda.init()
    lib = ctypes.CDLL(os.path.join(HERE, "libseg.so"))
    lib.seg_plan.restype = ctypes.c_void_p
    lib.seg_plan.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seg_grid.argtypes = [ctypes.c_void_p]
    lib.seg_max_slots.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.seg_wr_max_slots.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.seg_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 8 + [ctypes.c_void_p] * 2

    read_gbs = read_bandwidth_gbs()
    print(f"read bandwidth {read_gbs:.0f} GB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    order = []
    for layer in range(a.layers):
        first = "qkv" if layer % 4 == 3 else "in_proj"
        order += [first, "out", "gate_up", "down"]
    order.append("lm_head")
    ws, q8s, ins = [], [], []
    xgen = torch.Generator(device="cuda").manual_seed(2)
    rots = {}
    for name in order:
        n, k, _ = SHAPES[name]
        ws.append(PQ2Weights(ternary_tiles(n, k, gen), n, k, "tiles", 2))
        # the producer's inputs (bf16 activations, f32 norm weight, signs) and today's producer
        x = torch.randn(1, k, device="cuda", generator=xgen).to(torch.bfloat16)
        x2 = torch.randn(1, k, device="cuda", generator=xgen).to(torch.bfloat16)
        w = 1.0 + 0.1 * torch.randn(k, device="cuda", generator=xgen)
        if k not in rots:
            sg = (torch.randint(0, 2, (k,), device="cuda", generator=xgen) * 2 - 1).to(torch.int8)
            rots[k] = DeviceRotation(1024, sg)
        q = Q8Operand.empty(1, k)
        h_ref = torch.empty(1, k, dtype=torch.bfloat16, device="cuda")
        kind = KIND[name]
        if kind == 1:
            norm_rotate_q8(x, w, EPS, rots[k], residual=x2, h_out=h_ref, out=q)
        elif kind == 2:
            swiglu_rotate_q8(x, x2, rots[k], out=q)
        else:
            rotate_q8(x, rots[k], out=q)
        q8s.append(q)
        ins.append((kind, x, x2, w, rots[k].signs, h_ref,
                    torch.empty(1, k, dtype=torch.bfloat16, device="cuda"),
                    torch.empty(k // 128 * 520, dtype=torch.uint8, device="cuda")))
    total = sum(w.data.numel() for w in ws)
    floor_ms = total / (read_gbs * 1e9) * 1e3
    print(f"{len(ws)} matrices, {total / 1e9:.2f} GB, floor {floor_ms:.3f} ms", flush=True)

    # today's calls, and the reference outputs
    refs = [torch.empty(1, w.n, dtype=torch.float32, device="cuda") for w in ws]
    work = torch.empty(max(w.workspace_size(1) for w in ws), dtype=torch.uint8, device="cuda")
    base_fns = [
        lambda w=w, q=q, y=y: w.matmul_q8(q, y, workspace=work)
        for w, q, y in zip(ws, q8s, refs, strict=True)
    ]
    for f in base_fns:
        f()
    torch.cuda.synchronize()
    prod_fns = []
    for w, q, y, i in zip(ws, q8s, refs, ins, strict=True):
        kind, x, x2, nwt, signs, _, h_tmp, _ = i
        rot = rots[w.k]
        if kind == 1:
            prod_fns.append(lambda x=x, x2=x2, nwt=nwt, rot=rot, h=h_tmp, q=q: norm_rotate_q8(
                x, nwt, EPS, rot, residual=x2, h_out=h, out=q))
        elif kind == 2:
            prod_fns.append(lambda x=x, x2=x2, rot=rot, q=q: swiglu_rotate_q8(x, x2, rot, out=q))
        else:
            prod_fns.append(lambda x=x, rot=rot, q=q: rotate_q8(x, rot, out=q))
        prod_fns.append(lambda w=w, q=q, y=y: w.matmul_q8(q, y, workspace=work))
    v4res = None
    if a.which in ("v4", "all"):
        v4res = run_v4(ws, q8s, refs, order, read_gbs, floor_ms, base_fns, prod_fns, a.rounds,
                       ins)
        if a.which == "v4":
            if a.json:
                with open(a.json, "w") as fh:
                    json.dump({"read_gbs": read_gbs, "bytes": total, "floor_ms": floor_ms,
                               "v4": v4res}, fh, indent=1)
            return

    ys = torch.empty(sum(w.n for w in ws), dtype=torch.float32, device="cuda")
    mats = (SegMat * len(ws))()
    xpacks = []  # WR PACK: the packed bit slices of each operand
    off = 0
    for j, (w, q) in enumerate(zip(ws, q8s, strict=True)):
        G = w.k // 128
        rbs = w.n // 32
        m = mats[j]
        m.codes = w.data.data_ptr()
        m.scales = w.data.data_ptr() + w.n * w.k // 4
        m.xbits = q.kernel_operand.data_ptr()
        m.xs = q.scales.data_ptr()
        m.sums = q.sums.data_ptr()
        m.y = ys.data_ptr() + 4 * off
        m.units = rbs * G
        m.G, m.rbs = G, rbs
        kind, x, x2, nw_, signs, _, h_out, dbg = ins[j]
        m.prod.kind = kind
        m.prod.x, m.prod.x2, m.prod.w = x.data_ptr(), x2.data_ptr(), nw_.data_ptr()
        m.prod.signs = signs.data_ptr()
        m.prod.eps, m.prod.rsqrt_b = EPS, 1.0 / 32.0
        m.prod.h_out = h_out.data_ptr()
        m.dbg = dbg.data_ptr()
        xpacks.append(pack_slices(q.kernel_operand[: G * 512]))
        m.xpack = xpacks[-1].data_ptr()
        off += w.n
    plan = lib.seg_plan(ctypes.cast(mats, ctypes.c_void_p), len(ws))
    assert plan, "seg_plan refused the matrices"
    grid = lib.seg_grid(plan)
    stamps = torch.zeros(grid * len(ws) * 4, dtype=torch.int64, device="cuda")

    def seg_fn(nw, v, slots, mode, spin, evf, det=0, ts=False, dump=0):
        def f():
            if not det:
                ys.zero_()  # float atomics add into it
            st = torch.cuda.current_stream().cuda_stream
            r = lib.seg_launch(
                plan, nw, v, det, slots, mode, spin, evf, dump,
                stamps.data_ptr() if ts else None, st,
            )
            if r != 0:
                raise RuntimeError(f"seg_launch {nw} {v} {slots} {mode}: {r}")

        return f

    variants = []
    for nw, v in ((16, 1), (16, 2), (8, 2)):
        mx = lib.seg_max_slots(plan, nw, v)
        slot_kb = nw * v * 1088 / 1024
        print(f"NW {nw} V {v}: slot {slot_kb:.1f} KB, up to {mx} slots", flush=True)
        variants.append((nw, v, mx))

    if a.which == "wr":
        run_wr(a, lib, plan, seg_fn, ys, ws, refs, q8s, ins, order, base_fns, prod_fns, variants,
               read_gbs, floor_ms, total, stamps, grid, xpacks)
        return

    # correctness: every mode of one variant, then every variant in mode 2 (failures are
    # recorded and the timings still run: one scarce GPU run)
    failures = []

    def check(f, label):
        ys.fill_(float("nan"))
        f()
        torch.cuda.synchronize()
        worst = 0.0
        off = 0
        for w, ref in zip(ws, refs, strict=True):
            y = ys[off : off + w.n]
            off += w.n
            err = ((y - ref[0]).norm() / ref[0].norm()).item()
            if not err == err:
                err = float("inf")
            worst = max(worst, err)
        ok = worst < 1e-4
        print(f"check {label}: worst relative error {worst:.2e}{'' if ok else '  FAIL'}",
              flush=True)
        if not ok:
            failures.append(label)
        return worst

    results = {"read_gbs": read_gbs, "bytes": total, "floor_ms": floor_ms, "rows": [], "v4": v4res}
    errs = {}
    nw, v, mx = variants[0]
    for mode in (0, 2, 4):
        errs[f"16x1 mode {mode}"] = check(seg_fn(nw, v, mx, mode, 1000, 1), f"16x1 mode {mode}")
    for nw, v, mx in variants[1:]:
        errs[f"{nw}x{v} mode 2"] = check(seg_fn(nw, v, mx, 2, 0, 1), f"{nw}x{v} mode 2")
    # the fixed-order sums: every variant, and the same bits on every launch
    det_bits = {}
    for nw, v, mx in variants:
        errs[f"{nw}x{v} det"] = check(seg_fn(nw, v, mx, 2, 0, 1, det=1), f"{nw}x{v} det mode 2")
        det_bits[(nw, v)] = ys.clone()
    f = seg_fn(16, 2, variants[1][2], 0, 0, 1, det=1)
    for _ in range(3):
        f()
    errs["det replayed"] = check(f, "16x2 det mode 0 after replays")
    same = bool(torch.equal(ys, det_bits[(16, 2)]))
    print(f"det: the same bits after replays and across modes: {same}", flush=True)
    if not same:
        failures.append("det bits over replays")
    # the producers inside: CTA 0's operand is today's producer's, bit for bit
    for nw, v, mx in variants:
        for mode in (6, 5):
            for _, _, _, _, _, _, h_out, dbg in ins:
                dbg.fill_(0xFF)
                h_out.fill_(float("nan"))
            errs[f"{nw}x{v} producers mode {mode}"] = check(
                seg_fn(nw, v, mx, mode, 0, 1, det=1, dump=1), f"{nw}x{v} det mode {mode}")
            bad = []
            for j, (q, i) in enumerate(zip(q8s, ins, strict=True)):
                G = q.k // 128
                d = i[7]
                ok = (torch.equal(d[: G * 512], q.kernel_operand[: G * 512])
                      and torch.equal(d[G * 512 : G * 516].view(torch.float32), q.scales[0])
                      and torch.equal(d[G * 516 :].view(torch.int32), q.sums[0]))
                if i[0] == 1:
                    ok = ok and torch.equal(i[6], i[5])
                if not ok:
                    bad.append((j, order[j]))
            print(f"producers {nw}x{v} mode {mode}: {len(ws) - len(bad)}/{len(ws)} operands "
                  f"bit-identical to today's producers{'' if not bad else ': ' + str(bad[:5])}",
                  flush=True)
            errs[f"{nw}x{v} producers mode {mode} bits"] = len(bad)
            if bad:
                failures.append(f"{nw}x{v} mode {mode} operand bits")
            # every CTA's operand: the fixed-order sums give mode 2's bits only if all are equal
            same_y = bool(torch.equal(ys, det_bits[(nw, v)]))
            print(f"producers {nw}x{v} mode {mode}: y bit-identical to det mode 2: {same_y}",
                  flush=True)
            if not same_y:
                failures.append(f"{nw}x{v} mode {mode} y bits")
    # the register alternative (no ring): today's loads, the next matrix's first batches issued
    # before the dependency wait; its own fixed order
    for nw, u in ((16, 2), (16, 4)):
        for mode in (2, 5):
            errs[f"reg {nw}x{u} mode {mode}"] = check(seg_fn(nw, u, 0, mode, 0, 1, det=2),
                                                      f"reg {nw}x{u} mode {mode}")
            if mode == 2:
                first = ys.clone()
            elif not torch.equal(ys, first):
                failures.append(f"reg {nw}x{u}: mode 5 bits differ from mode 2")
    # replays: epochs advance, counters keep pace
    f = seg_fn(16, 2, variants[1][2], 2, 0, 1)
    for _ in range(3):
        f()
    errs["replayed"] = check(f, "16x2 mode 2 after replays")
    results["errors"] = errs
    results["failures"] = failures
    print(f"CHECKS: {'all passed' if not failures else 'FAILED: ' + str(failures)}", flush=True)

    # timing table
    rows = [("today: 257 matmul_q8 calls", base_fns, None),
            ("today: 257 producers + matmul_q8", prod_fns, None)]
    cfgs = []
    for nw, v, mx in variants:
        small = max(2, mx // 4)
        for slots in sorted({small, mx}):
            for mode, spin in ((3, 0), (0, 0), (2, 0), (4, 1000), (4, 2000), (4, 3000)):
                if mode == 3 and slots != mx:
                    continue
                if slots != mx and mode == 4:  # the small ring: modes 0 and 2 say enough
                    continue
                if a.quick and (slots != mx or mode == 4 and spin != 2000):
                    continue
                cfgs.append((nw, v, slots, mode, spin, 1))
    for nw, u in ((16, 2), (16, 4)):  # the register alternative
        for mode, spin in ((3, 0), (0, 0), (2, 0), (4, 2000), (6, 0), (5, 0)):
            cfgs.append((nw, u, 0, mode, spin, 1, 2))
    cfgs.append((16, 2, variants[1][2], 2, 0, 0))  # evict-normal
    cfgs.append((16, 2, variants[1][2], 4, 2000, 0))
    for nw, v, mx in variants:  # the fixed-order sums; 6 and 5: the producers inside
        for mode, spin in ((0, 0), (2, 0), (4, 2000), (6, 0), (5, 0)):
            cfgs.append((nw, v, mx, mode, spin, 1, 1))
    for c in cfgs:
        det = {0: "", 1: " det", 2: " REG"}[c[6] if len(c) > 6 else 0]
        rows.append((f"seg NW{c[0]} V{c[1]} slots {c[2]} mode {c[3]} spin {c[4]} evf {c[5]}{det}",
                     [seg_fn(*c)], c))
    rows.append(("memset of y alone", [lambda: ys.zero_()], None))
    times = {r[0]: [] for r in rows}
    for _ in range(a.rounds):
        for label, fns, c in rows:
            us, _ = graph_time_us(fns, replays=10, warmup_ms=20.0)
            times[label].append(us * len(fns) / 1000.0)
    print(f"\n{'variant':<62} {'ms':>7} {'x floor':>8}")
    for label, fns, c in rows:
        ms = statistics.median(times[label])
        results["rows"].append({"label": label, "cfg": c, "ms": ms, "all": times[label]})
        print(f"{label:<62} {ms:7.3f} {ms / floor_ms:8.2f}")
    print(f"read {read_gbs:.0f} GB/s, floor {floor_ms:.3f} ms; CHECKS: "
          f"{'all passed' if not failures else 'FAILED: ' + str(failures)}", flush=True)

    # per-boundary stamps: the real producers inside, fixed-order sums
    f = seg_fn(16, 2, variants[1][2], 5, 0, 1, det=1, ts=True)
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    s = stamps.view(grid, len(ws), 4).cpu().double()
    t0 = s[:, 0, 0].min()
    s = (s - t0) / 1000.0  # us
    wait = (s[:, 1:, 1] - s[:, 1:, 0])  # flag seen - matrix start, per CTA, boundary
    stage = s[:, :, 2] - s[:, :, 1]
    mat_end_spread = s[:, :, 3].max(0).values - s[:, :, 3].min(0).values
    summary = {
        "total_us": float(s[:, -1, 3].max()),
        "wait_mean_us": float(wait.mean()),
        "wait_p90_us": float(wait.flatten().quantile(0.9)),
        "stage_mean_us": float(stage.mean()),
        "end_spread_mean_us": float(mat_end_spread.mean()),
    }
    print("stamps (16x2 det mode 5):", json.dumps(summary))
    results["stamps"] = summary
    by_shape = {}
    for j, name in enumerate(order[1:], start=1):
        by_shape.setdefault(name, []).append(float(wait[:, j - 1].mean()))
    print("mean wait before each kind:", {k_: round(statistics.mean(v_), 2) for k_, v_ in by_shape.items()})
    results["wait_by_next"] = by_shape
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
