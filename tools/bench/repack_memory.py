"""Peak resident memory of `pyq2 repack` on a large generated PQ2_0 GGUF.

    python tools/bench/repack_memory.py                      # 3 GB file, tiles rt=4
    python tools/bench/repack_memory.py --size-gb 1 --size-gb 3 --layout planes

For each size it writes a PQ2_0 model (streaming, like the repacker itself) whose tensors cycle
through the Ternary-Bonsai-2-27B projection shapes (shapes.py; the largest, ffn gate_up,
is 47 MB; --lm-head adds the 338 MB output head), then runs `python -m pyq2 repack` on it in a
child process and reports the child's peak RSS (VmHWM, and getrusage ru_maxrss). A streaming
repacker's peak is set by the largest tensor, not by the file: the figure must not grow with
--size-gb. A baseline child that only imports pyq2 and opens the file is measured too.
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
CHUNK = 16 << 20


def generate(path: str, size_bytes: int, lm_head: bool, seed: int = 0) -> dict:
    """Write a PQ2_0 GGUF of about size_bytes, streaming; returns a short description."""
    import numpy as np

    from pyq2 import gguf_io
    from pyq2.gguf_io import GGUFValueType as V

    rng = np.random.default_rng(seed)
    # One pool of random 34-byte blocks (ternary codes, finite scales) that every tensor reads
    # from at a different offset: realistic bytes without generating gigabytes of randomness.
    pool_blocks = CHUNK // 34 + 1000  # a chunk plus the largest start offset below
    pool = rng.integers(0, 3, (pool_blocks, 128), dtype=np.uint8)
    from pyq2.formats import pq2_pack

    pool = pq2_pack(pool, (rng.random(pool_blocks) * 0.02 + 1e-3).astype(np.float16)).reshape(-1)

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
    ]
    gguf_io.write_gguf(path, recs, tensors, data)
    return {
        "tensors": len(tensors),
        "bytes": os.path.getsize(path),
        "largest_tensor_bytes": max(t.nbytes for t in tensors),
    }


def _child(argv: list[str]) -> None:
    """Run in the measured child: the pyq2 CLI (or just open the file), then report peak RSS."""
    if argv[0] == "baseline":
        from pyq2 import gguf_io, repack  # noqa: F401  (same imports as a repack run)

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
    res["seconds"] = round(time.perf_counter() - t0, 2)
    res["stdout"] = p.stdout.strip()
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--size-gb", type=float, action="append", help="model size in GB (repeatable; default 3)"
    )
    ap.add_argument("--layout", default="tiles", choices=("raw", "planes", "tiles"))
    ap.add_argument("--rt", type=int, default=4)
    ap.add_argument("--lm-head", action="store_true", help="add the 338 MB output head")
    ap.add_argument("--dir", help="where to put the files (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    args = ap.parse_args()
    sizes = args.size_gb or [3.0]
    work = args.dir or tempfile.mkdtemp(prefix="pyq2-mem-")
    os.makedirs(work, exist_ok=True)
    rows = []
    for gb in sizes:
        src = os.path.join(work, f"model-{gb:g}GB.gguf")
        dst = os.path.join(work, f"model-{gb:g}GB.pyq2-{args.layout}.gguf")
        t0 = time.perf_counter()
        desc = generate(src, int(gb * 1e9), args.lm_head)
        gen_s = time.perf_counter() - t0
        base = measure(["baseline", src])
        run = measure(
            ["repack", src, "-o", dst, "--layout", args.layout, "--rt", str(args.rt), "--force"]
        )
        if run["exit"] != 0:
            raise SystemExit(f"repack failed: {run}")
        rows.append(
            {
                "size_gb": gb,
                **desc,
                "generate_s": round(gen_s, 1),
                "baseline_peak_mb": round(base["vmhwm_kb"] / 1024, 1),
                "repack_peak_mb": round(run["vmhwm_kb"] / 1024, 1),
                "repack_ru_maxrss_mb": round(run["ru_maxrss_kb"] / 1024, 1),
                "repack_s": run["seconds"],
                "summary": run["stdout"],
            }
        )
        if not args.keep:
            for p in (src, dst):
                if os.path.exists(p):
                    os.unlink(p)
    print(json.dumps(rows, indent=1))
    print(
        f"\n{'file GB':>8} {'tensors':>8} {'largest MB':>11} {'baseline MB':>12} "
        f"{'repack peak MB':>15} {'seconds':>8}"
    )
    for r in rows:
        print(
            f"{r['bytes'] / 1e9:8.2f} {r['tensors']:8d} {r['largest_tensor_bytes'] / 1e6:11.1f} "
            f"{r['baseline_peak_mb']:12.1f} {r['repack_peak_mb']:15.1f} {r['repack_s']:8.1f}"
        )
    if not args.keep and not args.dir:
        try:
            os.rmdir(work)
        except OSError:
            pass


if __name__ == "__main__":
    main()
