"""A tensor-parallel decode step on G GPUs of one host: one process per GPU, NCCL between them.

`launch(g, fn, *args)` starts g processes (torch.multiprocessing, spawned), rank r on cuda:r,
joined in one NCCL process group (torch.distributed over a TCP port of this host) with NVLink
multicast off (NCCL_NVLS_ENABLE=0, unless the environment says otherwise), and calls
fn(rank, *args) in each; it returns what rank 0's fn returned, and raises the first error of any
rank (its traceback on stderr with PYQ2_DEBUG=1), ending the other ranks; no rank outlives it,
also when a signal interrupts it. Each rank loads its shard (pyq2.runtime.load.load of the file of
its rank that `pyq2 repack --tp G` wrote, or pyq2.runtime.load.synthetic(preset, tp=(G, rank))) and
runs pyq2.runtime.step.DecodeStep with a pyq2.runtime.collective.Nccl.

`bench_rank` is `pyq2 bench --tp G` in one rank: it times the whole model on rank 0's GPU alone
(a synthetic preset; the other ranks wait), then the sharded step on all G, each captured as a
CUDA graph with its collectives; rank 0 reports.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..gguf import io as gguf_io
from ..gguf import metadata
from ..gguf.splits import order_shards
from ..lib import native as _native
from ..lib.optional import require_torch
from .collective import Nccl
from .load import load, synthetic
from .step import DecodeStep
from .timing import environment, fill_random_mixers, graph_ms, read_bandwidth_gbs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, g: int, port: int, queue: Any, fn: Callable, args: tuple) -> None:
    torch = require_torch()
    dist = torch.distributed
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://127.0.0.1:{port}",
            world_size=g,
            rank=rank,
            device_id=torch.device("cuda", rank),
        )
        _native.check(_native.load()[1].pq2_cuda_init())
        result = fn(rank, *args)
        dist.barrier()
        queue.put((rank, "ok", result if rank == 0 else None))
    except BaseException as e:  # reported to the parent, which raises it
        queue.put((rank, "error", (f"{type(e).__name__}: {e}", traceback.format_exc())))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(g: int, fn: Callable, *args: Any) -> Any:
    """fn(rank, *args) in g processes of one NCCL group (module docstring); rank 0's result."""
    torch = require_torch()
    if g > torch.cuda.device_count():
        raise RuntimeError(
            f"tensor parallelism over {g} GPUs needs {g} GPUs; this host has "
            f"{torch.cuda.device_count()}"
        )
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp = torch.multiprocessing.get_context("spawn")
    queue = mp.Queue()
    port = _free_port()
    procs = [mp.Process(target=_rank_main, args=(r, g, port, queue, fn, args)) for r in range(g)]
    results: dict[int, Any] = {}
    error, trace = None, ""
    try:
        for p in procs:
            p.start()
        while error is None and len(results) < g:
            try:
                rank, status, value = queue.get(timeout=2.0)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead and queue.empty():
                    error = f"rank {dead[0]} ended with exit code {procs[dead[0]].exitcode}"
                continue
            if status == "error":
                error, trace = f"rank {rank}: {value[0]}", value[1]
            else:
                results[rank] = value
    finally:  # on any error or signal here too: no rank outlives the launch
        for p in procs:
            if p.is_alive() and (error is not None or len(results) < g):
                p.terminate()
            if p.pid is not None:
                p.join()
    if error is not None:
        if os.environ.get("PYQ2_DEBUG"):
            print(trace, file=sys.stderr)
        raise RuntimeError(error)
    return results.get(0)


def shard_files(paths: Sequence[str]) -> list[str]:
    """The files of a shard set ordered by rank (order_shards). ValueError when they are not
    ranks 0..G-1 of one G, each once."""
    found = []
    for path in paths:
        with gguf_io.open_gguf(path) as gf:
            found.append((str(path), metadata.shard_of(gf)))
    return order_shards(found)


def bench_rank(rank: int, g: int, source: str, files: list[str], opts: dict) -> dict:
    """One rank of `pyq2 bench --tp G` (module docstring); rank 0 returns the results."""
    torch = require_torch()
    dist = torch.distributed
    ms, replays, fuse = opts["ms"], opts["replays"], opts["fuse"]
    single: dict[int, float] = {}
    read_gbs = 0.0
    if rank == 0:
        read_gbs = read_bandwidth_gbs()
        if files == []:  # a preset: the whole model on this GPU first
            whole = synthetic(source)
            for m in ms:
                step = DecodeStep(whole, m, fuse=fuse)
                fill_random_mixers(step)
                single[m] = graph_ms(step.run, replays)
                del step
            del whole
            torch.cuda.empty_cache()
    dist.barrier()
    model = synthetic(source, tp=(g, rank)) if files == [] else load(files[rank])
    collective = Nccl()
    rows = []
    for m in ms:
        step = DecodeStep(model, m, fuse=fuse, collective=collective)
        fill_random_mixers(step)
        dist.barrier()
        whole_ms = graph_ms(step.run, replays)
        dist.barrier()
        reduce_ms = graph_ms(lambda s=step: s.run(("reduce", "gather")), replays)
        rows.append(
            {
                "m": m,
                "ms": whole_ms,
                "tokens_per_s": m / whole_ms * 1e3,
                "collectives_ms": reduce_ms,
                "single_gpu_ms": single.get(m),
                "ratio_to_single": whole_ms / single[m] if m in single else None,
                "calls": len(step.calls),
            }
        )
        del step
    return {
        "model": model.source,
        "tp": g,
        "env": environment() if rank == 0 else None,  # only rank 0's result is reported
        "read_bandwidth_gbs": read_gbs,
        "step_bytes_m1_rank0": model.step_bytes(1),
        "fused": fuse,
        "rows": rows,
    }


def print_rows(result: dict, out=sys.stdout) -> None:
    g = result["tp"]
    for r in result["rows"]:
        single = r["single_gpu_ms"]
        vs = (
            f"  1 GPU {single:8.3f} ms  ratio {r['ratio_to_single']:.3f}"
            if single is not None
            else ""
        )
        print(
            f"decode m={r['m']:<4d} {g} GPUs {r['ms']:8.3f} ms  {r['tokens_per_s']:9.0f} tok/s  "
            f"(alone: collectives {r['collectives_ms']:.3f} ms){vs}",
            file=out,
        )
