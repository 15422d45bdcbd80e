"""The m == 1 GPU core's arithmetic on the CPU: binary AND-POPC MMAs of the tiles layout's lane
words against the bit-sliced activations (reference.bitslice_q8) give the exact integer
dot(code - 1, q) of every row and group. This checks the byte layout (the tiles layout of
FORMATS.md, format version 2), the bit-sliced word order (codes.cuh) and the combine formula the
kernel uses, with the m16n8k256 .b1 fragment layout of the PTX ISA, without a GPU. Also the
quantiser's bit-slice lane program (quantize.cu), modelled lane by lane, against the same word
order."""

import numpy as np
import pytest

from pyq2.spec import formats as F
from pyq2.spec import layouts as L
from pyq2.spec import reference as R

POPC8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


def popc32(v):
    v = np.asarray(v, dtype=np.uint32)
    return sum(POPC8[(v >> (8 * i)) & 0xFF] for i in range(4))


def random_case(n, k, seed, extreme=False):
    rng = np.random.default_rng(seed)
    g = k // 128
    qs = rng.integers(0, 256, size=(n, g, 32), dtype=np.uint8)
    d = rng.uniform(-1, 1, size=(n, g)).astype("<f2")
    raw = F.pq2_from_fields(qs, d)
    if extreme:  # every q at the int8 ends, and a zero group
        q = rng.choice(np.array([-127, 127, -1, 0, 1], dtype=np.int8), size=(1, k))
        q[0, :128] = 0
    else:
        q = rng.integers(-127, 128, size=(1, k), dtype=np.int8)
    return raw, q


def bmma_dots(tiles, bits, n, k):
    """int64[n, G]: per 16-row sub-tile and group, the two AND-POPC MMAs of unit_mma (B1 then B2)
    with A = the lane's 16 code bytes as four little-endian words, B column b = bit plane b, and
    lane tq's combine d0 + f2*d1 scaled by 4^tq, plus -sum(q) in bit plane 0: what the GPU sums."""
    g = k // 128
    sub = (
        tiles[: (n // 16) * g * 512].reshape(n // 16, g, 32, 16).view("<u4")
    )  # rt 1: [tile, g, lane, word]
    out = np.zeros((n, g), dtype=np.int64)
    for t in range(n // 16):
        for gg in range(g):
            lane = sub[t, gg].reshape(8, 4, 4)  # [gid, tq, word]
            A = np.zeros(
                (16, 8), dtype=np.uint32
            )  # [row, k word]: a0 row gid k tq*32.., a1 row gid+8, a2/a3 k 128+
            A[:8, :4], A[8:, :4], A[:8, 4:], A[8:, 4:] = (
                lane[:, :, 0],
                lane[:, :, 1],
                lane[:, :, 2],
                lane[:, :, 3],
            )
            words = bits[0, gg].reshape(8, 4, 4)  # [bit plane b, tq, w]
            B1 = np.concatenate([words[:, :, 0], words[:, :, 1]], axis=1)  # [column b, k word]
            B2 = np.concatenate([words[:, :, 2], words[:, :, 3]], axis=1)
            C = (popc32(A[:, None, :] & B1[None]) + popc32(A[:, None, :] & B2[None])).sum(
                axis=2
            )  # [row, b]
            f = np.array([1, 2, 4, 8, 16, 32, 64, -128], dtype=np.int64)
            out[t * 16 : (t + 1) * 16, gg] = C @ f
    return out


@pytest.mark.parametrize(
    "n,k,seed,extreme", [(16, 128, 0, False), (32, 384, 1, False), (48, 256, 2, True)]
)
def test_bit_slices_give_the_exact_group_dots(n, k, seed, extreme):
    raw, q = random_case(n, k, seed, extreme)
    x = q.astype(np.float32)  # integers in [-127, 127] with max 127 quantise to themselves
    x[0, :] = np.where(np.arange(k) % 128 == 5, 127, x[0])  # every group's scale exactly 1
    q8, scales, sums = R.quantize_q8(x)
    assert np.all(scales == 1)
    bits = R.bitslice_q8(q8)
    tiles = L.to_tiles(raw, n, k, 1)
    got = bmma_dots(tiles, bits, n, k) - sums[0].astype(np.int64)[None, :]
    codes, _ = F.pq2_unpack(raw)
    qe = x[0].astype(np.int64).reshape(k // 128, 128)  # element order
    want = np.einsum("ngj,gj->ng", codes.reshape(n, k // 128, 128).astype(np.int64) - 1, qe)
    assert np.array_equal(got, want)


def test_bitslice_words_by_hand():
    # One group, q of element e = e - 64 (so bit b of element 32tq + 16w + 4c + s is known).
    q = (np.arange(128) - 64).astype(np.int8)
    q8 = np.ascontiguousarray(q.reshape(32, 4).T.reshape(1, 128))  # plane order: s*32 + b <- 4b + s
    words = R.bitslice_q8(q8)[0, 0]
    for b, tq, w, c, s in [(0, 0, 0, 0, 1), (7, 3, 1, 3, 3), (3, 2, 0, 1, 2), (6, 1, 1, 2, 0)]:
        e = 32 * tq + 16 * w + 4 * c + s
        bit = (int(np.uint8(q[e])) >> b) & 1
        word = int(words[(b * 4 + tq) * 4 + w])
        assert (word >> (8 * c + 2 * s)) & 3 == 3 * bit
        assert (int(words[(b * 4 + tq) * 4 + 2 + w]) >> (8 * c + 2 * s)) & 3 == 2 * bit


# ---- the quantiser's lane program (quantize.cu bitslice_group), modelled over a warp ----------


def _byte_perm(a, b, sel):
    """__byte_perm(a, b, sel) per lane: byte i of the result is byte (sel >> 4i) & 7 of {b:a}."""
    both = np.stack(
        [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    )
    lanes = np.arange(a.size)
    out = np.zeros_like(a)
    for i in range(4):
        out |= both[(sel >> (4 * i)) & 7, lanes] << np.uint32(8 * i)
    return out


def bitslice_group_model(q):
    """uint32[128]: the words quantize.cu's bitslice_group stores for one group, from q[32][4] (lane
    L holds elements 4L..4L+3), following the device code step by step: the in-lane 8x8 bit
    transpose (three masked swaps), the octet's 8x8 byte transpose (shuffles xor 4, 2, 1 with two
    byte permutes each), times 3, and the store of lane 8 tq + b at words 16 b + 4 tq."""
    u = np.asarray(q, dtype=np.int64).astype(np.uint32) & np.uint32(0xFF)
    lo, hi = u[:, 0] | u[:, 1] << np.uint32(16), u[:, 2] | u[:, 3] << np.uint32(16)
    for sh, mask in ((7, 0x00AA00AA), (14, 0x0000CCCC)):
        for v in (lo, hi):
            t = (v ^ (v >> np.uint32(sh))) & np.uint32(mask)
            v ^= t ^ (t << np.uint32(sh))
    t = (lo ^ (hi << np.uint32(4))) & np.uint32(0xF0F0F0F0)
    lo, hi = lo ^ t, hi ^ (t >> np.uint32(4))
    lane = np.arange(32)
    j = lane & 7
    x4, x2, x1 = (j & 4) > 0, (j & 2) > 0, (j & 1) > 0
    r = np.where(x4, lo, hi)[lane ^ 4]
    a4, b4 = np.where(x4, r, lo), np.where(x4, hi, r)
    r = _byte_perm(a4, b4, np.where(x2, 0x5410, 0x7632))[lane ^ 2]
    a2, b2 = (
        _byte_perm(a4, r, np.where(x2, 0x3254, 0x5410)),
        _byte_perm(b4, r, np.where(x2, 0x3276, 0x7610)),
    )
    r = _byte_perm(a2, b2, np.where(x1, 0x6420, 0x7531))[lane ^ 1]
    w0, w1 = (
        _byte_perm(a2, r, np.where(x1, 0x3514, 0x5240)),
        _byte_perm(b2, r, np.where(x1, 0x3716, 0x7260)),
    )
    b1_0, b1_1 = w0 * np.uint32(3), w1 * np.uint32(3)
    words = np.zeros(128, dtype=np.uint32)
    at = 4 * (4 * j + (lane >> 3))
    for i, v in enumerate((b1_0, b1_1, b1_0 & np.uint32(0xAAAAAAAA), b1_1 & np.uint32(0xAAAAAAAA))):
        words[at + i] = v
    return words


@pytest.mark.parametrize("seed", range(4))
def test_quantiser_bitslice_program_matches_the_layout(seed):
    """The quantiser's bit-slice lane program (a model of its device code) writes exactly
    reference.bitslice_q8's words: random q, the int8 ends, zeros."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, size=(32, 4))
    if seed == 1:
        q = rng.choice(np.array([-127, 127, 64, 0, 1, -1]), size=(32, 4))
    if seed == 2:
        q[:] = 0
    q8 = np.asarray(q, dtype=np.int8).T.reshape(
        1, 128
    )  # plane order: position s*32 + L holds element 4L+s
    assert np.array_equal(bitslice_group_model(q), R.bitslice_q8(q8)[0, 0])
