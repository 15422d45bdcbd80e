"""The resident layouts of a PQ2_0 matrix: their names and ids, the `Layout` value, and a numpy
reference of the conversions.

FORMATS.md 2 specifies the layouts byte by byte (the raw blocks, the planes, the tiles and their
padding rows, "Slices", "Format version"); this module is pyq2's one list of layout names,
pq2_layout ids and tile heights (rt), and `Layout` its one home for a matrix's geometry (the
twin of the library's pq2_view): rows stored, tile rows, bytes, the code and scale regions,
where a slice of rows or a block of rows and groups lies. Everything else asks a Layout instead
of computing offsets.

Every conversion is one reshape + transpose (a fixed permutation of bytes) and scales move as
fp16 values without arithmetic, so every byte survives (FORMATS.md 1.4). All conversions return
flat uint8 arrays; `convert` and `layout_bytes` are the numpy twins of pq2_convert_layout and
pq2_layout_bytes, with the C signature's loose arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from .formats import (
    PQ2_BLOCK_BYTES,
    PQ2_BLOCK_WEIGHTS,
    PQ2_ZERO_QS_BYTE,
    as_bytes,
    pq2_fields,
    pq2_from_fields,
)

# Layout names and their pq2_layout values (PQ2_LAYOUT_RAW, _PLANES, _TILES).
LAYOUTS = {"raw": 0, "planes": 1, "tiles": 2}
LAYOUT_NAMES = tuple(LAYOUTS)

TILE_RTS = (1, 2, 4)  # the sub-tiles per tile (rt) the tiles layout supports
TILE_ROWS_PER_RT = 16  # rows of one m16n8k32 A fragment
SUBTILE_BYTES = 512  # 32 lanes x 16 bytes = 16 rows x 32 code bytes
_CODE_BYTES = PQ2_BLOCK_WEIGHTS // 4  # of one block: its 2-bit codes
_SCALE_BYTES = PQ2_BLOCK_BYTES - _CODE_BYTES  # of one block: its fp16 scale


def layout_id(layout) -> int:
    """The pq2_layout value of a layout name ("raw", "planes", "tiles") or value (0, 1, 2)."""
    if isinstance(layout, str):
        if layout.lower() in LAYOUTS:
            return LAYOUTS[layout.lower()]
    elif isinstance(layout, (int, np.integer)) and int(layout) in LAYOUTS.values():
        return int(layout)
    raise ValueError(
        f"unknown layout {layout!r}: expected one of {sorted(LAYOUTS)} or "
        f"{sorted(LAYOUTS.values())}"
    )


def layout_name(layout) -> str:
    lid = layout_id(layout)
    return next(name for name, v in LAYOUTS.items() if v == lid)


def check_rt(rt: int) -> int:
    """TR = 16 * rt, the rows per tile, of a valid rt of the tiles layout; ValueError otherwise."""
    if rt not in TILE_RTS:
        raise ValueError(f"the tiles layout needs rt in {TILE_RTS}, got rt={rt}")
    return TILE_ROWS_PER_RT * rt


def layout_rt(layout, rt: int) -> int:
    """The rt a matrix in `layout` carries: rt for tiles, 0 for raw and planes (not checked)."""
    return rt if layout_id(layout) == LAYOUTS["tiles"] else 0


class Block(NamedTuple):
    """A block of a planes or tiles matrix as a matrix of its own (Layout.block_ranges): its
    layout, the byte ranges of the whole matrix that hold it, in order, and the matrix row its
    first row is."""

    layout: Layout
    ranges: tuple[range, ...]
    row0: int


@dataclass(frozen=True, slots=True)
class Layout:
    """An n x k PQ2_0 matrix in one resident layout (FORMATS.md 2) without its bytes: the
    Python twin of the library's pq2_view (native/src/common/view.h: groups, rows stored, tile
    rows, where the scale region starts, bytes). `name` is taken by name or pq2_layout value;
    `rt` is the tiles layout's tile height (1, 2, 4) and 0 for raw and planes (any rt given with
    them is dropped). ValueError for what pq2_view_init refuses: an unknown layout, a bad rt, a
    shape that is no PQ2_0 matrix (N >= 1, K a positive multiple of 128); so a Layout always
    describes a real matrix."""

    name: str
    n: int
    k: int
    rt: int = 0

    def __post_init__(self) -> None:
        name = layout_name(self.name)
        object.__setattr__(self, "name", name)
        if name == "tiles":
            check_rt(self.rt)
        else:
            object.__setattr__(self, "rt", 0)
        if self.n < 1 or self.k < 1 or self.k % PQ2_BLOCK_WEIGHTS:
            raise ValueError(
                f"bad PQ2_0 matrix shape N={self.n}, K={self.k}: need N >= 1 and K a positive "
                f"multiple of {PQ2_BLOCK_WEIGHTS}"
            )

    @property
    def id(self) -> int:
        """The pq2_layout value."""
        return LAYOUTS[self.name]

    @property
    def groups(self) -> int:
        """G = K/128, the blocks (128-groups) of a row."""
        return self.k // PQ2_BLOCK_WEIGHTS

    @property
    def tile_rows(self) -> int:
        """Rows per tile: TR = 16 * rt for tiles, 1 for raw and planes. A slice of rows that
        starts at a multiple of this is one piece of the code region and one of the scale region
        (row_ranges), which is what lets a matrix be converted, read or fused slice by slice."""
        return TILE_ROWS_PER_RT * self.rt if self.name == "tiles" else 1

    @property
    def stored_rows(self) -> int:
        """Rows the matrix occupies: n rounded up to whole tiles (the tiles padding rows)."""
        tr = self.tile_rows
        return -(-self.n // tr) * tr

    @property
    def bytes(self) -> int:
        """Bytes the matrix takes (pq2_layout_bytes)."""
        return self.stored_rows * self.groups * PQ2_BLOCK_BYTES

    @property
    def regions(self) -> tuple[int, int]:
        """(code bytes, scale bytes) of a planes or tiles matrix, padding rows included; the
        scale region starts at byte `code bytes`. ValueError for raw, which keeps each scale with
        its codes."""
        if self.name == "raw":
            raise ValueError("the raw layout keeps each scale with its codes: it has no regions")
        rows = self.stored_rows * self.groups
        return rows * _CODE_BYTES, rows * _SCALE_BYTES

    def rows(self, r0: int, r1: int) -> Layout:
        """Rows [r0, r1) as a matrix of their own, in this layout."""
        return replace(self, n=r1 - r0)

    def row_ranges(self, r0: int, r1: int) -> tuple[range, range]:
        """Where rows [r0, r1) of a planes or tiles matrix lie: the byte ranges of their codes and
        of their scales, with the trailing padding rows when r1 = n; they hold exactly the bytes
        of self.rows(r0, r1). r0 must be a multiple of tile_rows, r1 one too or n (FORMATS.md 2,
        "Slices"); ValueError otherwise."""
        tr = self.tile_rows
        if not 0 <= r0 < r1 <= self.n or r0 % tr or (r1 % tr and r1 != self.n):
            raise ValueError(
                f"rows [{r0}, {r1}) of an {self.n}-row {self.name} matrix do not start and end "
                f"on tiles of {tr} rows"
            )
        scale_start = self.regions[0]
        stop = -(-r1 // tr) * tr
        code_row, scale_row = self.groups * _CODE_BYTES, self.groups * _SCALE_BYTES
        return (
            range(r0 * code_row, stop * code_row),
            range(scale_start + r0 * scale_row, scale_start + stop * scale_row),
        )

    def block_ranges(self, a: int, b: int, g0: int, g1: int) -> list[Block]:
        """Rows [a, b) and 128-groups [g0, g1) of a planes or tiles matrix as the blocks that
        hold them, each the layout of a matrix of its own (FORMATS.md 2): for planes one block of
        exactly those rows (a code range and a scale range per row), for tiles one per tile the
        rows lie in, of that tile's rows that are not padding (its G' = g1 - g0 groups are one
        code range and one scale range). How a row too wide for a slice is read a block at a
        time."""
        g, cols, tr = self.groups, g1 - g0, self.tile_rows
        if self.name == "raw" or not (0 <= a < b <= self.n and 0 <= g0 < g1 <= g):
            raise ValueError(
                f"block rows [{a}, {b}), groups [{g0}, {g1}) of a {self.n} x {g} {self.name} matrix"
            )
        s = self.regions[0]
        width = cols * PQ2_BLOCK_WEIGHTS
        if self.name == "planes":
            code_row = self.k // 4
            codes = [range(r * code_row + 32 * g0, r * code_row + 32 * g1) for r in range(a, b)]
            scales = [range(s + 2 * (r * g + g0), s + 2 * (r * g + g1)) for r in range(a, b)]
            return [Block(Layout("planes", b - a, width), (*codes, *scales), a)]
        out = []
        for tile in range(a // tr, (b - 1) // tr + 1):
            first = tile * tr
            c0, c1 = (
                (tile * g + g0) * self.rt * SUBTILE_BYTES,
                (tile * g + g1) * self.rt * SUBTILE_BYTES,
            )
            # a scale word (2 bytes) for each 32 code bytes
            ranges = (range(c0, c1), range(s + c0 // 16, s + c1 // 16))
            out.append(
                Block(Layout("tiles", min(tr, self.n - first), width, self.rt), ranges, first)
            )
        return out

    def from_raw(self, raw) -> np.ndarray:
        """This matrix's bytes from its raw PQ2_0 blocks (numpy)."""
        return from_raw(raw, self.n, self.k, self.name, self.rt)

    def to_raw(self, buf) -> np.ndarray:
        """The raw PQ2_0 blocks of this matrix's bytes (numpy; tiles padding rows dropped)."""
        return to_raw(buf, self.n, self.k, self.name, self.rt)


def layout_bytes(layout, n: int, k: int, rt: int = 0) -> int:
    """Bytes an n x k PQ2_0 matrix takes in `layout` (rt for tiles): Layout(...).bytes."""
    return Layout(layout, n, k, rt).bytes


def _check_size(buf, m: Layout) -> np.ndarray:
    b = as_bytes(buf)
    if b.size != m.bytes:
        with_rt = f", rt={m.rt}" if m.name == "tiles" else ""
        raise ValueError(
            f"{m.name} PQ2_0 matrix N={m.n}, K={m.k}{with_rt} takes {m.bytes} bytes, "
            f"buffer has {b.size}"
        )
    return b


# ---- planes --------------------------------------------------------------------------------


def to_planes(raw, n: int, k: int) -> np.ndarray:
    qs, d = pq2_fields(raw, n, k)  # (n, G, 32), (n, G)
    return np.concatenate([qs.reshape(-1), d.reshape(-1).view(np.uint8)])


def from_planes(planes, n: int, k: int) -> np.ndarray:
    m = Layout("planes", n, k)
    b = _check_size(planes, m)
    split, _ = m.regions
    qs = b[:split].reshape(n, m.groups, 32)
    d = b[split:].view("<f2").reshape(n, m.groups)
    return pq2_from_fields(qs, d)


# ---- tiles ---------------------------------------------------------------------------------
# Axes as FORMATS.md 2 ("tiles") names them. The row-major order of the padded matrix's code
# bytes is [t, r, h, gid, g, tq, hb, c]; the tile-major order is [t, g, r, gid, tq, hb, h, c].
_TO_TILES = (0, 4, 1, 3, 5, 6, 2, 7)
_FROM_TILES = tuple(np.argsort(_TO_TILES))


def to_tiles(raw, n: int, k: int, rt: int) -> np.ndarray:
    m = Layout("tiles", n, k, rt)
    qs, d = pq2_fields(raw, n, k)
    g, t = m.groups, m.stored_rows // m.tile_rows  # tiles, the last one padded
    pad = m.stored_rows - n
    qs = np.concatenate([qs, np.full((pad, g, 32), PQ2_ZERO_QS_BYTE, np.uint8)])
    d = np.concatenate([d, np.zeros((pad, g), "<f2")])
    codes = qs.reshape(t, rt, 2, 8, g, 4, 2, 4).transpose(_TO_TILES)
    # a lane's two rows (gid, gid + 8) side by side: [t, g, r, gid, h]
    scales = d.reshape(t, rt, 2, 8, g).transpose(0, 4, 1, 3, 2)
    return np.concatenate(
        [codes.reshape(-1), np.ascontiguousarray(scales).reshape(-1).view(np.uint8)]
    )


def from_tiles(tiles, n: int, k: int, rt: int) -> np.ndarray:
    """Raw bytes of a tile-major matrix; the padding rows are ignored."""
    m = Layout("tiles", n, k, rt)
    b = _check_size(tiles, m)
    g, tr, rows = m.groups, m.tile_rows, m.stored_rows
    t = rows // tr  # tiles, the last one padded
    split, _ = m.regions
    qs = b[:split].reshape(t, g, rt, 8, 4, 2, 2, 4).transpose(_FROM_TILES).reshape(rows, g, 32)
    d = b[split:].view("<f2").reshape(t, g, rt, 8, 2).transpose(0, 2, 4, 3, 1).reshape(rows, g)
    return pq2_from_fields(qs[:n], d[:n])


# ---- any to any ----------------------------------------------------------------------------


def to_raw(buf, n: int, k: int, layout, rt: int = 0) -> np.ndarray:
    m = Layout(layout, n, k, rt)
    if m.name == "planes":
        return from_planes(buf, n, k)
    if m.name == "tiles":
        return from_tiles(buf, n, k, m.rt)
    return _check_size(buf, m).copy()


def from_raw(raw, n: int, k: int, layout, rt: int = 0) -> np.ndarray:
    m = Layout(layout, n, k, rt)
    _check_size(raw, Layout("raw", n, k))
    if m.name == "planes":
        return to_planes(raw, n, k)
    if m.name == "tiles":
        return to_tiles(raw, n, k, m.rt)
    return as_bytes(raw).copy()


def convert(
    buf, n: int, k: int, src_layout, dst_layout, src_rt: int = 0, dst_rt: int = 0
) -> np.ndarray:
    """Any layout to any layout (through raw), flat uint8."""
    return from_raw(to_raw(buf, n, k, src_layout, src_rt), n, k, dst_layout, dst_rt)
