"""Reading the PQ2-family weights of a GGUF file as raw PQ2_0 rows: what repack and verify share.

A weight may be stored as PQ2_0, PTQ1_0 or TQ2_0 blocks, or in a layout an earlier repack wrote
(pyq2.gguf.metadata). `raw_slices` turns any of them into raw PQ2_0 blocks, a slice of rows at a
time, so memory stays near one slice whatever the size of the tensor, whichever the stored
layout. Where a slice of whole rows would be too wide (column_mode: a row of millions of
weights), `read_block` reads a block of a few rows and a range of 128-groups instead.

The conversions run in libpq2 when it loads (pyq2.lib.cpu) and in numpy otherwise
(pyq2.spec.layouts, pyq2.spec.formats): `Backend` makes that choice once; both produce the same
bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import FormatError, RepackError
from ..lib import cpu as host
from ..lib import native as _native
from ..spec import formats, layouts
from .io import GGUFFile, Tensor
from .metadata import WeightInfo
from .types import PTQ1_0, TQ2_0, block_size, type_nbytes

PASS_CHUNK = 16 << 20  # bytes of a pass-through tensor copied or compared (then released) at a time
CONVERT_CHUNK = 16 << 20  # raw PQ2_0 bytes of a weight converted at a time

BACKENDS = ("auto", "native", "numpy")


Progress = Callable[[int, int, str], None]  # (bytes done, bytes total, tensor name)


class Backend:
    """The conversions between stored weights and raw PQ2_0 blocks, from libpq2 or numpy.

    "auto" takes libpq2 when it loads and numpy otherwise; "native" insists on libpq2 (and raises
    LibraryError without it); "numpy" never loads it.
    """

    name: str
    convert: Callable[..., np.ndarray]  # (buf, n, k, src layout, dst layout, src rt, dst rt)
    ptq1_to_pq2: Callable[..., np.ndarray]
    tq2_to_pq2: Callable[..., np.ndarray]

    def __init__(self, backend: str = "auto"):
        if backend not in BACKENDS:
            raise RepackError(f"unknown backend {backend!r} ({', '.join(BACKENDS)})")
        native = False
        if backend != "numpy":
            native = backend == "native" or _native.available()
            if native:
                _native.load()
        if native:
            self.name = "libpq2"
            self.convert = host.convert_layout
            self.ptq1_to_pq2, self.tq2_to_pq2 = host.ptq1_to_pq2, host.tq2_to_pq2
        else:
            self.name = "numpy"
            self.convert = layouts.convert
            self.ptq1_to_pq2, self.tq2_to_pq2 = formats.ptq1_to_pq2, formats.tq2_to_pq2

    def to_raw(self, src: np.ndarray, info: WeightInfo, rows: int) -> np.ndarray:
        """PQ2_0 raw blocks of `rows` rows of a weight in its stored form (raw_slices says
        what a slice of a planes or tiles weight holds)."""
        if info.layout != "raw":
            return self.convert(src, rows, info.k, info.layout, "raw", info.rt, 0)
        if info.source_type == PTQ1_0:
            return self.ptq1_to_pq2(src)
        if info.source_type == TQ2_0:
            return self.tq2_to_pq2(src)
        return src


def stored_bytes(info: WeightInfo) -> int:
    """Bytes the weight described by info takes in its file."""
    if info.layout != "raw":
        return layouts.layout_bytes(info.layout, info.n, info.k, info.rt)
    return type_nbytes(info.source_type, info.ne)


def stored_tile_rows(info: WeightInfo) -> int:
    """Rows per tile of the layout a weight is stored in: a slice read from it starts at a
    multiple of this (1 for raw-family and planes weights)."""
    return layouts.tile_rows(info.layout, info.rt)


def slice_rows(k: int, *multiples: int) -> int:
    """Rows of a K-wide weight to convert at a time: about CONVERT_CHUNK bytes of raw PQ2_0, a
    multiple of every one of `multiples` (the tile heights of the layouts read and written)."""
    m = math.lcm(1, *multiples)
    row_bytes = formats.pq2_matrix_bytes(1, k)
    return max(m, CONVERT_CHUNK // row_bytes // m * m)


def raw_slices(
    backend: Backend,
    gf: GGUFFile,
    t: Tensor,
    info: WeightInfo,
    rows: int,
    first: int = 0,
    count: int | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (row, PQ2_0 raw bytes of up to `rows` rows) over rows [first, first + count) of the
    weight t (the whole weight by default); rows are counted from `first`.

    Each slice is read, converted and its pages dropped before the next is read, so memory
    stays near one slice whatever the size of the tensor. A raw-family source (PQ2_0, PTQ1_0,
    TQ2_0) stores its rows one after another. A planes/tiles source stores a slice that starts
    at a multiple of its tile height as one piece of its code region and one of its scale
    region (FORMATS.md, "Slices"), so `first` and `rows` must be multiples of
    stored_tile_rows(info), and first + count one too or the weight's last row (the rows of a
    member of a fused matrix, pyq2.offline.fuse, are).
    """
    count = info.n - first if count is None else count
    if info.layout == "raw":
        src_row = type_nbytes(info.source_type, (info.k,))
        for r0 in range(0, count, rows):
            r1 = min(r0 + rows, count)
            start, stop = (first + r0) * src_row, (first + r1) * src_row
            src = gf.data(t, start, stop)
            yield r0, backend.to_raw(src, info, r1 - r0)
            del src
            gf.release(t, start, stop)
        return
    tr = stored_tile_rows(info)
    if rows % tr or first % tr:
        raise ValueError(
            f"slices of {rows} rows from row {first} do not start on {info.layout} tiles of "
            f"{tr} rows"
        )
    for r0 in range(0, count, rows):
        r1 = min(r0 + rows, count)
        codes, scales = layouts.slice_ranges(
            info.layout, info.n, info.k, info.rt, first + r0, first + r1
        )
        piece = np.concatenate(
            [gf.data(t, codes.start, codes.stop), gf.data(t, scales.start, scales.stop)]
        )
        gf.release(t, codes.start, codes.stop)
        gf.release(t, scales.start, scales.stop)
        yield r0, backend.to_raw(piece, info, r1 - r0)
        del piece


# ---- wide rows: blocks of rows x columns ---------------------------------------------------
#
# A slice of whole rows is as wide as the matrix: a row of 100 million weights is 27 MB of raw
# PQ2_0, and a slice must hold a whole tile of rows (up to 64). Where that exceeds
# CONVERT_CHUNK (column_mode), readers take blocks of a few rows and a range of 128-groups
# instead, so memory stays near CONVERT_CHUNK however wide a row is. In every stored layout the
# bytes of such a block lie in a few contiguous ranges: per row for raw and planes (FORMATS.md
# 2: block (n, g) at (n*G + g)*34, codes at n*K/4 + 32g, scales at S + 2(n*G + g)), per tile for
# tiles (codes of tile t, groups g0..g1 at (t*G + g0)*RT*512 .. (t*G + g1)*RT*512, scales at
# S + 2*(t*G + g0)*RT*16 .. S + 2*(t*G + g1)*RT*16), and those ranges are themselves the
# layout of the block as a matrix of its own (one tile of G' = g1 - g0 groups).


def column_mode(k: int, *multiples: int) -> bool:
    """Whether a slice of slice_rows(k, *multiples) rows is too wide for CONVERT_CHUNK: then
    a weight is read in blocks of rows and columns (read_block)."""
    rows = math.lcm(1, *multiples)
    return rows * formats.pq2_matrix_bytes(1, k) > CONVERT_CHUNK


def block_groups(k: int, band: int, budget: int | None = None) -> int:
    """128-groups of a block of `band` rows (the tallest read or written at once) that fit the
    budget, by default a quarter of CONVERT_CHUNK (a block is read, converted and copied a few
    times over); an even number, as a TQ2_0 block holds two."""
    budget = CONVERT_CHUNK // 4 if budget is None else budget
    groups = budget // (max(band, 1) * formats.PQ2_BLOCK_BYTES)
    return min(k // formats.PQ2_BLOCK_WEIGHTS, max(2, groups // 2 * 2))


def read_block(
    backend: Backend, gf: GGUFFile, t: Tensor, info: WeightInfo, a: int, b: int, g0: int, g1: int
) -> np.ndarray:
    """PQ2_0 raw bytes of rows [a, b) and 128-groups [g0, g1) of the weight t (stored as `info`
    says), row by row: (b - a) x (g1 - g0) blocks. A tiles source is read a tile at a time (the
    tiles that rows [a, b) lie in), a TQ2_0 one by its 256-weight blocks."""
    k, n = info.k, info.n
    g = k // formats.PQ2_BLOCK_WEIGHTS
    cols = g1 - g0
    if not (0 <= a < b <= n and 0 <= g0 < g1 <= g):
        raise ValueError(f"block rows [{a}, {b}), groups [{g0}, {g1}) of a {n} x {g} weight")
    rows = []
    if info.layout == "raw":
        sizes = block_size(info.source_type)
        assert sizes is not None
        block, size = sizes
        per = block // formats.PQ2_BLOCK_WEIGHTS  # groups per source block (2 for TQ2_0)
        stride = k // block * size
        a0, a1 = g0 // per, -(-g1 // per)  # the source blocks that hold the groups
        cut = g0 - a0 * per  # groups of the first source block before g0
        for r in range(a, b):
            src = gf.data(t, r * stride + a0 * size, r * stride + a1 * size)
            row = backend.to_raw(src, info, 1)
            if per > 1:
                row = row.reshape(-1, formats.PQ2_BLOCK_BYTES)[cut : cut + cols].reshape(-1)
            rows.append(row)
        return np.concatenate(rows) if len(rows) > 1 else rows[0]
    if info.layout == "planes":
        s = n * k // 4
        codes = [gf.data(t, r * k // 4 + 32 * g0, r * k // 4 + 32 * g1) for r in range(a, b)]
        scales = [gf.data(t, s + 2 * (r * g + g0), s + 2 * (r * g + g1)) for r in range(a, b)]
        piece = np.concatenate(codes + scales)
        return backend.convert(
            piece, b - a, cols * formats.PQ2_BLOCK_WEIGHTS, "planes", "raw", 0, 0
        )
    tr, rt = stored_tile_rows(info), info.rt
    s = -(-n // tr) * g * rt * 512
    row_bytes = cols * formats.PQ2_BLOCK_BYTES
    for tile in range(a // tr, (b - 1) // tr + 1):
        first = tile * tr
        real = min(tr, n - first)  # the tile's rows that are not padding
        c0, c1 = (tile * g + g0) * rt * 512, (tile * g + g1) * rt * 512
        piece = np.concatenate(
            [gf.data(t, c0, c1), gf.data(t, s + c0 // 16, s + c1 // 16)]
        )  # a scale word (2 bytes) for each 32 code bytes
        raw = backend.convert(piece, real, cols * formats.PQ2_BLOCK_WEIGHTS, "tiles", "raw", rt, 0)
        lo, hi = max(a, first) - first, min(b, first + real) - first
        rows.append(raw[lo * row_bytes : hi * row_bytes])
        del piece
    return np.concatenate(rows) if len(rows) > 1 else rows[0]


def check_block_scales(raw: np.ndarray, cols: int, tensor: str, r0: int, g0: int) -> None:
    """formats.check_scales of a block of rows r0.. and groups g0.. (cols a row): FormatError
    naming the tensor, the row and the block within the whole row."""
    d = raw.reshape(-1, formats.PQ2_BLOCK_BYTES)[:, :2].copy().view("<f2").reshape(-1)
    bad = ~np.isfinite(d)
    if not bad.any():
        return
    i = int(np.argmax(bad))
    bits = int(d[i : i + 1].view("<u2")[0])
    raise FormatError(
        f"tensor '{tensor}': row {r0 + i // cols}, block {g0 + i % cols} has scale {d[i]} "
        f"(bits 0x{bits:04x}); {int(bad.sum())} non-finite scales among the {d.size} blocks "
        f"checked"
    )
