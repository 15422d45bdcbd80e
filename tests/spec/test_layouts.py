"""numpy layouts (pyq2.spec.layouts) against the byte positions written in FORMATS.md."""

import numpy as np
import pytest

from pyq2.spec import layouts as L

from ..conftest import conversion_cases, conversion_id, random_raw, shape_id

SHAPES = [(1, 128), (3, 384), (17, 640), (33, 128), (65, 384), (300, 1024)]


# ---- references: byte positions of FORMATS.md, one byte at a time ----------------------------


def raw_qs(raw, k, row, g, b):
    """qs[b] of block (row, g) in a raw matrix: row stride K/128*34, d first (2 bytes)."""
    return raw[(row * (k // 128) + g) * 34 + 2 + b]


def raw_d(raw, k, row, g):
    o = (row * (k // 128) + g) * 34
    return raw[o : o + 2].tobytes()


def tile_code_offset(t, g, r, lane, j, G, rt):
    return ((t * G + g) * rt + r) * 512 + lane * 16 + j


# ---- sizes -------------------------------------------------------------------------------


def test_layout_bytes():
    assert L.layout_bytes("raw", 3, 384) == 3 * 3 * 34
    assert L.layout_bytes("planes", 3, 384) == 3 * 3 * 34
    assert L.layout_bytes("tiles", 3, 384, 1) == 16 * 3 * 34
    assert L.layout_bytes("tiles", 65, 128, 4) == 128 * 34
    assert L.layout_bytes(2, 64, 128, 4) == 64 * 34
    with pytest.raises(ValueError, match="rt=3"):
        L.layout_bytes("tiles", 16, 128, 3)
    with pytest.raises(ValueError, match="K=100"):
        L.layout_bytes("raw", 16, 100)
    with pytest.raises(ValueError, match="'bogus'"):
        L.layout_bytes("bogus", 16, 128)
    assert L.LAYOUTS == {"raw": 0, "planes": 1, "tiles": 2}


def test_layout_value():
    """A Layout is a valid matrix in one layout: names by name or pq2_layout value, an rt only
    for tiles, and its geometry as FORMATS.md 2 gives it."""
    assert L.Layout(2, 100, 384, 2) == L.Layout("TILES", 100, 384, 2)
    assert L.Layout("planes", 3, 128, 2).rt == 0 and L.Layout("planes", 3, 128).id == 1
    for args, message in (
        (("tiles", 3, 128), "rt=0"),
        (("tiles", 3, 128, 3), "rt=3"),
        (("raw", 0, 128), "N=0"),
        (("raw", 3, 100), "K=100"),
        (("bogus", 3, 128), "'bogus'"),
    ):
        with pytest.raises(ValueError, match=message):
            L.Layout(*args)
    m = L.Layout("tiles", 100, 384, 2)  # FORMATS.md 2's worked example: T = 4, TR = 32
    assert (m.groups, m.tile_rows, m.stored_rows, m.bytes) == (3, 32, 128, 13056)
    assert m.regions == (12288, 768) and L.Layout("planes", 100, 384).regions == (9600, 600)
    assert L.Layout("raw", 100, 384).bytes == 10200 and L.Layout("raw", 1, 128).tile_rows == 1
    with pytest.raises(ValueError, match="no regions"):
        _ = L.Layout("raw", 100, 384).regions
    assert m.rows(32, 100) == L.Layout("tiles", 68, 384, 2)


# ---- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", SHAPES, ids=[shape_id(s) for s in SHAPES])
def test_planes_round_trip(n, k):
    raw = random_raw(n, k)
    planes = L.to_planes(raw, n, k)
    assert planes.size == L.layout_bytes("planes", n, k)
    assert np.array_equal(L.from_planes(planes, n, k), raw)


@pytest.mark.parametrize("rt", L.TILE_RTS, ids=[f"rt{r}" for r in L.TILE_RTS])
@pytest.mark.parametrize("n,k", SHAPES, ids=[shape_id(s) for s in SHAPES])
def test_tiles_round_trip_and_padding(n, k, rt):
    raw = random_raw(n, k, seed=n + k + rt)
    tiles = L.to_tiles(raw, n, k, rt)
    assert tiles.size == L.layout_bytes("tiles", n, k, rt)
    assert np.array_equal(L.from_tiles(tiles, n, k, rt), raw)
    # The padding rows, read back as a raw matrix of T*TR rows: codes 0x55, scale +0.0.
    tr = 16 * rt
    t = -(-n // tr)
    padded = L.from_tiles(tiles, t * tr, k, rt).reshape(t * tr, k // 128, 34)
    assert np.array_equal(padded[:n].reshape(-1), raw)
    assert (padded[n:, :, 2:] == 0x55).all() and (padded[n:, :, :2] == 0).all()


CASES = conversion_cases([(17, 384), (65, 640)])


@pytest.mark.parametrize("shape,src,dst,src_rt,dst_rt", CASES, ids=map(conversion_id, CASES))
def test_convert_every_direction(shape, src, dst, src_rt, dst_rt):
    n, k = shape
    raw = random_raw(n, k, seed=5)
    src_buf = L.from_raw(raw, n, k, src, src_rt)
    out = L.convert(src_buf, n, k, src, dst, src_rt, dst_rt)
    assert np.array_equal(out, L.from_raw(raw, n, k, dst, dst_rt))
    assert np.array_equal(L.convert(out, n, k, dst, src, dst_rt, src_rt), src_buf)


def test_wrong_buffer_size():
    raw = random_raw(3, 128)
    with pytest.raises(ValueError, match="takes 544 bytes, buffer has 102"):
        L.from_tiles(raw, 3, 128, 1)
    with pytest.raises(ValueError, match="rt=3"):
        L.to_tiles(raw, 3, 128, 3)


# ---- byte positions checked by hand ------------------------------------------------------


def test_planes_byte_positions():
    n, k = 5, 384
    G = k // 128
    raw = random_raw(n, k, seed=7)
    planes = L.to_planes(raw, n, k)
    # codes[n][g*32 + b] = qs[b] of block (n, g); scales[n][g] at byte N*K/4 + 2*(n*G + g).
    row, g, b = 3, 2, 29
    assert planes[row * (k // 4) + g * 32 + b] == raw_qs(raw, k, row, g, b)
    o = n * k // 4 + 2 * (row * G + g)
    assert planes[o : o + 2].tobytes() == raw_d(raw, k, row, g)


def test_tiles_one_lane_by_hand():
    # N = 48, K = 256, RT = 2: TR = 32 rows per tile, T = 2 tiles (rows 48..63 padding), G = 2.
    # Tile 0, group 1, sub-tile 1 (rows 16..31), lane 22 = 4*gid + tq with gid 5, tq 2:
    #   code bytes ((0*2 + 1)*2 + 1)*512 + 22*16 = 1888 .. 1903;
    #   j 0-3   -> qs[2*8 + j]      of block (16 + 5,     1) = row 21
    #   j 4-7   -> qs[2*8 + j - 4]  of block (16 + 5 + 8, 1) = row 29
    #   j 8-11  -> qs[2*8 + j - 4]  of row 21
    #   j 12-15 -> qs[2*8 + j - 8]  of row 29
    n, k, rt = 48, 256, 2
    raw = random_raw(n, k, seed=8)
    tiles = L.to_tiles(raw, n, k, rt)
    assert tile_code_offset(0, 1, 1, 22, 0, 2, rt) == 1888
    want = (
        [raw_qs(raw, k, 21, 1, 16 + j) for j in range(4)]
        + [raw_qs(raw, k, 29, 1, 16 + j) for j in range(4)]
        + [raw_qs(raw, k, 21, 1, 20 + j) for j in range(4)]
        + [raw_qs(raw, k, 29, 1, 20 + j) for j in range(4)]
    )
    assert tiles[1888:1904].tolist() == want
    # Scales start at T*G*RT*512 = 4096; row 21 of tile 0 is row 8h + i = 5 (h 0, i 5) of
    # sub-tile 1, so its fp16 for group 1 has index ((0*2 + 1)*2 + 1)*16 + 2*5 + 0 = 58, bytes
    # 4096 + 116, 117; row 29 (h 1) is its neighbour, index 59.
    assert tiles[4212:4214].tobytes() == raw_d(raw, k, 21, 1)
    assert tiles[4214:4216].tobytes() == raw_d(raw, k, 29, 1)
    # Tile 1, group 0, sub-tile 1 (rows 48..63, all padding), any lane: code 0x55, scale 0.
    o = tile_code_offset(1, 0, 1, 0, 0, 2, rt)
    assert (tiles[o : o + 512] == 0x55).all()
    s = 4096 + 2 * ((1 * 2 + 0) * 2 + 1) * 16
    assert not tiles[s : s + 32].any()


def test_tiles_every_lane_formula():
    # The formula of FORMATS.md applied to every byte of a small matrix with a partial tile.
    n, k, rt = 21, 384, 1
    G, tr = k // 128, 16
    raw = random_raw(n, k, seed=9)
    tiles = L.to_tiles(raw, n, k, rt)
    t_count = 2
    for t in range(t_count):
        for g in range(G):
            for lane in range(32):
                gid, tq = divmod(lane, 4)
                for j in range(16):  # j = 8*hb + 4*h + c: qs[tq*8 + 4*hb + c] of row gid + 8h
                    hb, h, c = j // 8, (j // 4) % 2, j % 4
                    row = t * tr + gid + 8 * h
                    b = tq * 8 + 4 * hb + c
                    want = raw_qs(raw, k, row, g, b) if row < n else 0x55
                    assert tiles[tile_code_offset(t, g, 0, lane, j, G, rt)] == want


@pytest.mark.parametrize("layout,rt", [("planes", 0), ("tiles", 1), ("tiles", 2), ("tiles", 4)])
def test_row_ranges_hold_the_rows_own_layout_bytes(layout, rt):
    """Rows [r0, r1) of a matrix (r0 on a tile, r1 on a tile or the last row) are one piece of
    its code region and one of its scale region: the bytes of those rows as a matrix alone
    (FORMATS.md "Slices"), what a member of a fused tensor is."""
    n, k = 100, 384
    raw = random_raw(n, k, seed=5)
    m = L.Layout(layout, n, k, rt)
    whole = m.from_raw(raw)
    tr = m.tile_rows
    row = k // 128 * 34
    cuts = sorted({0, n, *range(tr, n, 3 * tr)})
    for r0, r1 in zip(cuts, cuts[1:], strict=False):
        codes, scales = m.row_ranges(r0, r1)
        alone = m.rows(r0, r1).from_raw(raw[r0 * row : r1 * row])
        assert np.array_equal(
            np.concatenate([whole[codes.start : codes.stop], whole[scales.start : scales.stop]]),
            alone,
        ), (r0, r1)
    if tr > 1:
        for r0, r1 in ((1, n), (0, tr + 1), (tr, tr)):
            with pytest.raises(ValueError, match="do not start and end on tiles"):
                m.row_ranges(r0, r1)


@pytest.mark.parametrize("layout,rt", [("planes", 0), ("tiles", 1), ("tiles", 2)])
def test_block_ranges_hold_the_blocks_own_layout_bytes(layout, rt):
    """Rows [a, b) and groups [g0, g1) of a matrix, read through block_ranges, are the raw
    blocks of those rows and groups: each block is its own matrix in the layout."""
    n, k = 70, 1024
    raw = random_raw(n, k, seed=6)
    m = L.Layout(layout, n, k, rt)
    whole = m.from_raw(raw)
    blocks = raw.reshape(n, m.groups, 34)
    for a, b, g0, g1 in ((0, 1, 0, 8), (3, 40, 2, 5), (33, 70, 7, 8), (64, 70, 0, 3)):
        got = []
        for blk in m.block_ranges(a, b, g0, g1):
            piece = np.concatenate([whole[r.start : r.stop] for r in blk.ranges])
            rows = blk.layout.to_raw(piece).reshape(blk.layout.n, g1 - g0, 34)
            lo, hi = max(a, blk.row0) - blk.row0, min(b, blk.row0 + blk.layout.n) - blk.row0
            got.append(rows[lo:hi])
        assert np.array_equal(np.concatenate(got), blocks[a:b, g0:g1]), (a, b, g0, g1)
    with pytest.raises(ValueError, match="block rows"):
        m.block_ranges(0, n + 1, 0, 1)
