"""The resident layouts of a PQ2_0 matrix: their names, ids and sizes, and a numpy reference.

This module is pyq2's one list of layout names, pq2_layout ids and tile heights (rt); everything
else imports them from here. FORMATS.md (repository root) specifies the layouts byte by byte:

    raw     N rows of G = K/128 blocks of 34 bytes (GGUF order).
    planes  codes[n][g*32 + b] = qs[b] of block (n, g)  (N x K/4 bytes), then
            scales[n][g] fp16 LE                          (N x G, at byte N*K/4).
    tiles   TR = 16*RT rows per tile, T = ceil(N/TR); rows N..T*TR-1 are padding (codes 0x55,
            scale +0.0). Code byte ((t*G + g)*RT + r)*512 + L*16 + j, lane L = 4*gid + tq,
            j = 8*hb + 4*h + c -> qs[tq*8 + 4*hb + c] of row t*TR + 16r + 8h + gid (block g;
            format version 2). Scales at byte T*G*RT*512, the fp16 of sub-tile
            row 8h + i at index ((t*G + g)*RT + r)*16 + 2*i + h (a lane's two rows side by side).

planes and tiles are a code region followed by a scale region (region_bytes). Every conversion
is one reshape + transpose (a fixed permutation of bytes); scales move as fp16 values without
arithmetic, so every byte survives. All conversions return flat uint8 arrays.
"""

from __future__ import annotations

import numpy as np

from .formats import (
    PQ2_BLOCK_BYTES,
    PQ2_BLOCK_WEIGHTS,
    PQ2_ZERO_QS_BYTE,
    as_bytes,
    check_shape,
    pq2_fields,
    pq2_from_fields,
)

# Layout names and their pq2_layout values (PQ2_LAYOUT_RAW, _PLANES, _TILES).
LAYOUTS = {"raw": 0, "planes": 1, "tiles": 2}
LAYOUT_NAMES = tuple(LAYOUTS)
_RAW, _PLANES, _TILES = LAYOUTS["raw"], LAYOUTS["planes"], LAYOUTS["tiles"]

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
    return rt if layout_id(layout) == _TILES else 0


def tile_rows(layout, rt: int = 0) -> int:
    """Rows per tile: TR for tiles, 1 for raw and planes.

    The layout bytes of a slice of rows that starts at a multiple of this are one contiguous
    piece of the matrix's code region and one of its scale region, which is what lets a matrix
    be converted slice by slice.
    """
    return check_rt(rt) if layout_id(layout) == _TILES else 1


def stored_rows(layout, n: int, rt: int = 0) -> int:
    """Rows an n-row matrix occupies in `layout`: n rounded up to whole tiles for tiles."""
    tr = tile_rows(layout, rt)
    return -(-n // tr) * tr


def region_bytes(layout, n: int, k: int, rt: int = 0) -> tuple[int, int]:
    """(code bytes, scale bytes) of an n x k matrix in planes or tiles, padding rows included.

    The scale region starts right after the code region, at byte `code bytes`.
    """
    g = check_shape(n, k)
    if layout_id(layout) == _RAW:
        raise ValueError("the raw layout keeps each scale with its codes: it has no regions")
    rows = stored_rows(layout, n, rt)
    return rows * g * _CODE_BYTES, rows * g * _SCALE_BYTES


def slice_ranges(layout, n: int, k: int, rt: int, r0: int, r1: int) -> tuple[range, range]:
    """Where rows [r0, r1) of an n x k planes or tiles matrix lie: the byte ranges of their
    codes and of their scales, with the trailing padding rows when r1 = n. r0 must be a
    multiple of the tile rows (tile_rows), r1 one too or n (FORMATS.md, "Slices")."""
    tr = tile_rows(layout, rt)
    g = check_shape(n, k)
    if not 0 <= r0 < r1 <= n or r0 % tr or (r1 % tr and r1 != n):
        raise ValueError(
            f"rows [{r0}, {r1}) of an {n}-row {layout_name(layout)} matrix do not start and end "
            f"on tiles of {tr} rows"
        )
    scale_start = region_bytes(layout, n, k, rt)[0]
    stop = -(-r1 // tr) * tr
    code_row, scale_row = g * _CODE_BYTES, g * _SCALE_BYTES
    return (
        range(r0 * code_row, stop * code_row),
        range(scale_start + r0 * scale_row, scale_start + stop * scale_row),
    )


def layout_bytes(layout, n: int, k: int, rt: int = 0) -> int:
    """Bytes an n x k PQ2_0 matrix takes in `layout` (rt for tiles)."""
    g = check_shape(n, k)
    return stored_rows(layout, n, rt) * g * PQ2_BLOCK_BYTES


def _check_size(buf, layout, n: int, k: int, rt: int = 0) -> np.ndarray:
    b = as_bytes(buf)
    want = layout_bytes(layout, n, k, rt)
    if b.size != want:
        with_rt = f", rt={rt}" if layout_id(layout) == _TILES else ""
        raise ValueError(
            f"{layout_name(layout)} PQ2_0 matrix N={n}, K={k}{with_rt} takes {want} bytes, "
            f"buffer has {b.size}"
        )
    return b


# ---- planes --------------------------------------------------------------------------------


def to_planes(raw, n: int, k: int) -> np.ndarray:
    qs, d = pq2_fields(raw, n, k)  # (n, G, 32), (n, G)
    return np.concatenate([qs.reshape(-1), d.reshape(-1).view(np.uint8)])


def from_planes(planes, n: int, k: int) -> np.ndarray:
    g = check_shape(n, k)
    b = _check_size(planes, "planes", n, k)
    split, _ = region_bytes("planes", n, k)
    qs = b[:split].reshape(n, g, 32)
    d = b[split:].view("<f2").reshape(n, g)
    return pq2_from_fields(qs, d)


# ---- tiles ---------------------------------------------------------------------------------
# Row index inside the padded matrix is t*TR + 16r + 8h + gid (h = 0 for rows gid, 1 for
# gid + 8), and code byte b of a block is tq*8 + 4*hb + c. The tile-major order is
# [t, g, r, gid, tq, hb, h, c] (lane L = 4*gid + tq, j = 8*hb + 4*h + c); the row-major order
# is [t, r, h, gid, g, tq, hb, c].
_TO_TILES = (0, 4, 1, 3, 5, 6, 2, 7)
_FROM_TILES = tuple(np.argsort(_TO_TILES))


def to_tiles(raw, n: int, k: int, rt: int) -> np.ndarray:
    tr = check_rt(rt)
    qs, d = pq2_fields(raw, n, k)
    g = qs.shape[1]
    t = -(-n // tr)  # tiles, the last one padded
    pad = t * tr - n
    qs = np.concatenate([qs, np.full((pad, g, 32), PQ2_ZERO_QS_BYTE, np.uint8)])
    d = np.concatenate([d, np.zeros((pad, g), "<f2")])
    codes = qs.reshape(t, rt, 2, 8, g, 4, 2, 4).transpose(_TO_TILES)
    # index ((t*G + g)*RT + r)*16 + 2*i + h for sub-tile row 8h + i: rows i and i+8 side by side
    scales = d.reshape(t, rt, 2, 8, g).transpose(0, 4, 1, 3, 2)
    return np.concatenate(
        [codes.reshape(-1), np.ascontiguousarray(scales).reshape(-1).view(np.uint8)]
    )


def from_tiles(tiles, n: int, k: int, rt: int) -> np.ndarray:
    """Raw bytes of a tile-major matrix; the padding rows are ignored."""
    tr = check_rt(rt)
    g = check_shape(n, k)
    b = _check_size(tiles, "tiles", n, k, rt)
    t = -(-n // tr)  # tiles, the last one padded
    split, _ = region_bytes("tiles", n, k, rt)
    qs = b[:split].reshape(t, g, rt, 8, 4, 2, 2, 4).transpose(_FROM_TILES).reshape(t * tr, g, 32)
    d = b[split:].view("<f2").reshape(t, g, rt, 8, 2).transpose(0, 2, 4, 3, 1).reshape(t * tr, g)
    return pq2_from_fields(qs[:n], d[:n])


# ---- any to any ----------------------------------------------------------------------------


def to_raw(buf, n: int, k: int, layout, rt: int = 0) -> np.ndarray:
    lid = layout_id(layout)
    if lid == _PLANES:
        return from_planes(buf, n, k)
    if lid == _TILES:
        return from_tiles(buf, n, k, rt)
    return _check_size(buf, "raw", n, k).copy()


def from_raw(raw, n: int, k: int, layout, rt: int = 0) -> np.ndarray:
    lid = layout_id(layout)
    _check_size(raw, "raw", n, k)
    if lid == _PLANES:
        return to_planes(raw, n, k)
    if lid == _TILES:
        return to_tiles(raw, n, k, rt)
    return as_bytes(raw).copy()


def convert(
    buf, n: int, k: int, src_layout, dst_layout, src_rt: int = 0, dst_rt: int = 0
) -> np.ndarray:
    """Any layout to any layout (through raw), flat uint8."""
    return from_raw(to_raw(buf, n, k, src_layout, src_rt), n, k, dst_layout, dst_rt)
