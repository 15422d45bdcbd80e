#!/usr/bin/env python3
"""LAB probe for issue 37, E1 and E3 (not product): the ping-pong variants of the wide sm_90a GEMM
block (lab/e1/kernel_wgmma_e1.cuh, config warps 12, unroll 3..8) and the trimmed consumer loops
(lab/e1/kernel_wgmma_e3.cuh, config unroll 9..16: warps 8 for the narrow block, modes 9..12,
warps 12 for the wide block, modes 9..16; 128 tokens) against today's blocks and cuBLAS, in ONE
run, with the lab library (PYQ2_LIBRARY=build/lab-e1/libpq2.so, built by lab/e1/build.sh).

Labels: n128s6 (narrow, today), w128s6 (wide), p96s6 (pairs), e128s6u4 (E1 unroll 4, warps 12),
n128s6u10 (E3 mode 10 on the narrow block), e128s6u14 (E3 mode 14 on the wide block).

1. Bits: every E1 variant (tokens 96/128, stages 4/6, unroll 3..8), every E3 variant (128
   tokens, stages 4/6) and the wide w128s6 against the narrow 128-token block (n128s6, config
   warps 8) on the same Q8 operand, fp32 output, exact: gate_up, down and in_proj at M 17, 100,
   257, 2048, splits 1 and 3, plus small odd shapes (a partial row block, 8 and 4 groups; splits
   8 over 4 groups leaves empty splits; odd group counts take E3's one-group tail).
2. Times (us per call, activation quantisation included, as bench_prefill.py; the quantiser
   alone is timed too): gate_up, down, in_proj at M 2048, gate_up at 512 and 8192, for the
   dispatcher (cfg None), n128s6, w128s4, w128s6, p96s6, every E1 and E3 variant, cuBLAS bf16
   (torch.matmul) and cuBLAS fp8 (torch._scaled_mm, e4m3 operands already cast, per-tensor
   scales, with and without fast accumulation). CUDA-graph replays over rotating weight copies
   larger than L2, 3 alternating rounds (the order rotated each round), the median of the
   rounds' medians. --fast: stage 6 only (E1 at 128 tokens, E3), gate_up and down at 2048 and
   gate_up at 512.
3. Clocks: nvidia-smi's SM clock and power sampled (100 ms) while each main kernel of the M 2048
   rows replays alone for about 1 s.
Prints a table last; --json writes everything.

    PYQ2_LIBRARY=build/lab-e1/libpq2.so PYTHONPATH=. python3 lab/e1/probe_e1.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
from bench_matmul import WARMUP_MS, copies_for, resident  # noqa: E402
from shapes import SHAPES, pq2_bytes  # noqa: E402

from pyq2.lib import native as _native  # noqa: E402
from pyq2.lib.cuda import FAMILY_GEMM_SM90, gemm_config, quantize_q8  # noqa: E402

MODES = {
    3: "PING",
    4: "PING+PRE all",
    5: "PING+PRE half",
    6: "PING+PRE quarter",
    7: "PRE all",
    8: "OFFSET",
}
# E3 (kernel_wgmma_e3.cuh e3_form_of): U1 / U2 one / two groups an iteration, PAIRFULL one full
# wait per two groups, PAIRREL one release per two groups, ALL every lane arrives on the empty
# barrier, MAGIC the 1.25 * 2^17 bias (all but 11), PING / PRE as E1. 9..12 narrow and wide,
# 13..16 wide only.
E3_MODES = {
    9: "E3 U1",
    10: "E3 U1+ALL",
    11: "E3 U1+ALL, no MAGIC",
    12: "E3 U2",
    13: "E3 U2+PAIRFULL",
    14: "E3 U2+PAIRFULL+PAIRREL+ALL",
    15: "E3 U2+PAIRFULL+PAIRREL+ALL+PING+PRE quarter",
    16: "E3 U1+ALL+PING+PRE half",
}
MODES.update(E3_MODES)
E1 = [(bn, st, u) for bn in (128, 96) for st in (6, 4) for u in range(3, 9)]
# E3 at 128 tokens: the narrow block (n...u) modes 9..12, the wide block (e...u) 9..16
E3_LABELS = [f"n128s{st}u{u}" for st in (6, 4) for u in (9, 10, 11, 12)] + [
    f"e128s{st}u{u}" for st in (6, 4) for u in range(9, 17)
]


def cfg_of(label, splits=0):
    """The explicit config of a label: n128s6 (narrow), w128s6 (wide), p96s6 (pairs),
    e128s6u4 (E1 unroll 4; u9..16: an E3 wide block), n128s6u10 (an E3 narrow block)."""
    kind, rest = label[0], label[1:]
    if kind == "e" or (kind == "n" and "u" in rest):
        bn, rest = rest.split("s")
        st, u = rest.split("u")
        return gemm_config(
            int(bn), int(st), splits, FAMILY_GEMM_SM90, warps=12 if kind == "e" else 8,
            unroll=int(u),
        )
    bn, st = (int(v) for v in rest.split("s"))
    warps, unroll = {"n": (8, 1), "w": (12, 1), "p": (12, 2)}[kind]
    return gemm_config(bn, st, splits, FAMILY_GEMM_SM90, warps=warps, unroll=unroll)


E1_LABELS = [f"e{bn}s{st}u{u}" for bn, st, u in E1]

# A hung kernel (a barrier protocol bug) would block the probe until the run's timeout: a watchdog
# names the last step and ends the process after HANG_S seconds without progress.
HANG_S = 40.0
_progress = {"t": time.time(), "what": "start"}


def progress(what):
    _progress["t"], _progress["what"] = time.time(), what


def _watchdog():
    while True:
        time.sleep(2.0)
        if time.time() - _progress["t"] > HANG_S:
            print(f"WATCHDOG: no progress for {HANG_S:.0f} s; last step: {_progress['what']}",
                  flush=True)
            os._exit(3)
OURS = ["dispatch", "n128s6", "w128s4", "w128s6", "p96s6"] + E1_LABELS + E3_LABELS
CUBLAS = ["cublas_bf16", "cublas_fp8", "cublas_fp8_fast"]


def describe(label):
    if "u" in label:
        return f"{label} ({MODES[int(label.split('u')[1])]})"
    return label


# ---- 1. bits ----------------------------------------------------------------------------------


def check_bits(ws, ms, splits_list, log):
    """Every E1 and E3 variant and w128s6 against n128s6 on one Q8 operand per m: exact fp32
    bits."""
    w = ws[0]
    results = []
    for m in ms:
        x = torch.randn(m, w.k, device="cuda").to(torch.bfloat16)
        q = quantize_q8(x, kernel_operand=False)
        for splits in splits_list:
            labels = ["w128s6"] + E1_LABELS + E3_LABELS
            work = torch.empty(
                max(w.workspace_size(m, cfg_of(lb, splits)) for lb in ["n128s6"] + labels) + 256,
                dtype=torch.uint8,
                device="cuda",
            )
            ref = torch.full((m, w.n), float("nan"), device="cuda")
            w.matmul_q8(q, ref, workspace=work, cfg=cfg_of("n128s6", splits))
            out = torch.empty_like(ref)
            bad = []
            for lb in labels:
                out.fill_(float("nan"))
                progress(f"bits {lb} n={w.n} k={w.k} m={m} splits={splits}")
                try:
                    w.matmul_q8(q, out, workspace=work, cfg=cfg_of(lb, splits))
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - report and go on
                    bad.append(f"{lb}: {type(e).__name__}: {e}")
                    continue
                if not torch.equal(out.view(torch.int32), ref.view(torch.int32)):
                    diff = (out != ref) | out.isnan()
                    bad.append(f"{lb}: {int(diff.sum())} of {out.numel()} outputs differ")
            ok = not bad and not bool(ref.isnan().any())
            results.append({"n": w.n, "k": w.k, "m": m, "splits": splits, "ok": ok, "bad": bad})
            log(
                f"bits n={w.n} k={w.k} m={m} splits={splits}: "
                + ("all exact" if ok else "MISMATCH " + "; ".join(bad[:6]))
            )
    return results


# ---- 2. times ---------------------------------------------------------------------------------


def capture(fns):
    """fns run once on a side stream (module load), then captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for f in fns:
            f()
    torch.cuda.synchronize()
    return g


def replay_us(g, calls, replays, warmup_ms=WARMUP_MS):
    """Median us per call over `replays` timed replays, after warmup_ms of replays."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(100000):
        g.replay()
        if i % 4 == 3:
            b.record()
            b.synchronize()
            if a.elapsed_time(b) >= warmup_ms:
                break
    times = []
    for _ in range(replays):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(times)


class Row:
    """One (shape, m): the graphs of every timed kernel over rotating weight copies."""

    def __init__(self, name, n, k, m, ws):
        self.name, self.n, self.k, self.m = name, n, k, m
        self.graphs, self.calls, self.configs, self.errors = {}, {}, {}, {}
        self.x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        self.y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        self.ws = ws
        self.structs = [w.struct() for w in ws]
        cfgs = {lb: (None if lb == "dispatch" else cfg_of(lb)) for lb in OURS}
        self.work = torch.empty(
            max(w.workspace_size(m, c) for c in cfgs.values() for w in ws[:1]) + 256,
            dtype=torch.uint8,
            device="cuda",
        )
        self.configs["dispatch"] = ws[0].config_for(m)
        for lb, c in cfgs.items():
            fns = [
                lambda w=w, s=s, c=c: w.matmul(
                    self.x, out=self.y, workspace=self.work, cfg=c, w_struct=s
                )
                for w, s in zip(ws, self.structs, strict=True)
            ]
            self.add(lb, fns)
        q = quantize_q8(self.x, kernel_operand=False)
        self.add("quant", [lambda q=q: quantize_q8(self.x, kernel_operand=False, out=q)] * 4)

    def add(self, lb, fns):
        progress(f"capture {lb} {self.name} M={self.m}")
        try:
            self.graphs[lb] = capture(fns)
            self.calls[lb] = len(fns)
        except Exception as e:  # noqa: BLE001 - report and go on
            self.errors[lb] = f"{type(e).__name__}: {e}"
            torch.cuda.synchronize()

    def add_cublas(self):
        n, k, m = self.n, self.k, self.m
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        c16 = copies_for(n * k * 2)
        w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(c16)]
        out16 = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        self.add("cublas_bf16", [lambda w=w: torch.matmul(x, w.T, out=out16) for w in w16])
        c8 = copies_for(n * k)
        w8 = [(w16[i % c16] * 8).to(torch.float8_e4m3fn) for i in range(c8)]
        x8 = (x * 8).to(torch.float8_e4m3fn)
        one = torch.tensor(1.0 / 8, device="cuda")
        for lb, fast in (("cublas_fp8", False), ("cublas_fp8_fast", True)):
            self.add(
                lb,
                [
                    lambda w=w, fast=fast: torch._scaled_mm(
                        x8, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                        use_fast_accum=fast,
                    )
                    for w in w8
                ],
            )
        self._keep = (x, w16, w8, x8, one, out16)

    def drop(self):
        self.graphs.clear()
        self._keep = None


def time_rows(rows, rounds, deadline, log):
    """`rounds` alternating rounds over every row's graphs (each round in another order: forward,
    backward, forward from the middle, ...): {(shape, m): {label: [us per round]}}."""
    per = {(r.name, r.m): {lb: [] for lb in r.graphs} for r in rows}
    for rnd in range(rounds):
        for r in rows:
            labels = list(r.graphs)
            if rnd % 2:
                labels.reverse()
            cut = (rnd // 2) * len(labels) // 2 % len(labels)
            labels = labels[cut:] + labels[:cut]
            for lb in labels:
                if time.time() > deadline:
                    log(f"time budget reached in round {rnd}: stopping the timings")
                    return per
                g, calls = r.graphs[lb], r.calls[lb]
                progress(f"timing {lb} {r.name} M={r.m} round {rnd}")
                est = per[(r.name, r.m)][lb][-1] if per[(r.name, r.m)][lb] else None
                if est is None:  # one replay to size the run
                    g.replay()
                    torch.cuda.synchronize()
                    t = time.time()
                    g.replay()
                    torch.cuda.synchronize()
                    est = (time.time() - t) * 1e6 / calls
                replays = int(min(30, max(5, 120e3 / (est * calls))))
                per[(r.name, r.m)][lb].append(replay_us(g, calls, replays))
        log(f"round {rnd + 1}/{rounds} done")
    return per


# ---- 3. clocks --------------------------------------------------------------------------------


def sample_clock(g, seconds=1.2, skip=0.25):
    """nvidia-smi's SM clock (MHz) and power (W), medians of its 100 ms samples taken while g
    replays back to back for `seconds`, those of the first `skip` seconds dropped (matched by
    nvidia-smi's timestamps)."""
    dev = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    cmd = [
        "nvidia-smi", f"--id={dev}", "--query-gpu=timestamp,clocks.sm,power.draw",
        "--format=csv,noheader,nounits", "-lms", "100",
    ]
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    time.sleep(0.4)  # nvidia-smi's start
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(4):
            g.replay()
        torch.cuda.synchronize()
    t1 = time.time()
    p.terminate()
    try:
        out, _ = p.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    samples = []
    for line in out.splitlines():
        try:
            ts, c, w = (v.strip() for v in line.split(","))
            t = datetime.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(c), float(w)))
        except ValueError:
            continue
    keep = [(c, w) for t, c, w in samples if t0 + skip <= t <= t1]
    if not keep:
        return {"sm_mhz": None, "power_w": None, "samples": 0, "raw": out[-400:]}
    return {
        "sm_mhz": statistics.median(c for c, _ in keep),
        "power_w": statistics.median(w for _, w in keep),
        "samples": len(keep),
    }


# ---- main -------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the full results here")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--budget-s", type=float, default=280.0, help="stop timing this many s after the start"
    )
    ap.add_argument("--no-bits", action="store_true")
    ap.add_argument("--no-clock", action="store_true")
    ap.add_argument(
        "--fast", action="store_true", help="E1 at 128 tokens and E3, stage 6 only; 3 rows"
    )
    ap.add_argument("--no-e1", action="store_true", help="leave the E1 variants out")
    args = ap.parse_args(argv)
    if args.fast:
        E1_LABELS[:] = [lb for lb in E1_LABELS if lb.startswith("e128s6")]
        E3_LABELS[:] = [lb for lb in E3_LABELS if lb.startswith(("n128s6", "e128s6"))]
        OURS[:] = ["dispatch", "n128s6", "w128s6"] + E1_LABELS + E3_LABELS
    if args.no_e1:
        E1_LABELS[:] = []
        OURS[:] = [
            lb for lb in OURS if lb in ("dispatch", "n128s6", "w128s6") or lb in E3_LABELS
        ]
    t_start = time.time()
    deadline = t_start + args.budget_s
    progress("init")
    threading.Thread(target=_watchdog, daemon=True).start()

    def log(msg):
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    _native.check(_native.load()[1].pq2_cuda_init())
    from pyq2.runtime.timing import environment

    env = environment()
    env["library"] = str(_native.library_path())
    log(f"{env['gpu']} | {env['nvidia_smi']} | torch {env['torch']} | lib {env['library']}")
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.max.sm,power.limit", "--format=csv,noheader"],
            capture_output=True, text=True,
        ).stdout.strip()
        env["max_clock_power_limit"] = smi
        log(f"max SM clock, power limit: {smi}")
    except OSError:
        pass

    timed = [("gate_up", 2048), ("down", 2048), ("in_proj", 2048), ("gate_up", 512),
             ("gate_up", 8192)]
    if args.fast:
        timed = [("gate_up", 2048), ("down", 2048), ("gate_up", 512)]
    bits, rows, weights = [], [], {}
    for name in ("gate_up", "down") if args.fast else ("gate_up", "down", "in_proj"):
        n, k, _ = SHAPES[name]
        progress(f"weights {name}")
        weights[name] = resident(n, k, "tiles", 2, copies_for(pq2_bytes(n, k)))
        log(f"{name} {n}x{k}: {len(weights[name])} copies")
        if not args.no_bits:
            bits += check_bits(weights[name], [17, 257, 2048] if args.fast else [17, 100, 257, 2048],
                               [1, 3], log)
    if not args.no_bits:
        for n, k, splits in ((1056, 1024, [1, 3]), (1056, 512, [1, 8])):
            progress(f"weights {n}x{k}")
            ws = resident(n, k, "tiles", 2, 1, seed=2)
            bits += check_bits(ws, [17, 130], splits, log)
            del ws
    bits_ok = all(b["ok"] for b in bits)
    log(f"bits: {'ALL EXACT' if bits_ok else 'MISMATCHES'} ({len(bits)} cases)")

    for name, m in timed:
        n, k, _ = SHAPES[name]
        r = Row(name, n, k, m, weights[name])
        progress(f"cuBLAS weights {name} M={m}")
        r.add_cublas()
        rows.append(r)
        log(f"captured {name} M={m}: {len(r.graphs)} graphs, errors {r.errors or 'none'}; "
            f"dispatch {r.configs['dispatch']}")
    per = time_rows(rows, args.rounds, deadline, log)
    med = {
        key: {lb: statistics.median(v) for lb, v in d.items() if v} for key, d in per.items()
    }

    clocks = {}
    if not args.no_clock:
        for r in rows:
            if r.m != 2048:
                continue
            e1_best = min(
                (lb for lb in E1_LABELS if lb in med[(r.name, r.m)]),
                key=lambda lb: med[(r.name, r.m)][lb],
                default=None,
            )
            e3_best = min(
                (lb for lb in E3_LABELS if lb in med[(r.name, r.m)]),
                key=lambda lb: med[(r.name, r.m)][lb],
                default=None,
            )
            main_k = ["dispatch", "n128s6", "w128s6", "e128s6u3", "e128s6u4", e1_best, e3_best,
                      "cublas_bf16", "cublas_fp8_fast"]
            for lb in dict.fromkeys(k for k in main_k if k and k in r.graphs):
                if time.time() > deadline + 45:
                    log("time budget reached: no more clock samples")
                    break
                progress(f"clock {lb} {r.name} M={r.m}")
                c = sample_clock(r.graphs[lb])
                clocks[f"{r.name} M={r.m} {lb}"] = c
                log(f"clock {r.name} M={r.m} {lb}: {c}")

    result = {
        "env": env,
        "warmup_ms": WARMUP_MS,
        "rounds": args.rounds,
        "bits_ok": bits_ok,
        "bits": bits,
        "times_us": {f"{n} M={m}": d for (n, m), d in med.items()},
        "times_us_rounds": {f"{n} M={m}": d for (n, m), d in per.items()},
        "configs": {f"{r.name} M={r.m}": r.configs for r in rows},
        "errors": {f"{r.name} M={r.m}": r.errors for r in rows if r.errors},
        "clocks": clocks,
        "modes": {f"u{u}": d for u, d in MODES.items()},
        "labels": {"e1": E1_LABELS, "e3": E3_LABELS},
        "seconds": time.time() - t_start,
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    # ---- the table, last ----
    print()
    print(
        f"E1 / E3 probe, {env['gpu']}; us per call incl. activation quantisation (quant = the "
        f"quantiser alone); median of {args.rounds} rounds; bits "
        f"{'ALL EXACT vs n128s6' if bits_ok else 'MISMATCHES (see above)'}"
    )
    keys = [(r.name, r.m) for r in rows]
    cols = [f"{n} {m}" for n, m in keys]
    print(f"{'kernel':46s}" + "".join(f"{c:>15s}" for c in cols))
    for lb in ["quant"] + CUBLAS + OURS:
        cells = []
        for key in keys:
            v = med.get(key, {}).get(lb)
            base = med.get(key, {}).get("n128s6")
            cells.append(
                f"{v:9.1f} {v / base:4.2f}" if v and base and lb not in ("quant",) else
                (f"{v:9.1f}     " if v else f"{'-':>9s}     ")
            )
        print(f"{describe(lb):46s}" + "".join(f"{c:>15s}" for c in cells))
    print("(second number: time / n128s6 of the same column)")
    for key in keys:
        d = med.get(key, {})
        for name, group in (("E1", E1_LABELS), ("E3", E3_LABELS)):
            cand = [lb for lb in group if lb in d]
            if not cand or "n128s6" not in d:
                continue
            best = min(cand, key=d.get)
            print(
                f"{key[0]} M={key[1]}: best {name} {describe(best)} {d[best]:.1f} us = "
                f"{d[best] / d['n128s6']:.3f} x n128s6"
                + (f", {d[best] / d['w128s6']:.3f} x w128s6" if "w128s6" in d else "")
                + (f", {d[best] / d['dispatch']:.3f} x dispatch" if "dispatch" in d else "")
                + (f", {d[best] / d['cublas_bf16']:.3f} x cuBLAS bf16"
                   if "cublas_bf16" in d else "")
            )
    for k, c in clocks.items():
        if c:
            if c["samples"]:
                print(f"clock {k}: {c['sm_mhz']:.0f} MHz, {c['power_w']:.0f} W "
                      f"({c['samples']} samples)")
            else:
                print(f"clock {k}: no samples ({c.get('raw', '')!r})")
    print("dispatch configs: " + "; ".join(
        f"{r.name} {r.m}: tokens {r.configs['dispatch']['tokens']} warps "
        f"{r.configs['dispatch']['warps']} stages {r.configs['dispatch']['stages']} splits "
        f"{r.configs['dispatch']['splits']}" for r in rows))
    print(f"probe: {time.time() - t_start:.0f} s")
    return 0 if bits_ok else 1


if __name__ == "__main__":
    sys.exit(main())
