"""`pyq2 bench`: a model's whole weight path on the GPU, in tokens per second.

For a file (`pyq2 bench MODEL.gguf`, loaded with pyq2.runtime.load.load) or a preset of real shapes
with random ternary weights (`--synthetic bonsai-2-27b`, pyq2.runtime.load.synthetic), it times one
decode step (pyq2.runtime.step.DecodeStep: embedding + inverse rotation, per layer the fused
norm / mixer / SwiGLU producers and every projection, the head) at each m of `--ms`, each
captured as one CUDA graph, and a prompt of `--prompt N` tokens the same way. It prints the
time per step, tokens per second, the time of the producers, of the ternary projections and of
the un-folded side projections (ssm_alpha, ssm_beta: dense, through torch) alone, and the byte
floor: the bytes a step must read (every projection's weights, the embedding rows) over the
read bandwidth measured in the same run (torch's sum over 2 GiB, a few percent below what a
dedicated streaming kernel reaches). `--no-fuse` runs sibling projections as separate matmuls.
Attention, the recurrence and the other non-weight work of the model are not included.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .. import atomic
from ..gguf import io as gguf_io
from ..gguf import metadata
from ..lib import native as _native
from ..lib.optional import require_torch
from . import launch as parallel
from .collective import Collective
from .load import Model, load, synthetic
from .step import DecodeStep
from .timing import environment, fill_random_mixers, graph_ms, read_bandwidth_gbs


def measure(
    model: Model,
    m: int,
    read_gbs: float,
    replays: int,
    fuse: bool = True,
    collective: Collective | None = None,
) -> dict[str, Any]:
    """One decode step of m tokens timed whole and by kinds of call (module docstring)."""
    step = DecodeStep(model, m, fuse=fuse, collective=collective)
    fill_random_mixers(step)
    whole = graph_ms(step.run, replays)
    producers = graph_ms(lambda: step.run(("embedding", "producer")), replays)
    projections = graph_ms(lambda: step.run(("projection",)), replays)
    side = graph_ms(lambda: step.run(("side",)), replays) if model.plan.v_heads else 0.0
    floor = model.step_bytes(m) / (read_gbs * 1e9) * 1e3
    return {
        "m": m,
        "ms": whole,
        "tokens_per_s": m / whole * 1e3,
        "producers_ms": producers,
        "projections_ms": projections,
        "side_ms": side,
        "floor_ms": floor,
        "x_floor": whole / floor,
        "calls": len(step.calls),
    }


def run(args) -> int:
    """The command (cli.py parses the arguments)."""
    try:
        torch = require_torch()
        ok = torch.cuda.is_available()
    except RuntimeError:
        ok = False
    if not ok:
        print("pyq2: error: pyq2 bench needs a CUDA GPU and PyTorch with CUDA", file=sys.stderr)
        return 1
    lib = _native.load()[1]
    if not lib.pq2_built_with_cuda():
        print("pyq2: error: this libpq2 was built without CUDA", file=sys.stderr)
        return 1
    files = list(args.model or [])
    tp = args.tp if args.tp is not None else (len(files) if len(files) > 1 else None)
    if len(files) == 1:
        with gguf_io.open_gguf(files[0]) as gf:
            shard = metadata.shard_of(gf)
        if shard is not None:
            print(
                f"pyq2: error: {files[0]} is shard {shard[1]} of {shard[0]}; give all {shard[0]} "
                f"shards of its set (pyq2 bench --tp {shard[0]} SHARD...)",
                file=sys.stderr,
            )
            return 1
    if tp is not None:
        return _run_tp(args, tp, files)
    _native.check(lib.pq2_cuda_init())
    if args.synthetic:
        model = synthetic(args.synthetic)
    else:
        model = load(files[0], progress=_progress)
        print("", file=sys.stderr)
    read_gbs = read_bandwidth_gbs()
    if args.whole:
        return _run_whole(args, model, read_gbs)
    plan = model.plan
    print(
        f"{model.source}: {plan.n_layers} layers ({len(plan.attention_layers)} attention), "
        f"{len(model.weights)} ternary weights, {model.step_bytes(1) / 1e9:.2f} GB read per step; "
        f"read bandwidth {read_gbs:.0f} GB/s (torch sum); siblings "
        f"{'separate' if args.no_fuse else 'fused'}"
    )
    rows = []
    ms = [int(v) for v in args.ms.split(",")] + ([args.prompt] if args.prompt else [])
    for m in ms:
        r = measure(model, m, read_gbs, args.replays, fuse=not args.no_fuse)
        rows.append(r)
        label = f"prompt of {m}" if args.prompt and m == args.prompt else f"decode m={m}"
        print(
            f"{label:16s} {r['ms']:8.3f} ms  {r['tokens_per_s']:9.0f} tok/s  "
            f"{r['x_floor']:5.2f}x floor {r['floor_ms']:.3f} ms  "
            f"(alone: producers {r['producers_ms']:.3f}, projections {r['projections_ms']:.3f}, "
            f"un-folded side projections {r['side_ms']:.3f} ms)"
        )
    print("weight path only: attention, the recurrence and the residual work are not included")
    if args.json:
        _write_json(
            args.json,
            {
                "env": environment(),
                "model": model.source,
                "read_bandwidth_gbs": read_gbs,
                "step_bytes_m1": model.step_bytes(1),
                "fused": not args.no_fuse,
                "rows": rows,
            },
        )
    return 0


def _run_whole(args, model: Model, read_gbs: float) -> int:
    """`pyq2 bench --whole` (pyq2.runtime.bench_model)."""
    from ..plan.decode import PRESETS
    from ..spec import qwen35
    from .bench_model import measure_whole
    from .open_model import read_metadata

    prompt = args.prompt or 2048
    if args.synthetic:
        kv = dict(PRESETS[args.synthetic].keys(context=prompt + args.decode + 2))
    else:
        with gguf_io.open_gguf(args.model[0]) as gf:
            kv = read_metadata(gf)
    config = qwen35.Config.from_metadata(kv)
    ms = [int(v) for v in (args.ms if args.ms != "1,4,8,16" else "1,4,16").split(",")]
    print(
        f"{model.source}: the whole model, prompts of {prompt} tokens then {args.decode} "
        f"decode steps; read bandwidth {read_gbs:.0f} GB/s (torch sum)"
    )
    rows = []
    for b in ms:
        r = measure_whole(model, config, b, prompt, args.decode, read_gbs, args.replays)
        rows.append(r)
        print(
            f"batch {b:3d}: time to first token {r['ttft_ms']:9.1f} ms  decode "
            f"{r['decode_tokens_per_s']:8.0f} tok/s ({r['decode_step_ms']:.3f} ms a step, "
            f"{r['x_floor']:.2f}x floor {r['floor_ms']:.3f} ms; alone: weight path "
            f"{r['weight_path_ms']:.3f}, attention {r['attention_ms']:.3f}, recurrence "
            f"{r['recurrence_ms']:.3f}, rest {r['rest_ms']:.3f} ms)"
        )
    if args.json:
        _write_json(
            args.json,
            {"env": environment(), "model": model.source, "read_bandwidth_gbs": read_gbs,
             "whole": rows},
        )  # fmt: skip
    return 0


def _write_json(path: str, result: dict[str, Any]) -> None:
    """--json: the whole file or none (pyq2.atomic.atomic_output; an existing one is replaced)."""
    with atomic.atomic_output(path, force=True) as staged, open(staged, "w") as f:
        json.dump(result, f, indent=1)


def _run_tp(args, tp: int, files: list[str]) -> int:
    """`pyq2 bench --tp G` (pyq2.runtime.launch)."""
    try:
        if len(files) > 1:
            files = parallel.shard_files(files)
        source = args.synthetic or files[0]
        opts = {
            "ms": [int(v) for v in args.ms.split(",")] + ([args.prompt] if args.prompt else []),
            "replays": args.replays,
            "fuse": not args.no_fuse,
        }
        result = parallel.launch(tp, parallel.bench_rank, tp, source, files, opts)
    except (RuntimeError, ValueError) as e:
        print(f"pyq2: error: {e}", file=sys.stderr)
        return 1
    print(
        f"{result['model']}: tensor-parallel over {tp} GPUs ({result['env']['gpu']}), "
        f"{result['step_bytes_m1_rank0'] / 1e9:.2f} GB read per step by rank 0; siblings "
        f"{'fused' if result['fused'] else 'separate'}"
    )
    parallel.print_rows(result)
    print("weight path only: attention, the recurrence and the residual work are not included")
    if args.json:
        _write_json(args.json, result)
    return 0


def _progress(done: int, total: int, name: str) -> None:
    print(f"\rloading {done / max(total, 1):6.1%} {name[:40]:40s}", end="", file=sys.stderr)
