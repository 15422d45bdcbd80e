"""numpy block formats (pyq2.spec.formats) against FORMATS.md, with known answers built by hand."""

import numpy as np
import pytest

from pyq2.errors import FormatError
from pyq2.spec import formats as F

# ---- references written straight from the spec, one weight at a time --------------------


def pq2_code(block: bytes, j: int) -> int:
    """Weight j of a 34-byte PQ2_0 block: 2-bit code at shift 2*(j%4) of qs[j/4] (qs at +2)."""
    return (block[2 + j // 4] >> (2 * (j % 4))) & 3


def tq2_code(block: bytes, n: int) -> int:
    """Element n of a 66-byte TQ2_0 block: byte 32*(n/128) + n%32, shift 2*((n%128)/32)."""
    return (block[32 * (n // 128) + n % 32] >> (2 * ((n % 128) // 32))) & 3


def ptq1_byte(digits) -> int:
    """Packed byte of base-3 digits (first most significant, padded to five): ceil(q*256/243)."""
    q = 0
    for x in list(digits) + [0] * (5 - len(digits)):
        q = 3 * q + x
    return -(-q * 256 // 243)


def f16_bytes(v: float) -> bytes:
    return np.float16(v).tobytes()


def random_fp16_finite(rng, size):
    bits = rng.integers(0, 1 << 16, size, dtype=np.uint16)
    d = bits.view(np.float16)
    return np.where(np.isfinite(d), d, np.float16(0.5))


# ---- PQ2_0 --------------------------------------------------------------------------------


def test_block_sizes_and_type_ids():
    assert (F.PQ2_BLOCK.itemsize, F.PTQ1_BLOCK.itemsize, F.TQ2_BLOCK.itemsize) == (34, 28, 66)
    assert (F.PQ2_TYPE_ID, F.PTQ1_TYPE_ID, F.TQ2_TYPE_ID) == (142, 143, 35)


@pytest.mark.parametrize("nb", [1, 7, 300])
def test_pq2_round_trip_random_bytes(nb):
    # Random scale bits include NaN and Inf payloads: they must survive unpack + pack.
    raw = np.random.default_rng(nb).integers(0, 256, (nb, 34), dtype=np.uint8)
    codes, d = F.pq2_unpack(raw)
    assert codes.shape == (nb, 128) and d.shape == (nb,) and d.dtype == np.float16
    assert np.array_equal(F.pq2_pack(codes, d), raw)


def test_pq2_unpack_matches_per_weight_reading():
    raw = np.random.default_rng(1).integers(0, 256, (5, 34), dtype=np.uint8)
    codes, _ = F.pq2_unpack(raw)
    want = [[pq2_code(bytes(b), j) for j in range(128)] for b in raw]
    assert codes.tolist() == want


def test_pq2_known_block():
    # d = 1.5; qs[0] = 0b11_10_01_00 -> weights 0..3 have codes 0,1,2,3 -> -1.5, 0, 1.5, 3.
    # qs[31] = 0b00_01_10_11 -> weights 124..127 codes 3,2,1,0. Everything else code 1.
    qs = [0x55] * 32
    qs[0], qs[31] = 0b11100100, 0b00011011
    block = f16_bytes(1.5) + bytes(qs)
    w = F.pq2_dequantize(block, 1, 128)[0]
    assert w[:4].tolist() == [-1.5, 0.0, 1.5, 3.0]
    assert w[124:].tolist() == [3.0, 1.5, 0.0, -1.5]
    assert not w[4:124].any()


def test_pq2_zero_blocks():
    codes, d = F.pq2_unpack(np.zeros((3, 34), np.uint8))
    assert not codes.any() and not d.any()
    assert not F.pq2_dequantize(np.zeros(3 * 34, np.uint8), 1, 384).any()


def test_pq2_code3_block():
    block = f16_bytes(-0.25) + b"\xff" * 32
    codes, d = F.pq2_unpack(block)
    assert (codes == 3).all() and d[0] == np.float16(-0.25)
    assert (F.pq2_dequantize(block, 1, 128) == np.float32(-0.5)).all()


def test_pq2_dequantize_row_major():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 4, (3 * 5, 128), dtype=np.uint8)
    d = random_fp16_finite(rng, 15)
    w = F.pq2_dequantize(F.pq2_pack(codes, d), 3, 640)
    want = ((codes.astype(np.float64) - 1) * d.astype(np.float64)[:, None]).reshape(3, 640)
    assert w.dtype == np.float32 and np.array_equal(w, want)


def test_pq2_bad_sizes():
    with pytest.raises(FormatError, match="35"):
        F.pq2_unpack(np.zeros(35, np.uint8))
    with pytest.raises(ValueError, match="100"):
        F.pq2_dequantize(np.zeros(34, np.uint8), 1, 100)
    with pytest.raises(FormatError, match="68"):
        F.pq2_dequantize(np.zeros(68, np.uint8), 1, 128)
    with pytest.raises(ValueError, match="0..3"):
        F.pq2_pack(np.full((1, 128), 4), [1.0])


# ---- PTQ1_0 -------------------------------------------------------------------------------


def test_ptq1_digit_packing_is_a_bijection():
    # All 243 five-digit groups get distinct bytes that decode back to their digits.
    digits = np.array(np.unravel_index(np.arange(243), (3,) * 5)).T.astype(np.uint8)
    packed = F._pack_digits(digits)
    assert len(set(packed.tolist())) == 243
    assert packed.tolist() == [ptq1_byte(x) for x in digits.tolist()]
    assert np.array_equal(F._digits(packed, 5), digits)


def test_ptq1_known_block():
    # All digits 1 (zero weights) except element 37 = 16*2 + 5 (digit 2 of qs[5]) = code 2,
    # element 119 = 80 + 8*4 + 7 (digit 4 of qs[23]) = code 0, element 127 = 120 + 2*3 + 1
    # (digit 3 of qh[1]) = code 2.
    ones5 = ptq1_byte([1, 1, 1, 1, 1])
    assert ones5 == 128  # ceil(121 * 256 / 243)
    qs = [ones5] * 24
    qs[5] = ptq1_byte([1, 1, 2, 1, 1])  # q = 130 -> 137
    qs[23] = ptq1_byte([1, 1, 1, 1, 0])  # q = 120 -> 127
    qh = [ptq1_byte([1, 1, 1, 1]), ptq1_byte([1, 1, 1, 2])]  # q = 120, 123 -> 127, 130
    assert (qs[5], qs[23], qh) == (137, 127, [127, 130])
    block = bytes(qs) + bytes(qh) + f16_bytes(0.75)
    codes, d = F.ptq1_unpack(block)
    want = np.ones(128, np.uint8)
    want[37], want[119], want[127] = 2, 0, 2
    assert codes[0].tolist() == want.tolist() and d[0] == np.float16(0.75)
    assert np.array_equal(F.ptq1_pack(codes, d).reshape(-1), np.frombuffer(block, np.uint8))


@pytest.mark.parametrize("nb", [1, 9, 257])
def test_ptq1_round_trip_ternary(nb):
    rng = np.random.default_rng(nb)
    codes = rng.integers(0, 3, (nb, 128), dtype=np.uint8)
    d = rng.integers(0, 1 << 16, nb, dtype=np.uint16).view(np.float16)  # any bits, NaN too
    ptq1 = F.ptq1_pack(codes, d)
    c2, d2 = F.ptq1_unpack(ptq1)
    assert np.array_equal(c2, codes) and np.array_equal(d2.view(np.uint16), d.view(np.uint16))
    # Through PQ2_0 and back, byte for byte.
    pq2 = F.pq2_pack(codes, d).reshape(-1)
    assert np.array_equal(F.ptq1_to_pq2(ptq1), pq2)
    assert np.array_equal(F.pq2_to_ptq1(pq2), ptq1.reshape(-1))


def test_ptq1_random_bytes_decode_to_ternary():
    raw = np.random.default_rng(3).integers(0, 256, (50, 28), dtype=np.uint8)
    codes, d = F.ptq1_unpack(raw)
    assert codes.max() <= 2
    # Bytes outside the canonical set still decode; re-encoding them keeps the weights.
    again = F.ptq1_pack(codes, d)
    assert np.array_equal(F.ptq1_unpack(again)[0], codes)


def test_code3_into_ptq1_names_row_and_block():
    codes = np.ones((12, 128), np.uint8)
    codes[7, 99] = 3
    codes[10, 0] = 3
    pq2 = F.pq2_pack(codes, np.ones(12, np.float16))
    with pytest.raises(FormatError, match=r"row 2, block 1 \(flat block 7\).*weight 99.*2 such"):
        F.pq2_to_ptq1(pq2, blocks_per_row=3)
    with pytest.raises(FormatError, match=r"block 7 holds code 3"):
        F.ptq1_pack(codes, np.ones(12, np.float16))


# ---- TQ2_0 --------------------------------------------------------------------------------


def test_tq2_known_block():
    # All codes 1 except element 200 (half 1, 200%128 = 72 = 32*2 + 8: byte 40, shift 4) = 3
    # and element 5 (byte 5, shift 0) = 0.
    qs = [0x55] * 64
    qs[40] = 0x75  # 0b01_11_01_01
    qs[5] = 0x54  # 0b01_01_01_00
    block = bytes(qs) + f16_bytes(2.0)
    codes, d = F.tq2_unpack(block)
    want = np.ones(256, np.uint8)
    want[200], want[5] = 3, 0
    assert codes[0].tolist() == want.tolist() and d[0] == np.float16(2.0)
    assert np.array_equal(F.tq2_pack(codes, d).reshape(-1), np.frombuffer(block, np.uint8))
    # Into PQ2_0: block 1 weight 72 -> qs[18] shift 0 (byte 2 + 18 of the block); block 0
    # weight 5 -> qs[1] shift 2.
    pq2 = F.tq2_to_pq2(block).reshape(2, 34)
    assert pq2[:, :2].tobytes() == f16_bytes(2.0) * 2
    assert pq2[1, 2 + 18] == 0x57 and pq2[0, 2 + 1] == 0x51
    assert F.pq2_dequantize(pq2, 1, 256)[0, 128 + 72] == 4.0


@pytest.mark.parametrize("nb", [1, 33])
def test_tq2_random_bytes(nb):
    raw = np.random.default_rng(nb).integers(0, 256, (nb, 66), dtype=np.uint8)
    codes, d = F.tq2_unpack(raw)
    want = [[tq2_code(bytes(b), n) for n in range(256)] for b in raw]
    assert codes.tolist() == want
    assert np.array_equal(F.tq2_pack(codes, d), raw)
    pq2 = F.tq2_to_pq2(raw).reshape(2 * nb, 34)
    c2, d2 = F.pq2_unpack(pq2)
    assert np.array_equal(c2.reshape(nb, 256), codes)
    assert np.array_equal(d2.view(np.uint16), np.repeat(d.view(np.uint16), 2))


# ---- reference quantizer ------------------------------------------------------------------


def test_quantize_ternary_weights_exactly():
    rng = np.random.default_rng(4)
    t = rng.integers(-1, 2, (6, 384)).astype(np.float64)
    t[:, ::128] = 1  # every block reaches max |w| = 1
    scale = random_fp16_finite(rng, (6, 3)).astype(np.float64)
    w = t * np.repeat(np.abs(scale), 128, axis=1)
    raw = F.pq2_quantize(w)
    assert np.array_equal(F.pq2_dequantize(raw, 6, 384), w.astype(np.float32))


def test_quantize_zero_block_and_rounding():
    w = np.zeros((1, 256))
    # Block 1: d = 4, weights at exactly +-half d: round half away from zero -> +-1.
    w[0, 128:132] = [4.0, 2.0, -2.0, 1.9]
    codes, d = F.pq2_unpack(F.pq2_quantize(w))
    assert d.tolist() == [0.0, 4.0]
    assert (codes[0] == 1).all()
    assert codes[1, :4].tolist() == [2, 2, 0, 1]


def test_quantize_uses_stored_fp16_scale():
    # max|w| = 1 + 2^-11 rounds to the fp16 d = 1.0 (tie to even); w / d is taken against that
    # stored 1.0: 1.00049 -> code 2, 0.5 (a tie, away from zero) -> code 2.
    w = np.zeros((1, 128))
    w[0, 0], w[0, 1] = 1.00048828125, 0.5
    codes, d = F.pq2_unpack(F.pq2_quantize(w))
    assert d[0] == np.float16(1.0) and codes[0, :2].tolist() == [2, 2]


def test_quantize_rejects_fp16_overflow_and_nan():
    with pytest.raises(ValueError, match="block 1 .*65520"):
        F.pq2_quantize(np.r_[np.zeros(128), [65520.0] * 128].reshape(1, 256))
    with pytest.raises(ValueError, match="non-finite"):
        F.pq2_quantize(np.full((1, 128), np.nan))
