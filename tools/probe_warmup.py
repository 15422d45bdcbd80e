#!/usr/bin/env python3
"""Why the decode bench warms up for 50 ms (NOTES v15d): lm_head at M=1 timed 81 us alone but
91 us right after the bench's cuBLAS timing of the same shape.

    python3 tools/probe_warmup.py alloc   # which buffers / allocations are slow after cuBLAS
    python3 tools/probe_warmup.py state   # read bandwidth and lm_head after cuBLAS, idle, sustained load

Run from tools/.. with PYQ2_LIBRARY pointing at a CUDA build (as tools/gpu_check.sh sets it).
"""
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, "tools")
from bench_decode import copies_for, graph_time_us, read_bandwidth_gbs, resident, time_cublas, time_pq2  # noqa: E402
from decode_shapes import SHAPES, pq2_bytes  # noqa: E402
from pyq2 import _native  # noqa: E402


def alloc():
    n, k, _ = SHAPES["lm_head"]
    cp = copies_for(pq2_bytes(n, k))
    def t(ws, label):
        us = [time_pq2(ws, 1) for _ in range(2)]
        print(f"{label:60s} {us[0]:6.1f} {us[1]:6.1f} us", flush=True)
    a = resident(n, k, "tiles", 2, cp)
    t(a, "1 fresh copies A")
    big = torch.empty(10 << 30, dtype=torch.uint8, device="cuda"); del big; torch.cuda.empty_cache()
    b = resident(n, k, "tiles", 2, cp)
    t(b, "2 copies B after a 10 GB alloc/free")
    t(a, "2' copies A again")
    time_cublas(n, k, 1); time_cublas(n, k, 16)
    t(a, "3 copies A after cuBLAS timing")
    t(b, "3' copies B after cuBLAS timing")
    c = resident(n, k, "tiles", 2, cp)
    t(c, "4 copies C allocated after cuBLAS")
    del a, b; torch.cuda.empty_cache()
    d = resident(n, k, "tiles", 2, cp)
    t(d, "5 copies D after freeing A and B")
    t(c, "5' copies C again")
    x = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for i in range(3):
        torch.matmul(torch.randn(1, k, device="cuda", dtype=torch.bfloat16), x.T)
    torch.cuda.synchronize()
    t(c, "6 copies C after plain bf16 GEMVs on a live 2.5 GB tensor")
    del x; torch.cuda.empty_cache()
    t(c, "7 copies C after freeing it")


def state():
    def smi():
        return subprocess.run(["nvidia-smi", "--query-gpu=temperature.gpu,temperature.memory,power.draw,clocks.sm,clocks.mem",
                               "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    n, k, _ = SHAPES["lm_head"]
    cp = copies_for(pq2_bytes(n, k))
    lm = resident(n, k, "tiles", 2, cp)
    print("cold: read GB/s", round(read_bandwidth_gbs()), round(read_bandwidth_gbs()), "| smi", smi(), flush=True)
    print("lm_head M=1 fresh", round(time_pq2(lm, 1), 1), flush=True)
    time_cublas(n, k, 1); time_cublas(n, k, 16)
    print("after cuBLAS: smi", smi(), flush=True)
    print("  read GB/s right after", round(read_bandwidth_gbs()), round(read_bandwidth_gbs()), flush=True)
    print("  lm_head M=1", round(time_pq2(lm, 1), 1), round(time_pq2(lm, 1), 1), flush=True)
    time.sleep(2)
    print("  after 2 s idle: read GB/s", round(read_bandwidth_gbs()), "lm_head", round(time_pq2(lm, 1), 1), flush=True)
    time_cublas(n, k, 1); time_cublas(n, k, 16)
    time.sleep(2)
    print("cuBLAS again, then 2 s idle: lm_head", round(time_pq2(lm, 1), 1), "| smi", smi(), flush=True)
    # our own sustained streaming: 1000 replays of the 4-copy lm_head graph at M=1 (~0.33 s)
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    y = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    work = torch.empty(lm[0].workspace_size(1), dtype=torch.uint8, device="cuda")
    fns = [lambda w=w: w.matmul(x, out=y, workspace=work) for w in lm]
    _, times = graph_time_us(fns, replays=1000)
    print("sustained pq2 lm_head M=1, median per 100 replays:", [round(statistics.median(times[i:i + 100]), 1) for i in range(0, 1000, 100)], flush=True)
    print("  smi", smi(), "read GB/s right after", round(read_bandwidth_gbs()), flush=True)
    w0 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    fns = [lambda: torch.matmul(x, w0.T)]
    _, times = graph_time_us(fns, replays=1000)
    print("sustained cuBLAS lm_head M=1 (one 2.5 GB copy), median per 100:", [round(statistics.median(times[i:i + 100]), 1) for i in range(0, 1000, 100)], flush=True)
    print("  right after: lm_head pq2", round(time_pq2(lm, 1), 1), "read GB/s", round(read_bandwidth_gbs()), "| smi", smi(), flush=True)


if __name__ == "__main__":
    _native.check(_native.load()[1].pq2_cuda_init())
    {"alloc": alloc, "state": state}[sys.argv[1] if len(sys.argv) > 1 else "state"]()
