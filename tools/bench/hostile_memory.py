"""Peak resident memory of the `pyq2` commands on hostile shapes (docs/cli.md, "Memory").

    python tools/bench/hostile_memory.py                 # every case, in a new temporary dir
    python tools/bench/hostile_memory.py --case wide-row --keep --dir /tmp/h

Cases (each file generated, streamed to disk):

    wide-row    one PQ2_0 weight of one row of K = 2^29 (136 MB): the row is the whole file
    wide-rows   one PQ2_0 weight of 32 rows of K = 2^25 (285 MB): 8.9 MB a row
    array       a 100 MB metadata array (25 million INT32) and one small weight
    name-array  the same array as general.name (a key info shows)
    shape-key   an I8 tensor whose pyq2.tensor.*.shape is a 100 MB array (12.5 million u64)
    strings     a metadata array of 4 million short strings (50 MB)
    tensors     a million one-element F32 tensors (71 MB of header)

For each it runs `pyq2 info`, `pyq2 info --json`, `pyq2 repack` (tiles, planes, raw) and `pyq2
verify` of the planes output against the input, each in its own process, and prints its peak
RSS (/usr/bin/time's "Maximum resident set size", or getrusage of the child where that is
missing), its exit status, its wall time and the bytes it wrote on stderr (one error line, or
the 62 MB "line" a crafted shape key once made). Output goes to /dev/null; files are deleted
unless --keep. `--launcher SCRIPT` measures another checkout (SCRIPT stands for `-m`).
"""

from __future__ import annotations

import argparse
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

import numpy as np  # noqa: E402

from pyq2.gguf import io as gguf_io  # noqa: E402
from pyq2.gguf.io import GGUFValueType as V  # noqa: E402
from pyq2.gguf.io import OutTensor  # noqa: E402

CHUNK = 16 << 20
CASES = ("wide-row", "wide-rows", "array", "name-array", "shape-key", "strings", "tensors")


def _pq2_rows(n: int, k: int):
    """(OutTensor, data callable) of an n x k PQ2_0 weight of finite scales, streamed."""
    nbytes = n * k // 128 * 34
    block = np.zeros((CHUNK // 34, 34), np.uint8)
    block[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    block[:, 2:] = 0x55
    flat = block.reshape(-1)

    def chunks():
        left = nbytes
        while left:
            piece = flat[: min(left, flat.size)]
            left -= piece.size
            yield piece

    return OutTensor("w", gguf_io.PQ2_0, (k, n), nbytes), chunks


def generate(case: str, path: str) -> None:
    records: list[bytes] = [gguf_io.encode_kv("general.architecture", V.STRING, "hostile")]
    tensors, data = [], []
    if case in ("wide-row", "wide-rows"):
        t, chunks = _pq2_rows(1, 1 << 29) if case == "wide-row" else _pq2_rows(32, 1 << 25)
        tensors, data = [t], [chunks]
    else:
        t, chunks = _pq2_rows(4, 256)
        tensors, data = [t], [chunks]
        if case in ("array", "name-array"):
            values = np.arange(25_000_000, dtype=np.int32)
            key = "general.big" if case == "array" else "general.name"
            records.append(gguf_io.encode_kv(key, V.ARRAY, values, V.INT32))
        elif case == "shape-key":
            shape = np.full(12_500_000, 128, dtype=np.uint64)
            for key, vtype, value, *item in (
                ("pyq2.format_version", V.UINT32, 2),
                ("pyq2.tensor.x.layout", V.STRING, "planes"),
                ("pyq2.tensor.x.rt", V.UINT32, 0),
                ("pyq2.tensor.x.shape", V.ARRAY, shape, V.UINT64),
                ("pyq2.tensor.x.source_type", V.UINT32, 142),
                ("pyq2.tensor.x.crc32", V.UINT32, 0),
            ):
                records.append(gguf_io.encode_kv(key, vtype, value, *item))
            tensors.append(OutTensor("x", gguf_io.I8, (34,), 34))
            data.append(lambda: (bytes(34),))
        elif case == "strings":
            words = [f"w{i:07d}" for i in range(4_000_000)]
            records.append(gguf_io.encode_kv("tokenizer.ggml.tokens", V.ARRAY, words, V.STRING))
        else:
            one = np.ones(1, np.float32).tobytes()
            for i in range(1_000_000):
                tensors.append(OutTensor(f"t{i}", 0, (1,), 4))
                data.append(lambda one=one: (one,))
    gguf_io.write_gguf(path, records, tensors, lambda i, t: data[i]())


LAUNCH = ["-m", "pyq2"]  # --launcher SCRIPT: [SCRIPT, "pyq2"] (another checkout's pyq2)


def measure(argv: list[str]) -> tuple[float, int, float, int]:
    """(peak RSS in MB, exit status, seconds, bytes of its stderr) of `python -m pyq2 ARGV`."""
    cmd = [sys.executable, *LAUNCH, *argv]
    t0 = time.perf_counter()
    if os.path.exists("/usr/bin/time"):
        p = subprocess.run(
            ["/usr/bin/time", "-v", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        lines = p.stderr.splitlines()
        at = next(i for i, x in enumerate(lines) if "Command being timed" in x)
        line = next(x for x in lines if "Maximum resident set size" in x)
        peak = int(line.split(":")[1]) / 1024
        err = len("\n".join(lines[:at]))
        return peak, p.returncode, time.perf_counter() - t0, err
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    q = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024
    return peak, q.returncode, time.perf_counter() - t0, len(q.stderr)


def run_case(case: str, work: str) -> list[tuple[str, float, int, float]]:
    """Generate the case's file and measure every command on it."""
    src = os.path.join(work, f"{case}.gguf")
    generate(case, src)
    size = os.path.getsize(src) / 1e6
    planes = os.path.join(work, f"{case}.planes.gguf")
    commands = [
        ["info", src],
        ["info", src, "--json"],
        ["repack", src, "-o", os.path.join(work, f"{case}.tiles.gguf")],
        ["repack", src, "-o", planes, "--layout", "planes"],
        ["repack", src, "-o", os.path.join(work, f"{case}.raw.gguf"), "--layout", "raw"],
        ["verify", src, planes],
    ]
    rows = []
    for argv in commands:
        peak, code, secs, err = measure(argv)
        what = " ".join(a if not a.startswith(work) else os.path.basename(a) for a in argv)
        rows.append((what, peak, code, secs))
        print(
            f"{case:10s} {size:7.1f} MB  {what:60s} {peak:8.1f} MB  exit {code}  {secs:6.2f} s"
            f"  stderr {err} B",
            flush=True,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--case", action="append", choices=CASES, help="(repeatable; default all)")
    ap.add_argument("--dir", help="where the files go (default: a new temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the files")
    ap.add_argument(
        "--launcher",
        metavar="SCRIPT",
        help="run SCRIPT pyq2 ARGV instead of python -m pyq2 ARGV (to measure another checkout)",
    )
    args = ap.parse_args()
    if args.launcher:
        LAUNCH[:] = [args.launcher, "pyq2"]
    work = args.dir or tempfile.mkdtemp(prefix="pyq2-hostile-")
    os.makedirs(work, exist_ok=True)
    try:
        for case in args.case or CASES:
            run_case(case, work)
    finally:
        if not args.keep:
            for name in os.listdir(work):
                if name.endswith(".gguf"):
                    os.unlink(os.path.join(work, name))
            if not args.dir:
                os.rmdir(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
