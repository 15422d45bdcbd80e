"""Reading the PQ2-family weights of a GGUF file as raw PQ2_0 rows: what repack and verify share.

A weight may be stored as PQ2_0, PTQ1_0 or TQ2_0 blocks, or in a layout an earlier repack wrote
(pyq2.metadata). `raw_slices` turns any of them into raw PQ2_0 blocks, a slice of rows at a time,
and drops the pages it has read, so memory stays near one slice whatever the size of the tensor.

The conversions run in libpq2 when it loads (pyq2.host) and in numpy otherwise (pyq2.layouts,
pyq2.formats): `Backend` makes that choice once; both produce the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from . import _native, formats, host, layouts
from .errors import RepackError
from .gguf_io import GGUFFile, Tensor
from .gguf_types import PTQ1_0, TQ2_0, type_nbytes
from .metadata import WeightInfo

PASS_CHUNK = 64 << 20  # bytes of a pass-through tensor copied (and released) at a time
CONVERT_CHUNK = 16 << 20  # raw PQ2_0 bytes of a weight converted at a time

BACKENDS = ("auto", "native", "numpy")


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

    def to_raw(self, src: np.ndarray, info: WeightInfo) -> np.ndarray:
        """PQ2_0 raw blocks of a weight (or of a slice of its rows) in any stored form."""
        if info.layout != "raw":
            return self.convert(src, info.n, info.k, info.layout, "raw", info.rt, 0)
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


def slice_rows(k: int, multiple: int = 1) -> int:
    """Rows of a K-wide weight to convert at a time: about CONVERT_CHUNK bytes of raw PQ2_0,
    a multiple of `multiple` (the tile height of the layout written), at least one multiple."""
    row_bytes = formats.pq2_matrix_bytes(1, k)
    return max(multiple, CONVERT_CHUNK // row_bytes // multiple * multiple)


def raw_slices(
    backend: Backend, gf: GGUFFile, t: Tensor, info: WeightInfo, rows: int
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first row, PQ2_0 raw bytes of up to `rows` rows) over the whole weight t.

    A raw-family source (PQ2_0, PTQ1_0, TQ2_0) is read and converted one slice at a time, and
    its pages are dropped after each. A planes/tiles source (a repacked file being repacked
    again) is turned into raw bytes whole, since its rows are not contiguous.
    """
    row_bytes = formats.pq2_matrix_bytes(1, info.k)
    if info.layout != "raw":
        raw = backend.to_raw(gf.data(t), info)
        gf.release(t)
        for r0 in range(0, info.n, rows):
            yield r0, raw[r0 * row_bytes : min(r0 + rows, info.n) * row_bytes]
        return
    src_row = type_nbytes(info.source_type, (info.k,))
    for r0 in range(0, info.n, rows):
        r1 = min(r0 + rows, info.n)
        src = gf.data(t, r0 * src_row, r1 * src_row)
        yield r0, backend.to_raw(src, info)
        del src
        gf.release(t, r0 * src_row, r1 * src_row)
