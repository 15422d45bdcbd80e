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
   257, 2048 (gate_up also at 300 and 512, the timed M, and at 300 with splits 2 and 7), splits
   1 and 3, plus small odd shapes (a partial row block, 8 and 4 groups; splits 8 over 4 groups
   leaves empty splits; odd group counts take E3's one-group tail).
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

Isolation (default; --no-smoke runs everything in this process, as before): the bits and a smoke
check run first in child processes, one per label group (base: today's blocks, the quantiser and
cuBLAS; e1; e3n: E3 narrow; e3w: E3 wide). A child runs its labels' bit checks, then builds each
timed row exactly as the timing does (rotating copies, the same workspace, eager run + CUDA-graph
capture) and replays every graph SMOKE_REPLAYS times with a synchronize after each label, writing
one JSON line before and after each step. A fault is sticky and kills the child's context, so the
last step it started names the culprit: the parent records it, starts another child for the labels
not yet checked (the culprit left out), and times only the labels that passed everything.
--repro: one more child replays a quantiser graph whose Q8 operand was freed and the cache emptied
(what the 2026-12-06 run's "quant" graph did): an illegal memory access there confirms the cause.

    PYQ2_LIBRARY=build/lab-e1/libpq2.so PYTHONPATH=. python3 lab/e1/probe_e1.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
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
            int(bn),
            int(st),
            splits,
            FAMILY_GEMM_SM90,
            warps=12 if kind == "e" else 8,
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
            print(
                f"WATCHDOG: no progress for {HANG_S:.0f} s; last step: {_progress['what']}",
                flush=True,
            )
            os._exit(3)


OURS = ["dispatch", "n128s6", "w128s4", "w128s6", "p96s6"] + E1_LABELS + E3_LABELS
# --e2 (a build of lab/e2/build.sh): the wide block's two-groups consumer at 128 tokens
E2_LABELS: list = []
CUBLAS = ["cublas_bf16", "cublas_fp8", "cublas_fp8_fast"]
# Graph replays per label in the smoke check (the timing's first replays, in a child process).
SMOKE_REPLAYS = 3
# A child process: at most this many seconds, and this many restarts of a group after faults.
CHILD_S = 240.0
MAX_RESTARTS = 8


def describe(label):
    """The label with its mode's name (E1 / E3 labels); "quant" and "cublas_*" as they are (the
    2026-12-06 probe read their "u" as a mode and would have failed at the table)."""
    mode = re.fullmatch(r"[en]\d+s\du(\d+)", label)
    return f"{label} ({MODES[int(mode.group(1))]})" if mode else label


def apply_filters(args):
    """--fast / --no-e1: the label lists (module globals, the same in every process)."""
    if args.fast:
        E1_LABELS[:] = [lb for lb in E1_LABELS if lb.startswith("e128s6")]
        E3_LABELS[:] = [lb for lb in E3_LABELS if lb.startswith(("n128s6", "e128s6"))]
        OURS[:] = ["dispatch", "n128s6", "w128s6"] + E1_LABELS + E3_LABELS
    if args.e2:
        E1_LABELS[:], E3_LABELS[:] = [], []
        E2_LABELS[:] = ["p128s4", "p128s5", "p128s6"]
        OURS[:] = ["dispatch", "n128s6", "p96s6"] + E2_LABELS
    if args.no_e1:
        E1_LABELS[:] = []
        OURS[:] = [lb for lb in OURS if lb in ("dispatch", "n128s6", "w128s6") or lb in E3_LABELS]


def timed_rows(args):
    if args.fast:
        return [("gate_up", 2048), ("down", 2048), ("gate_up", 512)]
    return [
        ("gate_up", 2048),
        ("down", 2048),
        ("in_proj", 2048),
        ("gate_up", 512),
        ("gate_up", 8192),
    ]


def bit_cases(args):
    """(weights name or (n, k), ms, splits list) of the bit checks. gate_up also at the timed
    M=512 and at M=300 (a partial token block, 3 splits of 40 groups: 13/13/14, and 2 and 7)."""
    big = ("gate_up", "down") if args.fast else ("gate_up", "down", "in_proj")
    base_ms = [17, 257, 2048] if args.fast else [17, 100, 257, 2048]
    cases = []
    for name in big:
        ms = sorted(set(base_ms + ([300, 512] if name == "gate_up" else [])))
        cases.append((name, ms, [1, 3]))
        if name == "gate_up":
            cases.append((name, [300], [2, 7]))
    cases += [((1056, 1024), [17, 130], [1, 3]), ((1056, 512), [17, 130], [1, 8])]
    return cases


def label_groups():
    """The smoke check's child processes: one per group of labels."""
    e = set(E1_LABELS) | set(E3_LABELS) | set(E2_LABELS)
    groups = {
        "e2": list(E2_LABELS),
        "base": [lb for lb in OURS if lb not in e] + ["quant"] + CUBLAS,
        "e1": list(E1_LABELS),
        "e3n": [lb for lb in E3_LABELS if lb.startswith("n")],
        "e3w": [lb for lb in E3_LABELS if lb.startswith("e")],
    }
    return {g: lbs for g, lbs in groups.items() if lbs}


def bits_labels_of(labels):
    """The labels checked against n128s6 (w128s6 and every E1 / E3 variant)."""
    return [
        lb
        for lb in labels
        if lb == "w128s6" or lb in E1_LABELS or lb in E3_LABELS or lb in E2_LABELS
    ]


def case_key(n, k, m, splits):
    return f"n={n} k={k} m={m} splits={splits}"


# ---- 1. bits ----------------------------------------------------------------------------------


def _nothing(**_):
    pass


def check_bits(ws, ms, splits_list, log, labels=None, emit=_nothing):
    """labels (default w128s6 and every E1 and E3 variant) against n128s6 on one Q8 operand per
    m: exact fp32 bits. emit(...) gets a line before each kernel and one per case."""
    w = ws[0]
    results = []
    labels = ["w128s6"] + E1_LABELS + E3_LABELS if labels is None else labels
    for m in ms:
        x = torch.randn(m, w.k, device="cuda").to(torch.bfloat16)
        q = quantize_q8(x, kernel_operand=False)
        for splits in splits_list:
            key = case_key(w.n, w.k, m, splits)
            sizes = []
            for lb in ["n128s6"] + labels:
                try:
                    sizes.append(w.workspace_size(m, cfg_of(lb, splits)))
                except Exception:  # noqa: BLE001 - the call below reports it
                    pass
            work = torch.empty(max(sizes) + 256, dtype=torch.uint8, device="cuda")
            ref = torch.full((m, w.n), float("nan"), device="cuda")
            progress(f"bits ref n128s6 {key}")
            emit(ev="start", what="bits", label="ref", case=key)
            w.matmul_q8(q, ref, workspace=work, cfg=cfg_of("n128s6", splits))
            torch.cuda.synchronize()
            ref_ok = not bool(ref.isnan().any())
            emit(ev="ref", case=key, n=w.n, k=w.k, m=m, splits=splits, ref_ok=ref_ok)
            out = torch.empty_like(ref)
            bad, checked = [], []
            for lb in labels:
                out.fill_(float("nan"))
                progress(f"bits {lb} {key}")
                emit(ev="start", what="bits", label=lb, case=key)
                try:
                    w.matmul_q8(q, out, workspace=work, cfg=cfg_of(lb, splits))
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - report and go on
                    torch.cuda.synchronize()  # a sticky device error raises: the process is done
                    bad.append(f"{lb}: {type(e).__name__}: {e}")
                    emit(ev="bits", label=lb, case=key, ok=False, detail=bad[-1])
                    continue
                checked.append(lb)
                if not torch.equal(out.view(torch.int32), ref.view(torch.int32)):
                    diff = (out != ref) | out.isnan()
                    bad.append(f"{lb}: {int(diff.sum())} of {out.numel()} outputs differ")
                    emit(ev="bits", label=lb, case=key, ok=False, detail=bad[-1])
                else:
                    emit(ev="bits", label=lb, case=key, ok=True)
            ok = not bad and ref_ok
            results.append(
                {
                    "n": w.n,
                    "k": w.k,
                    "m": m,
                    "splits": splits,
                    "ok": ok,
                    "bad": bad,
                    "labels": checked,
                }
            )
            log(
                f"bits {key}: "
                + (
                    "all exact"
                    if ok
                    else "MISMATCH "
                    + "; ".join(bad[:6])
                    + ("" if ref_ok else " (n128s6 left NaNs)")
                )
            )
    return results


def run_bits(args, weights, log, labels=None, emit=_nothing):
    out = []
    for what, ms, splits in bit_cases(args):
        if isinstance(what, str):
            out += check_bits(weights[what], ms, splits, log, labels, emit)
        else:
            n, k = what
            progress(f"weights {n}x{k}")
            ws = resident(n, k, "tiles", 2, 1, seed=2)
            out += check_bits(ws, ms, splits, log, labels, emit)
            del ws
    return out


def load_weights(args, log):
    weights = {}
    names = {name for name, _, _ in bit_cases(args) if isinstance(name, str)}
    names |= {name for name, _ in timed_rows(args)}
    for name in ("gate_up", "down", "in_proj"):
        if name not in names:
            continue
        n, k, _ = SHAPES[name]
        progress(f"weights {name}")
        weights[name] = resident(n, k, "tiles", 2, copies_for(pq2_bytes(n, k)))
        log(f"{name} {n}x{k}: {len(weights[name])} copies")
    return weights


# ---- 2. times ---------------------------------------------------------------------------------


def capture(fns):
    """fns run once on a side stream (module load), then captured in one CUDA graph.
    torch.cuda.graph empties the allocator's cache on entry: memory a graph of an earlier capture
    uses goes back to the driver if nothing holds it, and that graph's replay then faults (an
    illegal memory access). Whatever a graph touches must stay referenced (Row._alive)."""
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
    """One (shape, m): the graphs of the given labels (kernels of OURS, "quant", CUBLAS) over
    rotating weight copies. smoke: an emit function; then every graph is replayed SMOKE_REPLAYS
    times and synchronized right after its capture, with a line before and after (a child's
    smoke check)."""

    def __init__(self, name, n, k, m, ws, labels, smoke=None):
        self.name, self.n, self.k, self.m = name, n, k, m
        self.graphs, self.calls, self.configs, self.errors = {}, {}, {}, {}
        self.smoke = smoke
        # Everything the graphs read or write, held as long as the row (see capture()): the
        # 2026-12-06 run's "quant" graph wrote a Q8 operand freed when __init__ returned, whose
        # memory the next capture's empty_cache() gave back to the driver.
        self._alive = []
        self.x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        self.y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        self.ws = ws
        self.structs = [w.struct() for w in ws]
        # the workspace of every label of OURS, whichever are timed: the same in every process
        sizes = []
        for lb in OURS:
            try:
                sizes.append(ws[0].workspace_size(m, None if lb == "dispatch" else cfg_of(lb)))
            except Exception:  # noqa: BLE001 - that label's capture reports it
                pass
        self.work = torch.empty(max(sizes) + 256, dtype=torch.uint8, device="cuda")
        self.configs["dispatch"] = ws[0].config_for(m)
        self.cfgs = {}
        for lb in [lb for lb in OURS if lb in labels]:
            c = None if lb == "dispatch" else cfg_of(lb)
            self.cfgs[lb] = c
            fns = [
                lambda w=w, s=s, c=c: w.matmul(
                    self.x, out=self.y, workspace=self.work, cfg=c, w_struct=s
                )
                for w, s in zip(ws, self.structs, strict=True)
            ]
            self.add(lb, fns)
        if "quant" in labels:
            self.q = quantize_q8(self.x, kernel_operand=False)
            quant = [lambda q=self.q: quantize_q8(self.x, kernel_operand=False, out=q)] * 4
            self.add("quant", quant)
        if any(lb in labels for lb in CUBLAS):
            progress(f"cuBLAS weights {name} M={m}")
            self.add_cublas([lb for lb in CUBLAS if lb in labels])

    def add(self, lb, fns):
        where = f"{self.name} M={self.m}"
        progress(f"capture {lb} {where}")
        if self.smoke:
            self.smoke(ev="start", what="smoke", label=lb, row=where)
        self._alive.append(fns)
        try:
            g = capture(fns)
            if self.smoke:
                progress(f"smoke replay {lb} {where}")
                for _ in range(SMOKE_REPLAYS):
                    g.replay()
                torch.cuda.synchronize()
                self.smoke(ev="smoke", label=lb, row=where, ok=True)
            self.graphs[lb] = g
            self.calls[lb] = len(fns)
        except Exception as e:  # noqa: BLE001 - report and go on
            self.errors[lb] = f"{type(e).__name__}: {e}"
            if self.smoke:
                self.smoke(ev="smoke", label=lb, row=where, ok=False, detail=self.errors[lb])
            torch.cuda.synchronize()  # a sticky device error raises here: the process is done

    def add_cublas(self, labels):
        n, k, m = self.n, self.k, self.m
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        c16 = copies_for(n * k * 2)
        w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(c16)]
        out16 = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        c8 = copies_for(n * k)
        w8 = [(w16[i % c16] * 8).to(torch.float8_e4m3fn) for i in range(c8)]
        x8 = (x * 8).to(torch.float8_e4m3fn)
        one = torch.tensor(1.0 / 8, device="cuda")
        self._alive.append((x, w16, w8, x8, one, out16))
        if "cublas_bf16" in labels:
            self.add("cublas_bf16", [lambda w=w: torch.matmul(x, w.T, out=out16) for w in w16])
        for lb, fast in (("cublas_fp8", False), ("cublas_fp8_fast", True)):
            if lb not in labels:
                continue
            self.add(
                lb,
                [
                    lambda w=w, fast=fast: torch._scaled_mm(
                        x8,
                        w.t(),
                        scale_a=one,
                        scale_b=one,
                        out_dtype=torch.bfloat16,
                        use_fast_accum=fast,
                    )
                    for w in w8
                ],
            )

    def drop(self):
        self.graphs.clear()
        self._alive = []


def time_rows(rows, rounds, deadline, log, per):
    """`rounds` alternating rounds over every row's graphs (each round in another order: forward,
    backward, forward from the middle, ...) into per {(shape, m): {label: [us per round]}} (filled
    as it goes: what was measured survives an exception)."""
    for r in rows:
        per[(r.name, r.m)] = {lb: [] for lb in r.graphs}
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


# ---- 0. the smoke check, in child processes ---------------------------------------------------


def child_main(args):
    """One child: the bits of --child-bits, then the smoke check of --child-smoke on every timed
    row; JSON lines to --child-out (each step's start first, so a fault names its step)."""
    threading.Thread(target=_watchdog, daemon=True).start()
    f = open(args.child_out, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def emit(**ev):
        f.write(json.dumps(ev) + "\n")
        f.flush()

    def log(msg):
        print(f"[child {args.child}] {msg}", flush=True)

    progress("child init")
    _native.check(_native.load()[1].pq2_cuda_init())
    emit(ev="init")
    if args.child == "repro":
        return repro_freed_graph(emit, log)
    bits_labels = [lb for lb in args.child_bits.split(",") if lb]
    smoke_labels = [lb for lb in args.child_smoke.split(",") if lb]
    weights = load_weights(args, log)
    if bits_labels:
        run_bits(args, weights, log, bits_labels, emit)
    if smoke_labels:
        for name, m in timed_rows(args):
            n, k, _ = SHAPES[name]
            r = Row(name, n, k, m, weights[name], smoke_labels, smoke=emit)
            log(f"smoke {name} M={m}: {len(r.graphs)} graphs, errors {r.errors or 'none'}")
            r.drop()
            del r
    emit(ev="done")
    return 0


def repro_freed_graph(emit, log):
    """The 2026-12-06 run's quantiser graph: its Q8 operand dropped after the capture, then the
    cache emptied (as the next torch.cuda.graph capture does), then a replay."""
    n, k, _ = SHAPES["gate_up"]
    x = torch.randn(2048, k, device="cuda").to(torch.bfloat16)
    q = quantize_q8(x, kernel_operand=False)
    g = capture([lambda q=q: quantize_q8(x, kernel_operand=False, out=q)] * 4)
    del q
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    emit(ev="start", what="repro", label="quant(freed)", row="gate_up M=2048")
    g.replay()
    torch.cuda.synchronize()
    emit(ev="repro", ok=True)
    log("repro: no fault (the freed range was still mapped)")
    return 0


def run_child(args, group, bits_labels, smoke_labels, out_dir, attempt, log):
    """One child process; returns (rc, its events, the tail of its output)."""
    path = os.path.join(out_dir, f"child-{group}-{attempt}.jsonl")
    logp = os.path.join(out_dir, f"child-{group}-{attempt}.log")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        group,
        "--child-out",
        path,
        "--child-bits",
        ",".join(bits_labels),
        "--child-smoke",
        ",".join(smoke_labels),
    ]
    cmd += ["--fast"] if args.fast else []
    cmd += ["--no-e1"] if args.no_e1 else []
    cmd += ["--e2"] if args.e2 else []
    t0 = time.time()
    with open(logp, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
        while True:
            progress(f"child {group} attempt {attempt}")  # the child has its own watchdog
            try:
                rc = p.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if time.time() - t0 > CHILD_S:
                    p.kill()
                    rc = p.wait()
                    break
    events = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
    with open(logp) as f:
        tail = f.read()[-1500:]
    return rc, events, tail, time.time() - t0


def _error_line(tail):
    """The most telling line of a child's output (its CUDA error, else its last line)."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for key in ("CUDA error", "WATCHDOG", "Error", "error"):
        for ln in reversed(lines):
            if key in ln:
                return ln[:300]
    return lines[-1][:300] if lines else "(no output)"


def smoke_phase(args, out_dir, log):
    """Every group's bits and smoke check in child processes (restarted past each fault).
    Returns {passed: [...], faults: {label: why}, bits: {case: {...}}, children: [...]}."""
    rows = [f"{name} M={m}" for name, m in timed_rows(args)]
    faults, children = {}, []
    smoke_ok = {}  # label -> rows passed
    bits_seen = {}  # label -> cases done
    cases, bits_bad = {}, {}  # case -> its facts; case -> {label: why}
    n_cases = sum(len(ms) * len(sp) for _, ms, sp in bit_cases(args))
    passed = []
    for group, labels in label_groups().items():
        bits_todo = [] if args.no_bits else bits_labels_of(labels)
        smoke_todo = list(labels)
        for attempt in range(MAX_RESTARTS + 1):
            if not bits_todo and not smoke_todo:
                break
            rc, events, tail, secs = run_child(
                args, group, bits_todo, smoke_todo, out_dir, attempt, log
            )
            children.append(
                {
                    "group": group,
                    "attempt": attempt,
                    "rc": rc,
                    "seconds": round(secs, 1),
                    "bits": bits_todo,
                    "smoke": smoke_todo,
                }
            )
            last = None
            for ev in events:
                kind = ev.get("ev")
                if kind == "start":
                    last = ev
                elif kind == "bits":
                    bits_seen.setdefault(ev["label"], set()).add(ev["case"])
                    if not ev["ok"]:
                        bits_bad.setdefault(ev["case"], {})[ev["label"]] = ev["detail"]
                elif kind == "ref":
                    c = {k: ev[k] for k in ("n", "k", "m", "splits", "ref_ok")}
                    if ev["case"] in cases:
                        c["ref_ok"] = c["ref_ok"] and cases[ev["case"]]["ref_ok"]
                    cases[ev["case"]] = c
                elif kind == "smoke" and ev["ok"]:
                    smoke_ok.setdefault(ev["label"], set()).add(ev["row"])
                elif kind == "smoke":
                    faults[ev["label"]] = f"smoke {ev['row']}: {ev.get('detail', '')[:300]}"
            done = bool(events) and events[-1].get("ev") == "done" and rc == 0
            if not done:
                if last is None:
                    why = f"child {group} failed before its first check (rc {rc}): " + _error_line(
                        tail
                    )
                    log(why)
                    for lb in set(bits_todo) | set(smoke_todo):
                        faults.setdefault(lb, why)
                    break
                culprit = last["label"]
                where = last.get("case") or last.get("row")
                why = f"{last['what']} {where}: rc {rc}: {_error_line(tail)}"
                log(f"FAULT {group}: {culprit} at {why}")
                if culprit == "ref":  # the reference kernel itself: no bits in this group
                    for lb in bits_todo:
                        bits_bad.setdefault(last["case"], {})[lb] = f"{lb}: n128s6 faulted"
                    bits_todo = []
                else:
                    faults[culprit] = why
                    if last["what"] == "bits":
                        bits_bad.setdefault(last["case"], {})[culprit] = f"{culprit}: FAULT {why}"
            bits_todo = [
                lb for lb in bits_todo if lb not in faults and len(bits_seen.get(lb, ())) < n_cases
            ]
            smoke_todo = [
                lb
                for lb in smoke_todo
                if lb not in faults and len(smoke_ok.get(lb, ())) < len(rows)
            ]
            if done:
                break
        for lb in labels:
            if lb in faults:
                continue
            if len(smoke_ok.get(lb, ())) == len(rows):
                passed.append(lb)
            else:
                faults[lb] = "smoke check not completed"
        ok = [lb for lb in labels if lb in passed]
        log(
            f"smoke {group}: {len(ok)}/{len(labels)} labels pass"
            + (
                ""
                if len(ok) == len(labels)
                else "; left out: " + ", ".join(lb for lb in labels if lb not in passed)
            )
        )
    bits = []
    for key, c in cases.items():
        bad = list(bits_bad.get(key, {}).values())
        bits.append({"case": key, **c, "ok": not bad and c["ref_ok"], "bad": bad})
    for key in sorted(set(bits_bad) - set(cases)):  # the reference never finished there
        bits.append({"case": key, "ok": False, "bad": list(bits_bad[key].values())})
    for b in bits:
        log(
            f"bits {b['case']}: "
            + (
                "all exact"
                if b["ok"]
                else "MISMATCH "
                + "; ".join(b["bad"][:6])
                + ("" if b.get("ref_ok", True) else " (n128s6 left NaNs)")
            )
        )
    # labels whose bits were never checked at some case (a fault): listed, not timed-blocking
    if not args.no_bits:
        for lb in sorted(set(bits_labels_of(OURS))):
            if lb not in faults and len(bits_seen.get(lb, ())) < n_cases:
                log(f"bits {lb}: checked at {len(bits_seen.get(lb, ()))} of {n_cases} cases")
    return {
        "passed": passed,
        "faults": faults,
        "bits": bits,
        "children": children,
        "bits_cases": n_cases,
    }


# ---- 3. clocks --------------------------------------------------------------------------------


def sample_clock(g, seconds=1.2, skip=0.25):
    """nvidia-smi's SM clock (MHz) and power (W), medians of its 100 ms samples taken while g
    replays back to back for `seconds`, those of the first `skip` seconds dropped (matched by
    nvidia-smi's timestamps)."""
    dev = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    cmd = [
        "nvidia-smi",
        f"--id={dev}",
        "--query-gpu=timestamp,clocks.sm,power.draw",
        "--format=csv,noheader,nounits",
        "-lms",
        "100",
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
    ap.add_argument(
        "--e2", action="store_true", help="E2 at 128 tokens (lab/e2/build.sh) instead of E1/E3"
    )
    ap.add_argument(
        "--no-smoke",
        action="store_true",
        help="no child processes: bits and timings of every label in this process (one fault "
        "ends the run)",
    )
    ap.add_argument(
        "--repro",
        action="store_true",
        help="also replay, in a child, a quantiser graph whose Q8 operand was freed (the "
        "2026-12-06 fault's suspected cause)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--child-bits", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child-smoke", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    apply_filters(args)
    if args.child:
        return child_main(args)
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
            capture_output=True,
            text=True,
        ).stdout.strip()
        env["max_clock_power_limit"] = smi
        log(f"max SM clock, power limit: {smi}")
    except OSError:
        pass

    out_dir = (
        os.path.dirname(os.path.abspath(args.json))
        if args.json
        else tempfile.mkdtemp(prefix="e1-probe-")
    )
    os.makedirs(out_dir, exist_ok=True)
    smoke, repro = None, None
    if args.repro:
        rc, events, tail, secs = run_child(args, "repro", [], [], out_dir, 0, log)
        faulted = not any(ev.get("ev") == "repro" for ev in events)
        repro = {
            "rc": rc,
            "faulted": faulted,
            "seconds": round(secs, 1),
            "error": _error_line(tail) if faulted else None,
        }
        log(
            "repro (a quantiser graph replayed after its Q8 operand was freed and the cache "
            "emptied): " + (f"FAULTS: {repro['error']}" if faulted else "no fault")
        )
    if args.no_smoke:
        timed_labels = OURS + ["quant"] + CUBLAS
    else:
        smoke = smoke_phase(args, out_dir, log)
        timed_labels = [lb for lb in OURS + ["quant"] + CUBLAS if lb in smoke["passed"]]
        log(
            f"smoke: {len(smoke['children'])} child processes; timing {len(timed_labels)} "
            f"labels" + (f"; left out {sorted(smoke['faults'])}" if smoke["faults"] else "")
        )
    faults = smoke["faults"] if smoke else {}

    weights = load_weights(args, log)
    bits = []
    if smoke:
        bits = smoke["bits"]
    elif not args.no_bits:
        bits = run_bits(args, weights, log)
    bits_ok = all(b["ok"] for b in bits) and not any(lb in faults for lb in bits_labels_of(OURS))
    log(f"bits: {'ALL EXACT' if bits_ok else 'MISMATCHES OR FAULTS'} ({len(bits)} cases)")

    rows, per, fatal = [], {}, None
    try:
        for name, m in timed_rows(args):
            n, k, _ = SHAPES[name]
            r = Row(name, n, k, m, weights[name], timed_labels)
            rows.append(r)
            log(
                f"captured {name} M={m}: {len(r.graphs)} graphs, errors {r.errors or 'none'}; "
                f"dispatch {r.configs['dispatch']}"
            )
        time_rows(rows, args.rounds, deadline, log, per)
    except Exception as e:  # noqa: BLE001 - a sticky device error: report what was measured
        fatal = f"{_progress['what']}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        log(f"FATAL at {fatal}")
    med = {key: {lb: statistics.median(v) for lb, v in d.items() if v} for key, d in per.items()}

    clocks = {}
    if not args.no_clock and not fatal:
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
            main_k = [
                "dispatch",
                "n128s6",
                "w128s6",
                "e128s6u3",
                "e128s6u4",
                e1_best,
                e3_best,
                "cublas_bf16",
                "cublas_fp8_fast",
            ]
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
        "smoke": smoke,
        "repro": repro,
        "fatal": fatal,
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
        f"{'ALL EXACT vs n128s6' if bits_ok else 'MISMATCHES OR FAULTS (see above)'}"
        + (f"; FATAL at {fatal}" if fatal else "")
    )
    keys = [(name, m) for name, m in timed_rows(args)]
    cols = [f"{n} {m}" for n, m in keys]
    print(f"{'kernel':46s}" + "".join(f"{c:>15s}" for c in cols))
    for lb in ["quant"] + CUBLAS + OURS:
        cells = []
        for key in keys:
            v = med.get(key, {}).get(lb)
            base = med.get(key, {}).get("n128s6")
            cells.append(
                f"{'FAULT':>9s}     "
                if lb in faults
                else f"{v:9.1f} {v / base:4.2f}"
                if v and base and lb not in ("quant",)
                else (f"{v:9.1f}     " if v else f"{'-':>9s}     ")
            )
        print(f"{describe(lb):46s}" + "".join(f"{c:>15s}" for c in cells))
    print("(second number: time / n128s6 of the same column; FAULT: left out by the smoke check)")
    for lb, why in faults.items():
        print(f"left out {lb}: {why}")
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
                + (
                    f", {d[best] / d['cublas_bf16']:.3f} x cuBLAS bf16"
                    if "cublas_bf16" in d
                    else ""
                )
            )
    for k, c in clocks.items():
        if c:
            if c["samples"]:
                print(
                    f"clock {k}: {c['sm_mhz']:.0f} MHz, {c['power_w']:.0f} W "
                    f"({c['samples']} samples)"
                )
            else:
                print(f"clock {k}: no samples ({c.get('raw', '')!r})")
    print(
        "dispatch configs: "
        + "; ".join(
            f"{r.name} {r.m}: tokens {r.configs['dispatch']['tokens']} warps "
            f"{r.configs['dispatch']['warps']} stages {r.configs['dispatch']['stages']} splits "
            f"{r.configs['dispatch']['splits']}"
            for r in rows
        )
    )
    print(f"probe: {time.time() - t_start:.0f} s")
    return 0 if bits_ok and not fatal else 1


if __name__ == "__main__":
    sys.exit(main())
