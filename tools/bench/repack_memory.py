"""Peak resident memory of `pyq2 repack` and `pyq2 verify`, on a generated or a given GGUF file.

    python tools/bench/repack_memory.py                      # 3 GB PQ2_0 file, tiles rt=4
    python tools/bench/repack_memory.py --size-gb 1 --size-gb 3 --layout planes --lm-head
    python tools/bench/repack_memory.py --input model.gguf   # an existing file (not deleted)

For each input it runs, each in a child process whose peak RSS (VmHWM) it reports:

    open      import pyq2 and open the input (the floor every command starts from)
    repack    IN -> OUT in --layout
    verify    IN against OUT
    again     OUT -> BACK in --again-layout (default raw): a repacked file read slice by slice
    verify2   OUT against BACK

A generated model (streamed to disk, like the repacker's output) is PQ2_0 with tensors cycling
through the Ternary-Bonsai-2-27B projection shapes (the largest, ffn gate_up, is 47 MB;
--lm-head adds the 338 MB output head) and a 262144-token vocabulary like a real tokenizer's.
A streaming repacker's peak is set by its slices, not by the file or its largest tensor: the
figures must not grow with --size-gb or with --lm-head. Files go to --dir (default: a new
temporary directory) and are deleted unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:  # the installed package (with its native library); a bare source checkout falls back to numpy
    import pyq2  # noqa: F401
except ImportError:
    sys.path.insert(0, ROOT)

# (name, N, K) of the Bonsai-27B projections, cycled to fill the requested size.
SHAPES = [
    ("ffn_gate_up", 34816, 5120),
    ("ffn_down", 5120, 17408),
    ("attn_in_proj", 16384, 5120),
    ("attn_qkv", 14336, 5120),
    ("attn_out", 5120, 6144),
]
LM_HEAD = ("output", 248320, 5120)
VOCAB = 262144  # tokens of the generated tokenizer arrays (Gemma 3's vocabulary size)
CHUNK = 16 << 20


def generate(path: str, size_bytes: int, lm_head: bool, seed: int = 0) -> None:
    """Write a PQ2_0 GGUF of about size_bytes, streaming."""
    import numpy as np

    from pyq2.gguf import io as gguf_io
    from pyq2.gguf.io import GGUFValueType as V
    from pyq2.spec.formats import pq2_pack

    rng = np.random.default_rng(seed)
    # One pool of random 34-byte blocks (ternary codes, finite scales) that every tensor reads
    # from at a different offset: realistic bytes without generating gigabytes of randomness.
    pool_blocks = CHUNK // 34 + 1000  # a chunk plus the largest start offset below
    codes = rng.integers(0, 3, (pool_blocks, 128), dtype=np.uint8)
    scales = (rng.random(pool_blocks) * 0.02 + 1e-3).astype(np.float16)
    pool = pq2_pack(codes, scales).reshape(-1)

    tensors, total, layer = [], 0, 0
    if lm_head:
        name, n, k = LM_HEAD
        tensors.append(
            gguf_io.OutTensor(f"{name}.weight", gguf_io.PQ2_0, (k, n), n * k // 128 * 34)
        )
        total += tensors[-1].nbytes
    while total < size_bytes:
        for name, n, k in SHAPES:
            t = gguf_io.OutTensor(
                f"blk.{layer}.{name}.weight", gguf_io.PQ2_0, (k, n), n * k // 128 * 34
            )
            tensors.append(t)
            total += t.nbytes
        norm = gguf_io.OutTensor(f"blk.{layer}.norm.weight", 0, (5120,), 5120 * 4)
        tensors.append(norm)
        total += norm.nbytes
        layer += 1

    def data(i, t):
        if t.type_id == 0:
            yield np.ones(5120, "<f4")
            return
        start = (i * 34 * 7919) % (34 * 1000)  # block aligned, different per tensor
        left = t.nbytes
        while left:
            n = min(left, CHUNK // 34 * 34)
            yield pool[start : start + n]
            left -= n

    recs = [
        gguf_io.encode_kv("general.architecture", V.STRING, "qwen35"),
        gguf_io.encode_kv("general.file_type", V.UINT32, 141),
        gguf_io.encode_kv(
            "tokenizer.ggml.tokens", V.ARRAY, [f"<t{i}>" for i in range(VOCAB)], V.STRING
        ),
        gguf_io.encode_kv("tokenizer.ggml.scores", V.ARRAY, np.zeros(VOCAB, np.float32), V.FLOAT32),
    ]
    gguf_io.write_gguf(path, recs, tensors, data)


def describe(path: str) -> dict:
    from pyq2.gguf import io as gguf_io

    with gguf_io.open_gguf(path) as f:
        return {
            "tensors": len(f.tensors),
            "bytes": f.size,
            "largest_tensor_bytes": max((t.nbytes for t in f.tensors), default=0),
        }


def _child(argv: list[str]) -> None:
    """Run in the measured child: the pyq2 CLI (or just open the file), then report peak RSS."""
    if argv[0] == "open":
        from pyq2.gguf import io as gguf_io  # noqa: F401  (the imports of a command)

        with gguf_io.open_gguf(argv[1]):
            pass
        code = 0
    else:
        from pyq2.cli import main

        code = main(argv)
    hwm = next(
        int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")
    )
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"exit": code, "vmhwm_kb": hwm, "ru_maxrss_kb": ru}), file=sys.stderr)


def measure(argv: list[str]) -> dict:
    """Peak RSS (MB), exit status and seconds of one child run of _child(argv)."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "{}"
    try:
        res = json.loads(last)
    except json.JSONDecodeError:
        raise SystemExit(f"child failed ({p.returncode}): {p.stderr}") from None
    if res["exit"] != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {p.stderr.strip()}")
    return {
        "peak_mb": round(res["vmhwm_kb"] / 1024, 1),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def run_all(src: str, work: str, layout: str, rt: int, again: str) -> dict:
    """Measure every step of the module doc on the file src; returns {step: measurement}."""
    stem = os.path.join(work, os.path.basename(src).removesuffix(".gguf"))
    out, back = f"{stem}.mem-{layout}.gguf", f"{stem}.mem-{layout}-{again}.gguf"

    def to(layout: str) -> list[str]:
        return ["--layout", layout, "--force"] + (["--rt", str(rt)] if layout == "tiles" else [])

    steps = {
        "open": ["open", src],
        "repack": ["repack", src, "-o", out, *to(layout)],
        "verify": ["verify", src, out],
        "again": ["repack", out, "-o", back, *to(again)],
        "verify2": ["verify", out, back],
    }
    try:
        return {name: measure(argv) for name, argv in steps.items()}
    finally:
        for p in (out, back):
            if os.path.exists(p):
                os.unlink(p)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--size-gb", type=float, action="append", help="generated model size in GB (repeatable)"
    )
    ap.add_argument("--input", action="append", help="an existing GGUF file (repeatable)")
    ap.add_argument("--layout", default="tiles", choices=("raw", "planes", "tiles"))
    ap.add_argument("--again-layout", default="raw", choices=("raw", "planes", "tiles"))
    ap.add_argument("--rt", type=int, default=4)
    ap.add_argument("--lm-head", action="store_true", help="add the 338 MB output head")
    ap.add_argument("--dir", help="where to put the files (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the generated input files")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    sizes = args.size_gb or ([] if args.input else [3.0])
    work = args.dir or tempfile.mkdtemp(prefix="pyq2-mem-")
    os.makedirs(work, exist_ok=True)
    rows = []
    for path in args.input or []:
        rows.append({"input": path, **describe(path)})
        rows[-1]["steps"] = run_all(path, work, args.layout, args.rt, args.again_layout)
    for gb in sizes:
        src = os.path.join(work, f"model-{gb:g}GB{'-head' if args.lm_head else ''}.gguf")
        t0 = time.perf_counter()
        generate(src, int(gb * 1e9), args.lm_head)
        rows.append({"input": src, **describe(src), "generate_s": round(time.perf_counter() - t0)})
        try:
            rows[-1]["steps"] = run_all(src, work, args.layout, args.rt, args.again_layout)
        finally:
            if not args.keep:
                os.unlink(src)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layout": args.layout, "rt": args.rt, "rows": rows}, f, indent=1)
    names = ["open", "repack", "verify", "again", "verify2"]
    print(f"peak RSS in MB (repack to {args.layout}, again to {args.again_layout}):")
    print(f"{'file':>32} {'GB':>6} {'largest MB':>10} " + " ".join(f"{n:>8}" for n in names))
    for r in rows:
        peaks = " ".join(f"{r['steps'][n]['peak_mb']:8.1f}" for n in names)
        name = os.path.basename(r["input"])[-32:]
        print(f"{name:>32} {r['bytes'] / 1e9:6.2f} {r['largest_tensor_bytes'] / 1e6:10.1f} {peaks}")
    if not args.dir:
        try:
            os.rmdir(work)
        except OSError:
            pass


if __name__ == "__main__":
    main()
