"""Repack the PQ2-family weights of a GGUF file into a resident layout, and verify the result.

Every PQ2_0 tensor, every PTQ1_0 and TQ2_0 tensor (both first turned into PQ2_0 blocks, which is
lossless) and every weight an earlier pyq2 run repacked is converted to the requested layout
("raw", "planes" or "tiles"; see pyq2.gguf_io for how planes/tiles weights are stored). All other
tensors and all metadata pass through byte for byte. The file is streamed: weights are read,
checked and converted in slices of rows, other tensors copied in chunks, and every piece is
written and dropped before the next is read, into a temporary file that replaces OUT only when
complete. Peak memory is therefore a few slices (tools/repack_memory.py measures it), whatever the
size of the model or of its largest tensor.

The conversions run in libpq2 when it loads (pyq2.host) and in numpy otherwise (pyq2.layouts,
pyq2.formats); both produce the same bytes.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import gguf_io
from .errors import FormatError
from .formats import PQ2_BLOCK_BYTES, PQ2_BLOCK_WEIGHTS
from .gguf_io import I8, PQ2_0, PTQ1_0, TQ2_0, GGUFFile, GGUFValueType, OutTensor, Tensor, \
    WeightInfo

PASS_CHUNK = 64 << 20  # bytes of a pass-through tensor copied (and released) at a time
CONVERT_CHUNK = 16 << 20  # PQ2_0 bytes of a weight converted at a time

Progress = Callable[[int, int, str], None]  # (bytes done, bytes total, tensor name)


class RepackError(ValueError):
    """A request pyq2 refuses: output equals input, output exists, bad layout or rt."""


@dataclass
class Summary:
    in_path: str
    out_path: str
    layout: str
    rt: int
    dry_run: bool
    backend: str
    converted: int = 0
    passed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "mb_per_s": round(self.mb_per_s, 1)}

    def line(self) -> str:
        what = "would write" if self.dry_run else "wrote"
        layout = f"{self.layout} rt={self.rt}" if self.layout == "tiles" else self.layout
        return (f"{what} {self.out_path} ({layout}): {self.converted} tensors converted, "
                f"{self.passed} passed through; {self.bytes_in / 1e6:.1f} MB in, "
                f"{self.bytes_out / 1e6:.1f} MB out, {self.seconds:.2f} s, "
                f"{self.mb_per_s:.1f} MB/s [{self.backend}]")


# ------------------------------------------------------------------------------ backends ----

class _Ops:
    """The three conversions repack needs, from libpq2 or numpy."""

    def __init__(self, backend: str = "auto"):
        if backend not in ("auto", "native", "numpy"):
            raise RepackError(f"unknown backend {backend!r} (auto, native, numpy)")
        native = False
        if backend != "numpy":
            from . import _native
            native = backend == "native" or _native.available()
            if native:
                _native.load()  # backend="native" without a library raises LibraryError here
        if native:
            from . import host
            self.name = "libpq2"
            self.convert, self.ptq1_to_pq2, self.tq2_to_pq2 = \
                host.convert_layout, host.ptq1_to_pq2, host.tq2_to_pq2
        else:
            from . import formats, layouts
            self.name = "numpy"
            self.convert, self.ptq1_to_pq2, self.tq2_to_pq2 = \
                layouts.convert, formats.ptq1_to_pq2, formats.tq2_to_pq2
        from . import layouts
        self.layout_bytes = layouts.layout_bytes  # pure arithmetic, same in both

    def to_raw(self, src: np.ndarray, info: WeightInfo) -> np.ndarray:
        """PQ2_0 raw blocks of a weight in any stored form."""
        if info.layout != "raw":
            return self.convert(src, info.n, info.k, info.layout, "raw", info.rt, 0)
        if info.source_type == PTQ1_0:
            return self.ptq1_to_pq2(src)
        if info.source_type == TQ2_0:
            return self.tq2_to_pq2(src)
        return src


def _stored_bytes(ops: _Ops, info: WeightInfo) -> int:
    if info.layout != "raw":
        return ops.layout_bytes(info.layout, info.n, info.k, info.rt)
    return gguf_io.type_nbytes(info.source_type, info.ne)


def check_scales(raw: np.ndarray, name: str, k: int, row0: int = 0) -> None:
    """FormatError naming tensor, row and block of the first NaN/Inf scale of raw PQ2_0 blocks
    (raw holds rows row0, row0 + 1, ... of the tensor)."""
    d = raw.reshape(-1, PQ2_BLOCK_BYTES)[:, :2].copy().view("<f2").reshape(-1)
    bad = ~np.isfinite(d)
    if bad.any():
        g = k // PQ2_BLOCK_WEIGHTS
        b = int(np.argmax(bad))
        bits = int(d[b:b + 1].view("<u2")[0])
        raise FormatError(f"tensor '{name}': row {row0 + b // g}, block {b % g} has scale {d[b]} "
                          f"(bits 0x{bits:04x}); {int(bad.sum())} non-finite scales in this "
                          f"part of the tensor")


def _source_row_bytes(info: WeightInfo) -> int:
    per_block = {PQ2_0: (128, 34), PTQ1_0: (128, 28), TQ2_0: (256, 66)}[info.source_type]
    return info.k // per_block[0] * per_block[1]


def raw_slices(ops: _Ops, gf: GGUFFile, t: Tensor, info: WeightInfo, rows: int):
    """Yield (first row, PQ2_0 raw bytes of up to `rows` rows) over the whole weight t.

    A raw-family source (PQ2_0, PTQ1_0, TQ2_0) is read and converted one slice at a time, and
    its pages are dropped after each, so memory stays near one slice whatever the tensor size.
    A planes/tiles source (a repacked file being repacked again) is turned into raw bytes whole.
    """
    row_bytes = info.k // PQ2_BLOCK_WEIGHTS * PQ2_BLOCK_BYTES
    if info.layout != "raw":
        raw = ops.to_raw(gf.data(t), info)
        gf.release(t)
        for r0 in range(0, info.n, rows):
            yield r0, raw[r0 * row_bytes:min(r0 + rows, info.n) * row_bytes]
        return
    src_row = _source_row_bytes(info)
    for r0 in range(0, info.n, rows):
        r1 = min(r0 + rows, info.n)
        src = gf.data(t, r0 * src_row, r1 * src_row)
        yield r0, ops.to_raw(src, info)
        del src
        gf.release(t, r0 * src_row, r1 * src_row)


def convert_weight(ops: _Ops, gf: GGUFFile, t: Tensor, info: WeightInfo, layout: str, rt: int):
    """Yield the bytes of weight t in `layout`, checking every scale on the way.

    The weight is converted in slices of whole rows (raw_slices). This relies on a property of
    the layouts (pq2.h): for a slice of rows that starts at a multiple of the tile height, the
    planes/tiles bytes of the slice are one contiguous piece of the tensor's code region followed
    by one contiguous piece of its scale region. So the code pieces are written as they come and
    the scale pieces (1/17 of the bytes) are kept and written after them.
    """
    g = info.k // PQ2_BLOCK_WEIGHTS
    row_bytes = g * PQ2_BLOCK_BYTES
    tr = 16 * rt if layout == "tiles" else 1
    rows = max(tr, CONVERT_CHUNK // row_bytes // tr * tr)
    scale_parts = []
    for r0, raw in raw_slices(ops, gf, t, info, rows):
        n = len(raw) // row_bytes
        check_scales(raw, t.name, info.k, r0)
        if layout == "raw":
            yield raw
            continue
        out = ops.convert(raw, n, info.k, "raw", layout, 0, rt)
        split = -(-n // tr) * tr * g * 32  # code bytes of the slice, padding rows included
        yield out[:split]
        scale_parts.append(np.array(out[split:]))
        del out, raw
    yield from scale_parts


# -------------------------------------------------------------------------------- repack ----

def default_out_path(in_path, layout: str) -> Path:
    """IN with its .gguf suffix (and any earlier .pyq2-<layout>) replaced by .pyq2-<layout>.gguf."""
    p = Path(in_path)
    stem = p.name[:-5] if p.name.endswith(".gguf") else p.name
    for old in gguf_io.LAYOUTS:
        if stem.endswith(f".pyq2-{old}"):
            stem = stem[:-len(f".pyq2-{old}")]
    return p.with_name(f"{stem}.pyq2-{layout}.gguf")


def _check_paths(in_path: str, out_path: str, force: bool) -> None:
    if not os.path.exists(in_path):
        raise FileNotFoundError(2, "No such file or directory", in_path)
    same = os.path.realpath(in_path) == os.path.realpath(out_path)
    if not same and os.path.exists(out_path):
        same = os.path.samefile(in_path, out_path)
    if same:
        raise RepackError(f"output {out_path} is the input file; choose another -o")
    if os.path.isdir(out_path):
        raise RepackError(f"output {out_path} is a directory")
    if os.path.lexists(out_path) and not force:
        raise RepackError(f"output {out_path} exists (use --force to overwrite)")


def _weight_plan(gf: GGUFFile, ops: _Ops, t: Tensor, layout: str, rt: int):
    """(WeightInfo, OutTensor) of a PQ2-family tensor, or None for a pass-through tensor."""
    info = gf.weight_info(t)
    if info is None:
        return None
    gf.validate_weight_bytes(t, info, _stored_bytes(ops, info))
    if layout == "raw":
        raw_bytes = info.n * (info.k // PQ2_BLOCK_WEIGHTS) * PQ2_BLOCK_BYTES
        return info, OutTensor(t.name, PQ2_0, info.ne, raw_bytes)
    if len(info.ne) > 2:
        raise FormatError(f"tensor '{t.name}' has shape {list(info.ne)}: the {layout} layout "
                          f"holds 2-D matrices only (use --layout raw)")
    nbytes = ops.layout_bytes(layout, info.n, info.k, rt)
    return info, OutTensor(t.name, I8, (nbytes,), nbytes)


def _pyq2_keys(plan, layout: str, rt: int) -> list[bytes]:
    U32, U64, STR, ARR = (GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.STRING,
                          GGUFValueType.ARRAY)
    recs = [gguf_io.encode_kv(gguf_io.KEY_FORMAT_VERSION, U32, gguf_io.PQ2_FORMAT_VERSION),
            gguf_io.encode_kv(gguf_io.KEY_LAYOUT, STR, layout)]
    key = gguf_io.tensor_key
    for _, info, out in plan:
        if info is None:
            continue
        recs += [gguf_io.encode_kv(key(out.name, "layout"), STR, layout),
                 gguf_io.encode_kv(key(out.name, "rt"), U32, rt if layout == "tiles" else 0),
                 gguf_io.encode_kv(key(out.name, "shape"), ARR, list(info.ne), U64),
                 gguf_io.encode_kv(key(out.name, "source_type"), U32, info.source_type)]
    return recs


def repack(in_path, out_path=None, layout: str = "tiles", rt: int = 2, dry_run: bool = False,
           force: bool = False, progress: Progress | None = None, backend: str = "auto") -> Summary:
    """Convert every PQ2-family weight of IN to `layout` and write OUT (see the module doc)."""
    t0 = time.perf_counter()
    if layout not in gguf_io.LAYOUTS:
        raise RepackError(f"unknown layout {layout!r}: choose one of {', '.join(gguf_io.LAYOUTS)}")
    if layout == "tiles":
        if rt not in (1, 2, 4):
            raise RepackError(f"--rt must be 1, 2 or 4 for the tiles layout, got {rt}")
    else:
        rt = 0
    in_path = os.fspath(in_path)
    if out_path is None:
        out_path = default_out_path(in_path, layout)
    out_path = os.fspath(out_path)
    _check_paths(in_path, out_path, force)
    ops = _Ops(backend)
    summary = Summary(in_path, out_path, layout, rt, dry_run, ops.name)

    with gguf_io.open_gguf(in_path) as gf:
        plan = []  # (source tensor, WeightInfo or None, OutTensor)
        for t in gf.tensors:
            w = _weight_plan(gf, ops, t, layout, rt)
            plan.append((t, None, OutTensor(t.name, t.type_id, t.ne, t.nbytes)) if w is None
                        else (t, w[0], w[1]))
        records = [gf.kv_record(k) for k in gf.keys() if not k.startswith(gguf_io.KEY_PREFIX)]
        if layout != "raw" and any(info is not None for _, info, _ in plan):
            # A file without PQ2-family weights stays a plain GGUF file, identical to IN.
            records += _pyq2_keys(plan, layout, rt)
        outs = [out for _, _, out in plan]
        total = sum(t.nbytes for t, _, _ in plan)
        done = 0

        def tensor_data(i: int, out: OutTensor):
            nonlocal done
            t, info, _ = plan[i]
            if info is None:
                for start in range(0, t.nbytes, PASS_CHUNK):
                    stop = min(start + PASS_CHUNK, t.nbytes)
                    yield gf.data(t, start, stop)
                    gf.release(t, start, stop)
                    done += stop - start
                    if progress:
                        progress(done, total, t.name)
                if t.nbytes == 0:
                    yield b""
                summary.passed += 1
                return
            yield from convert_weight(ops, gf, t, info, layout, rt)
            done += t.nbytes
            summary.converted += 1
            if progress:
                progress(done, total, t.name)

        try:
            if dry_run:
                for i, out in enumerate(outs):
                    for chunk in tensor_data(i, out):
                        del chunk
                summary.bytes_out = gguf_io.file_size(records, outs, gf.alignment, gf.version)
            else:
                summary.bytes_out = gguf_io.write_gguf(out_path, records, outs, tensor_data,
                                                       alignment=gf.alignment, version=gf.version)
        except FormatError as e:
            if not str(e).startswith(gf.path):
                raise FormatError(f"{gf.path}: {e}") from None
            raise
        summary.bytes_in = gf.size
    summary.seconds = time.perf_counter() - t0
    return summary


# -------------------------------------------------------------------------------- verify ----

@dataclass
class VerifyResult:
    ok: bool
    message: str
    weights: int = 0  # PQ2-family tensors compared as codes + scales
    others: int = 0  # other tensors compared byte for byte
    n_weights: int = 0  # individual weights compared


def _first_block_mismatch(name: str, a: np.ndarray, b: np.ndarray, k: int, row0: int) -> str:
    """Describe the first differing PQ2_0 block of two equal-length raw buffers of rows row0..."""
    from .formats import pq2_unpack
    ba, bb = a.reshape(-1, PQ2_BLOCK_BYTES), b.reshape(-1, PQ2_BLOCK_BYTES)
    i = int(np.argmax((ba != bb).any(axis=1)))
    g = k // PQ2_BLOCK_WEIGHTS
    row, blk = row0 + i // g, i % g
    ca, da = pq2_unpack(ba[i])
    cb, db = pq2_unpack(bb[i])
    if ba[i, :2].tobytes() != bb[i, :2].tobytes():
        return (f"tensor '{name}' row {row} block {blk}: scale {da[0]} "
                f"(0x{ba[i, :2].view('<u2')[0]:04x}) vs {db[0]} (0x{bb[i, :2].view('<u2')[0]:04x})")
    j = int(np.argmax(ca[0] != cb[0]))
    return (f"tensor '{name}' row {row} column {blk * PQ2_BLOCK_WEIGHTS + j}: code "
            f"{ca[0, j]} ({int(ca[0, j]) - 1:+d}) vs {cb[0, j]} ({int(cb[0, j]) - 1:+d})")


def _compare_bytes(fa: GGUFFile, ta: Tensor, fb: GGUFFile, tb: Tensor) -> str | None:
    for start in range(0, ta.nbytes, PASS_CHUNK):
        stop = min(start + PASS_CHUNK, ta.nbytes)
        a, b = fa.data(ta, start, stop), fb.data(tb, start, stop)
        if not np.array_equal(a, b):
            off = start + int(np.argmax(a != b))
            return f"tensor '{ta.name}' ({ta.type_name}): bytes differ at offset {off}"
        del a, b
        fa.release(ta, start, stop)
        fb.release(tb, start, stop)
    return None


def verify(original, repacked, backend: str = "auto") -> VerifyResult:
    """Decode every weight of both files and compare; compare everything else byte for byte."""
    ops = _Ops(backend)
    res = VerifyResult(True, "")

    def fail(msg: str) -> VerifyResult:
        res.ok, res.message = False, msg
        return res

    with gguf_io.open_gguf(original) as fa, gguf_io.open_gguf(repacked) as fb:
        names_a = [t.name for t in fa.tensors]
        names_b = {t.name for t in fb.tensors}
        for n in names_a:
            if n not in names_b:
                return fail(f"tensor '{n}' is missing from {fb.path}")
        extra = names_b - set(names_a)
        if extra:
            return fail(f"tensor '{sorted(extra)[0]}' of {fb.path} is not in {fa.path}")
        keys_a = [k for k in fa.keys() if not k.startswith(gguf_io.KEY_PREFIX)]
        keys_b = [k for k in fb.keys() if not k.startswith(gguf_io.KEY_PREFIX)]
        for ka, kb in zip(keys_a, keys_b):
            if ka != kb:
                return fail(f"metadata differs: key '{ka}' vs '{kb}'")
            if fa.kv_record(ka) != fb.kv_record(kb):
                return fail(f"metadata key '{ka}' has a different type or value")
        if len(keys_a) != len(keys_b):
            longer, shorter = (keys_a, keys_b) if len(keys_a) > len(keys_b) else (keys_b, keys_a)
            return fail(f"metadata key '{longer[len(shorter)]}' is only in one file")

        for ta in fa.tensors:
            tb = fb.tensor(ta.name)
            wa, wb = fa.weight_info(ta), fb.weight_info(tb)
            if (wa is None) != (wb is None):
                return fail(f"tensor '{ta.name}' is {ta.type_name} {list(ta.ne)} in {fa.path} "
                            f"but {tb.type_name} {list(tb.ne)} in {fb.path}")
            if wa is None:
                if (ta.type_id, ta.ne) != (tb.type_id, tb.ne):
                    return fail(f"tensor '{ta.name}': {ta.type_name} {list(ta.ne)} vs "
                                f"{tb.type_name} {list(tb.ne)}")
                msg = _compare_bytes(fa, ta, fb, tb)
                if msg:
                    return fail(msg)
                res.others += 1
                continue
            if wa.ne != wb.ne:
                return fail(f"tensor '{ta.name}': logical shape {list(wa.ne)} vs {list(wb.ne)}")
            fa.validate_weight_bytes(ta, wa, _stored_bytes(ops, wa))
            fb.validate_weight_bytes(tb, wb, _stored_bytes(ops, wb))
            rows = max(1, CONVERT_CHUNK // (wa.k // PQ2_BLOCK_WEIGHTS * PQ2_BLOCK_BYTES))
            for (r0, ra), (_, rb) in zip(raw_slices(ops, fa, ta, wa, rows),
                                         raw_slices(ops, fb, tb, wb, rows)):
                if not np.array_equal(ra, rb):
                    return fail(_first_block_mismatch(ta.name, np.asarray(ra), np.asarray(rb),
                                                      wa.k, r0))
            res.weights += 1
            res.n_weights += wa.n * wa.k
    res.message = (f"identical: {res.weights} weight tensors ({res.n_weights} weights, codes and "
                   f"scales) and {res.others} other tensors match, metadata matches")
    return res
