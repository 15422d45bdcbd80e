"""A file's tensors as the original tensors, and the one streaming conversion of a weight.

An `Entry` is one original tensor as a file holds it: a tensor of its own, or rows of a fused
one (pyq2.gguf.contents lists a file's entries; pyq2.offline.shard's ShardEntry is a rank's part
of one). A weight may be stored as PQ2_0, PTQ1_0 or TQ2_0 blocks, or in a layout an earlier
repack wrote (pyq2.gguf.metadata); an Entry reads it as raw PQ2_0 rows whatever its stored form,
a slice of rows at a time (`raw_slices`), so memory stays near one slice whatever the size of the
tensor. Where a slice of whole rows would be too wide (column_mode: a row of millions of
weights) it reads a block of a few rows and a range of 128-groups instead (`read_block`).

`convert` is the one conversion of a weight into a target Layout, which pyq2.offline.repack
(writing the pieces to a file) and pyq2.runtime.load (copying them to the GPU) both consume:
rows read a slice or a block at a time, every scale checked, each piece converted as a matrix of
its own, split into the target's code and scale regions and placed.

The conversions run in libpq2 when it loads (pyq2.lib.cpu) and in numpy otherwise
(pyq2.spec.layouts, pyq2.spec.formats): `Backend` makes that choice once; both produce the same
bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError, RepackError
from ..lib import cpu as host
from ..lib import native as _native
from ..spec import formats, layouts
from ..spec.formats import PQ2_BLOCK_BYTES, PQ2_BLOCK_WEIGHTS
from ..spec.layouts import Layout
from .io import GGUFFile, OutTensor, Tensor
from .metadata import WeightInfo
from .splits import Split
from .types import PQ2_0, PTQ1_0, TQ2_0, type_nbytes

PASS_CHUNK = 16 << 20  # bytes of a pass-through tensor copied or compared (then released) at a time
CONVERT_CHUNK = 16 << 20  # raw PQ2_0 bytes of a weight converted at a time

BACKENDS = ("auto", "native", "numpy")

Progress = Callable[[int, int, str], None]  # (bytes done, bytes total, tensor name)

# (weights, bytes) of a block of the types a weight is stored raw in (FORMATS.md 1)
RAW_BLOCKS = {
    PQ2_0: (PQ2_BLOCK_WEIGHTS, PQ2_BLOCK_BYTES),
    PTQ1_0: (formats.PTQ1_BLOCK_WEIGHTS, formats.PTQ1_BLOCK_BYTES),
    TQ2_0: (formats.TQ2_BLOCK_WEIGHTS, formats.TQ2_BLOCK_BYTES),
}


class Backend:
    """The conversions between stored weights and raw PQ2_0 blocks, from libpq2 or numpy.

    "auto" takes libpq2 when it loads and numpy otherwise; "native" insists on libpq2 (and raises
    LibraryError without it); "numpy" never loads it.
    """

    name: str
    ptq1_to_pq2: Callable[..., np.ndarray]
    tq2_to_pq2: Callable[..., np.ndarray]
    _convert: Callable[..., np.ndarray]  # pq2_convert_layout's arguments: buf, n, k, src, dst, rts

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
            self._convert = host.convert_layout
            self.ptq1_to_pq2, self.tq2_to_pq2 = host.ptq1_to_pq2, host.tq2_to_pq2
        else:
            self.name = "numpy"
            self._convert = layouts.convert
            self.ptq1_to_pq2, self.tq2_to_pq2 = formats.ptq1_to_pq2, formats.tq2_to_pq2

    def convert(self, buf: np.ndarray, src: Layout, dst: Layout) -> np.ndarray:
        """The bytes of the matrix `buf` (in src) in dst, a layout of the same shape."""
        if (src.n, src.k) != (dst.n, dst.k):
            raise ValueError(f"{src} and {dst} are matrices of different shapes")
        return self._convert(buf, src.n, src.k, src.name, dst.name, src.rt, dst.rt)

    def to_raw(self, buf: np.ndarray, stored: Layout, source_type: int) -> np.ndarray:
        """PQ2_0 raw blocks of a matrix stored as `stored` (in the raw layout: blocks of
        source_type, PQ2_0, PTQ1_0 or TQ2_0)."""
        if stored.name != "raw":
            return self.convert(buf, stored, Layout("raw", stored.n, stored.k))
        if source_type == PTQ1_0:
            return self.ptq1_to_pq2(buf)
        if source_type == TQ2_0:
            return self.tq2_to_pq2(buf)
        return buf


def stored_bytes(info: WeightInfo) -> int:
    """Bytes the weight described by info takes in its file."""
    if info.layout.name != "raw":
        return info.layout.bytes
    return type_nbytes(info.source_type, info.ne)


def slice_rows(k: int, *multiples: int) -> int:
    """Rows of a K-wide weight to convert at a time: about CONVERT_CHUNK bytes of raw PQ2_0, a
    multiple of every one of `multiples` (the tile heights of the layouts read and written)."""
    m = math.lcm(1, *multiples)
    row_bytes = k // PQ2_BLOCK_WEIGHTS * PQ2_BLOCK_BYTES
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
    TQ2_0) stores its rows one after another; a planes/tiles source stores a slice that starts at
    a multiple of its tile height as one piece of each region (Layout.row_ranges), so `first` and
    `rows` must be multiples of info.layout.tile_rows, and first + count one too or the weight's
    last row (the rows of a member of a fused matrix, pyq2.offline.fuse, are).
    """
    m = info.layout
    count = m.n - first if count is None else count
    if m.name == "raw":
        block, size = RAW_BLOCKS[info.source_type]
        src_row = m.k // block * size
        for r0 in range(0, count, rows):
            r1 = min(r0 + rows, count)
            start, stop = (first + r0) * src_row, (first + r1) * src_row
            src = gf.data(t, start, stop)
            yield r0, backend.to_raw(src, m.rows(r0, r1), info.source_type)
            del src
            gf.release(t, start, stop)
        return
    tr = m.tile_rows
    if rows % tr or first % tr:
        raise ValueError(
            f"slices of {rows} rows from row {first} do not start on {m.name} tiles of {tr} rows"
        )
    for r0 in range(0, count, rows):
        a, b = first + r0, first + min(r0 + rows, count)
        codes, scales = m.row_ranges(a, b)
        piece = np.concatenate(
            [gf.data(t, codes.start, codes.stop), gf.data(t, scales.start, scales.stop)]
        )
        gf.release(t, codes.start, codes.stop)
        gf.release(t, scales.start, scales.stop)
        yield r0, backend.to_raw(piece, m.rows(a, b), info.source_type)
        del piece


# ---- wide rows: blocks of rows x columns ---------------------------------------------------
#
# A slice of whole rows is as wide as the matrix: a row of 100 million weights is 27 MB of raw
# PQ2_0, and a slice must hold a whole tile of rows (up to 64). Where that exceeds
# CONVERT_CHUNK (column_mode), readers take blocks of a few rows and a range of 128-groups
# instead, so memory stays near CONVERT_CHUNK however wide a row is. In every stored layout the
# bytes of such a block lie in a few contiguous ranges (Layout.block_ranges; per row for raw).


def column_mode(k: int, *multiples: int) -> bool:
    """Whether a slice of slice_rows(k, *multiples) rows is too wide for CONVERT_CHUNK: then
    a weight is read in blocks of rows and columns (read_block)."""
    rows = math.lcm(1, *multiples)
    return rows * (k // PQ2_BLOCK_WEIGHTS * PQ2_BLOCK_BYTES) > CONVERT_CHUNK


def block_groups(k: int, band: int, budget: int | None = None) -> int:
    """128-groups of a block of `band` rows (the tallest read or written at once) that fit the
    budget, by default a quarter of CONVERT_CHUNK (a block is read, converted and copied a few
    times over); an even number, as a TQ2_0 block holds two."""
    budget = CONVERT_CHUNK // 4 if budget is None else budget
    groups = budget // (max(band, 1) * PQ2_BLOCK_BYTES)
    return min(k // PQ2_BLOCK_WEIGHTS, max(2, groups // 2 * 2))


def read_block(
    backend: Backend, gf: GGUFFile, t: Tensor, info: WeightInfo, a: int, b: int, g0: int, g1: int
) -> np.ndarray:
    """PQ2_0 raw bytes of rows [a, b) and 128-groups [g0, g1) of the weight t (stored as `info`
    says), row by row: (b - a) x (g1 - g0) blocks. A tiles source is read a tile at a time (the
    tiles that rows [a, b) lie in), a TQ2_0 one by its 256-weight blocks."""
    m = info.layout
    cols = g1 - g0
    if not (0 <= a < b <= m.n and 0 <= g0 < g1 <= m.groups):
        raise ValueError(
            f"block rows [{a}, {b}), groups [{g0}, {g1}) of a {m.n} x {m.groups} weight"
        )
    rows = []
    if m.name == "raw":
        block, size = RAW_BLOCKS[info.source_type]
        per = block // PQ2_BLOCK_WEIGHTS  # groups per source block (2 for TQ2_0)
        stride = m.k // block * size
        a0, a1 = g0 // per, -(-g1 // per)  # the source blocks that hold the groups
        cut = g0 - a0 * per  # groups of the first source block before g0
        for r in range(a, b):
            src = gf.data(t, r * stride + a0 * size, r * stride + a1 * size)
            row = backend.to_raw(src, Layout("raw", 1, (a1 - a0) * block), info.source_type)
            if per > 1:
                row = row.reshape(-1, PQ2_BLOCK_BYTES)[cut : cut + cols].reshape(-1)
            rows.append(row)
        return np.concatenate(rows) if len(rows) > 1 else rows[0]
    row_bytes = cols * PQ2_BLOCK_BYTES
    for blk in m.block_ranges(a, b, g0, g1):
        piece = np.concatenate([gf.data(t, r.start, r.stop) for r in blk.ranges])
        raw = backend.to_raw(piece, blk.layout, info.source_type)
        lo, hi = max(a, blk.row0) - blk.row0, min(b, blk.row0 + blk.layout.n) - blk.row0
        rows.append(raw[lo * row_bytes : hi * row_bytes])
        del piece
    return np.concatenate(rows) if len(rows) > 1 else rows[0]


def check_scales(raw: np.ndarray, cols: int, tensor: str, r0: int, g0: int = 0) -> None:
    """FormatError naming the tensor, the row and the block within the whole row of the first
    non-finite scale of raw PQ2_0 rows r0.. of a weight (cols blocks a row, from group g0): the
    scale check of every reader (FORMATS.md 1.4)."""
    d = raw.reshape(-1, PQ2_BLOCK_BYTES)[:, :2].copy().view("<f2").reshape(-1)
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


# ---- the original tensors ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of the original file as this file holds it: a tensor of its own, or rows
    [row0, row0 + info.n) of the fused tensor `fused`."""

    name: str
    tensor: Tensor  # the stored tensor (the fused tensor, for a member)
    info: WeightInfo | None  # the weight itself (a member: shape [K, its rows]); None: no weight
    stored: WeightInfo | None  # the stored tensor's (the fused matrix's, for a member)
    row0: int = 0
    fused: str | None = None
    split: Split | None = None  # in a tensor-parallel shard: the part of the tensor it holds

    def _weight(self) -> tuple[WeightInfo, WeightInfo]:
        if self.info is None or self.stored is None:
            raise ValueError(f"tensor '{self.name}' is not a PQ2-family weight")
        return self.info, self.stored

    def slices(self, backend: Backend, gf: GGUFFile, rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """(row, PQ2_0 raw bytes) of the weight's rows, `rows` at a time (rows counted from the
        weight's first; `rows` a multiple of the stored tile height)."""
        info, stored = self._weight()
        return raw_slices(backend, gf, self.tensor, stored, rows, self.row0, info.layout.n)

    def block(self, backend: Backend, gf: GGUFFile, a: int, b: int, g0: int, g1: int) -> np.ndarray:
        """PQ2_0 raw bytes of rows [a, b) (counted from the weight's first) and 128-groups
        [g0, g1) of the weight (read_block): how a reader takes a row too wide for a slice
        (column_mode)."""
        _, stored = self._weight()
        return read_block(backend, gf, self.tensor, stored, self.row0 + a, self.row0 + b, g0, g1)

    @property
    def ne(self) -> tuple[int, ...]:
        """The logical shape (gguf order): a weight's, else the stored tensor's."""
        return self.info.ne if self.info is not None else self.tensor.ne

    @property
    def input_width(self) -> int | None:
        """The width of the activation a weight reads as the model defines it (its K; for a
        shard's part of a row-parallel weight, the whole weight's): the width whose rotation
        signs it uses. None for a tensor that is not a weight."""
        if self.info is None:
            return None
        return self.split.extent if self.split is not None and self.split.axis == 0 else self.info.k

    def out_tensor(self) -> OutTensor:
        """How a repack writes a tensor that is not a weight: as it is."""
        t = self.tensor
        return OutTensor(t.name, t.type_id, t.ne, t.nbytes)

    def chunks(self, gf: GGUFFile) -> Iterator[np.ndarray]:
        """The bytes of a tensor that is not a weight, PASS_CHUNK at a time (each chunk's pages
        dropped once the next is asked for)."""
        t = self.tensor
        for start in range(0, t.nbytes, PASS_CHUNK):
            stop = min(start + PASS_CHUNK, t.nbytes)
            yield gf.data(t, start, stop)
            gf.release(t, start, stop)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored tensor the entry stands for (a member: its share of the fused
        tensor, so that the shares of a tensor add up to its size)."""
        size = self.tensor.nbytes
        if self.fused is None or self.stored is None or self.info is None:
            return size
        n = self.stored.n
        return size * (self.row0 + self.info.n) // n - size * self.row0 // n

    @property
    def place(self) -> str:
        """Where a member's rows are, for messages ("" for a tensor of its own)."""
        if self.fused is None or self.info is None:
            return ""
        return f"rows {self.row0}..{self.row0 + self.info.n - 1} of fused tensor '{self.fused}'"


# ---- the conversion of a weight ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Piece:
    """A converted piece of one weight and where it goes, as byte offsets into the weight's
    bytes in the target layout: its codes at code_at, its scales (None in the raw layout, whose
    blocks are `codes`) at scale_at."""

    codes: np.ndarray
    code_at: int
    scales: np.ndarray | None = None
    scale_at: int = 0


def convert(
    backend: Backend, gf: GGUFFile, parts: Sequence[Entry], target: Layout
) -> Iterator[Piece]:
    """The bytes of one weight in `target` (its whole matrix): the rows of `parts` one after
    another (one weight, or the members of a fused tensor), checking every scale on the way.

    Each part is read in slices of whole rows (Entry.slices), or where a slice of whole rows
    would be wider than CONVERT_CHUNK in blocks of one target tile of rows (one row for planes
    and raw) and a range of 128-groups (Entry.block). Each slice or block is converted alone, as
    a matrix of its own, and its code and scale regions are the next pieces of the target's:
    a slice that starts on a tile (FORMATS.md 2, "Slices"), and a block because the target stores
    tile by tile, group by group (raw and planes row by row). Every part but the last is whole
    tiles of the target (pyq2.offline.fuse), so that holds across parts too; the code pieces come
    in the order of the code region and the scale pieces in that of the scale region.
    """
    code_at = 0
    scale_at = 0 if target.name == "raw" else target.regions[0]
    for part in parts:
        for raw, piece in _raw_pieces(backend, gf, part, target):
            if target.name == "raw":
                yield Piece(raw, code_at)
                code_at += raw.size
                continue
            out = backend.convert(raw, Layout("raw", piece.n, piece.k), piece)
            split = piece.regions[0]
            yield Piece(out[:split], code_at, out[split:], scale_at)
            code_at, scale_at = code_at + split, scale_at + out.size - split
            del out, raw


def _raw_pieces(
    backend: Backend, gf: GGUFFile, part: Entry, target: Layout
) -> Iterator[tuple[np.ndarray, Layout]]:
    """(PQ2_0 raw bytes, their layout in the target) of a part's slices or blocks (convert),
    every scale checked."""
    info, stored = part._weight()
    m = info.layout
    tall = (target.tile_rows, stored.layout.tile_rows)
    if not column_mode(m.k, *tall):
        row_bytes = m.groups * PQ2_BLOCK_BYTES
        for r0, raw in part.slices(backend, gf, slice_rows(m.k, *tall)):
            check_scales(raw, m.groups, part.name, r0)
            yield raw, Layout(target.name, raw.size // row_bytes, m.k, target.rt)
        return
    band, cols = target.tile_rows, block_groups(m.k, max(tall))
    for r0 in range(0, m.n, band):
        r1 = min(r0 + band, m.n)
        for g0 in range(0, m.groups, cols):
            g1 = min(g0 + cols, m.groups)
            raw = part.block(backend, gf, r0, r1, g0, g1)
            check_scales(raw, g1 - g0, part.name, r0, g0)
            yield raw, Layout(target.name, r1 - r0, (g1 - g0) * PQ2_BLOCK_WEIGHTS, target.rt)
