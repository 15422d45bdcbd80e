"""Reading the PQ2-family weights of a GGUF file as raw PQ2_0 rows: what repack and verify share.

A weight may be stored as PQ2_0, PTQ1_0 or TQ2_0 blocks, or in a layout an earlier repack wrote
(pyq2.gguf.metadata). `raw_slices` turns any of them into raw PQ2_0 blocks, a slice of rows at a
time, and drops the pages it has read, so memory stays near one slice whatever the size of the
tensor, whichever the stored layout.

The conversions run in libpq2 when it loads (pyq2.lib.cpu) and in numpy otherwise
(pyq2.spec.layouts, pyq2.spec.formats): `Backend` makes that choice once; both produce the same
bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import RepackError
from ..lib import cpu as host
from ..lib import native as _native
from ..spec import formats, layouts
from .io import GGUFFile, Tensor
from .metadata import WeightInfo
from .types import PTQ1_0, TQ2_0, type_nbytes

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
