#!/usr/bin/env python3
"""What each GPU of a tensor-parallel decode must compute, measured on one GPU.

For a preset (default the 27B), times one decode step of the whole synthetic model and of each
rank's shard (pyq2.runtime.load.synthetic(preset, tp=(G, rank))) on this GPU, each as one CUDA
graph, the shards with collectives that do nothing: the time a rank needs before any communication,
so the best a G-GPU step can reach whatever its all-reduces cost; and, alone, its producers
(embedding, norms, rotations, Q8: not divided by G) and its projections. Rounds alternate the
models; the minimum over rounds is reported (pyq2.runtime.bench.measure times each), with the weight
bytes each step reads.

    python3 tools/bench/bench_tp_ranks.py --tp 2 --ms 1,4,16 --json out.json
"""

from __future__ import annotations

import argparse

import torch
from bench_matmul import start_run, write_results

from pyq2.runtime.bench import measure
from pyq2.runtime.load import synthetic


class NoCollective:
    """A rank's collective that communicates nothing (the rank's own work only)."""

    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank

    def all_reduce(self, t) -> None:
        pass

    def all_gather(self, t, out) -> None:
        pass


PARTS = ("ms", "producers_ms", "projections_ms", "side_ms")  # of pyq2.runtime.bench.measure


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="bonsai-2-27b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--ms", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    env, read_gbs = start_run()
    ms = [int(v) for v in args.ms.split(",")]
    names = ["whole"] + [f"rank {r}" for r in range(args.tp)]
    times = {p: {n: {m: [] for m in ms} for n in names} for p in PARTS}
    step_bytes: dict[str, int] = {}
    for _ in range(args.rounds):
        for name in names:
            if name == "whole":
                model, coll = synthetic(args.preset), None
            else:
                rank = int(name.split()[1])
                model = synthetic(args.preset, tp=(args.tp, rank))
                coll = NoCollective(args.tp, rank)
            step_bytes[name] = model.step_bytes(1)
            for m in ms:
                r = measure(model, m, read_gbs, args.replays, collective=coll)
                for part in PARTS:
                    times[part][name][m].append(r[part])
            del model
            torch.cuda.empty_cache()
    rows = []
    for m in ms:
        whole = min(times["ms"]["whole"][m])
        for name in names:
            best = {part: min(times[part][name][m]) for part in PARTS}
            rows.append({"m": m, "model": name, **best, "of_whole": best["ms"] / whole})
    if args.json:
        write_results(
            args.json,
            env,
            read_gbs,
            preset=args.preset,
            tp=args.tp,
            step_bytes_m1=step_bytes,
            rows=rows,
            times_ms={
                p: {n: {str(m): v for m, v in t.items()} for n, t in by.items()}
                for p, by in times.items()
            },
        )
    print(f"{args.preset} on {env['gpu']}, shards of {args.tp}, no communication:")
    head = ("m", "model", "GB/step", "step ms", "of whole", "producers", "projections", "side")
    print("{:>4}  {:8}  {:>8}  {:>8}  {:>8}  {:>9}  {:>11}  {:>6}".format(*head))
    for r in rows:
        gb = step_bytes[r["model"]] / 1e9
        print(
            f"{r['m']:>4}  {r['model']:8}  {gb:8.3f}  {r['ms']:8.3f}  {r['of_whole']:8.3f}  "
            f"{r['producers_ms']:9.3f}  {r['projections_ms']:11.3f}  {r['side_ms']:6.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
