"""Timing on the GPU: the read bandwidth (the byte floor's denominator) and CUDA graph replays.

pyq2 bench and its tensor-parallel ranks (pyq2.parallel) time with these.
"""

from __future__ import annotations

from .gpu import _torch

READ_BYTES = 2 << 30


def read_bandwidth_gbs() -> float:
    """GB/s of torch's sum over 2 GiB of float32 (a lower bound of the read bandwidth)."""
    torch = _torch()
    x = torch.ones(READ_BYTES // 4, device="cuda")
    x.sum()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(10):
        start.record()
        x.sum()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    del x
    torch.cuda.empty_cache()
    return READ_BYTES / (best * 1e-3) / 1e9


def graph_ms(fn, replays: int) -> float:
    """Milliseconds per replay of fn captured as one CUDA graph (median of 5 batches)."""
    torch = _torch()
    fn()  # eager first: lazy initialisation stays out of the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    del g
    return sorted(times)[2]
