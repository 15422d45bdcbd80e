"""Timing on the GPU: the read bandwidth (the byte floor's denominator), CUDA graph replays and
the environment a result belongs to (GPU, driver, versions, commit).

pyq2 bench, its tensor-parallel ranks (pyq2.runtime.launch) and the benchmarks in tools/bench time
with these.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from typing import Any

from ..lib import native as _native
from ..lib.optional import require_torch

READ_BYTES = 2 << 30


def read_bandwidth_gbs() -> float:
    """GB/s of torch's sum over 2 GiB of float32 (a lower bound of the read bandwidth)."""
    torch = require_torch()
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
    torch = require_torch()
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


def source_commit() -> str:
    """The commit results belong to: $PQ2_COMMIT, else the HEAD of the checkout pyq2 runs from
    (with '+dirty' for uncommitted changes), else 'unknown' (an installed package or a copied
    tree without .git: set PQ2_COMMIT)."""
    if os.environ.get("PQ2_COMMIT"):
        return os.environ["PQ2_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        print(
            "# warning: no PQ2_COMMIT and no git checkout: the results name commit 'unknown'",
            file=sys.stderr,
        )
        return "unknown"
    return head + ("+dirty" if dirty else "")


def environment() -> dict[str, Any]:
    """What a result was measured on: date (UTC), GPU, driver, torch and CUDA versions, the
    commit and the loaded libpq2."""
    torch = require_torch()
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        smi = "nvidia-smi not found"
    ffi, lib = _native.load()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "nvidia_smi": smi,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": source_commit(),
        "libpq2": ffi.string(lib.pq2_version_string()).decode(),
    }


def fill_random_mixers(step: Any, seed: int = 0) -> None:
    """A benchmark's stand-in for the host's attention and recurrence: every mixer output of a
    DecodeStep filled with standard normal values (deterministic in `seed`)."""
    torch = require_torch()
    for layer in sorted(step.mixer_out):
        out = step.mixer_out[layer]
        gen = torch.Generator(device=out.device).manual_seed(seed * 1_000_003 + layer)
        x = torch.randn(out.shape, generator=gen, device=out.device)
        out.copy_(x.to(out.dtype))
