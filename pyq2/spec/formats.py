"""Byte layouts of the block formats: the one Python module that knows them.

FORMATS.md 1 specifies them (1.1 PQ2_0, 1.2 PTQ1_0, 1.3 TQ2_0, 1.4 the conversions between them,
1.5 the reference quantiser); native/include/pq2.h cites it too. Everything here is vectorised
over blocks (shifts by broadcast); nothing loops per element.

Buffers are anything numpy can view as bytes (bytes, bytearray, memoryview, uint8 arrays of any
shape). Results are fresh uint8 arrays. Scales are copied as fp16 values without arithmetic, so
their bits (NaN payloads included) survive every conversion.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError

# GGML type ids (FORMATS.md). 142/143 are private ids of the PrismML fork.
PQ2_TYPE_ID = 142
PTQ1_TYPE_ID = 143
TQ2_TYPE_ID = 35

PQ2_BLOCK_WEIGHTS = 128
PQ2_BLOCK_BYTES = 34
PTQ1_BLOCK_WEIGHTS = 128
PTQ1_BLOCK_BYTES = 28
TQ2_BLOCK_WEIGHTS = 256
TQ2_BLOCK_BYTES = 66

# A qs byte of four code-1 weights (0b01010101): an all-zero block whatever its scale. The padding
# rows of the tiles layout use it (FORMATS.md 2).
PQ2_ZERO_QS_BYTE = 0x55

# The blocks of FORMATS.md 1 as packed structs: numpy lays the fields out back to back.
PQ2_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (32,))])
PTQ1_BLOCK = np.dtype([("qs", "u1", (24,)), ("qh", "u1", (2,)), ("d", "<f2")])
TQ2_BLOCK = np.dtype([("qs", "u1", (64,)), ("d", "<f2")])
assert PQ2_BLOCK.itemsize == PQ2_BLOCK_BYTES
assert PTQ1_BLOCK.itemsize == PTQ1_BLOCK_BYTES
assert TQ2_BLOCK.itemsize == TQ2_BLOCK_BYTES

_FORMATS = {"PQ2_0": PQ2_BLOCK, "PTQ1_0": PTQ1_BLOCK, "TQ2_0": TQ2_BLOCK}

# Bit shift of code s (s = j % 4) inside its qs byte, PQ2_0 and TQ2_0 alike.
_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)

# PTQ1_0's base-3 digits (FORMATS.md 1.2): the weights of packing (first digit most significant)
# and of unpacking digit n.
_POW3_DESC = np.array([81, 27, 9, 3, 1], dtype=np.int32)
_POW3_ASC = np.array([1, 3, 9, 27, 81], dtype=np.int32)


# ---- buffers -------------------------------------------------------------------------------


def as_bytes(buf) -> np.ndarray:
    """A flat uint8 view (or contiguous copy) of any bytes-like object or uint8 array."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8:
            raise ValueError(f"expected a uint8 array of raw bytes, got dtype {buf.dtype}")
        return np.ascontiguousarray(buf).reshape(-1)
    return np.frombuffer(buf, dtype=np.uint8)


def as_blocks(buf, fmt: str = "PQ2_0") -> np.ndarray:
    """The structured block array (nb,) of `buf` for fmt in PQ2_0, PTQ1_0, TQ2_0."""
    dt = _FORMATS[fmt]
    b = as_bytes(buf)
    if b.size % dt.itemsize:
        raise FormatError(
            f"{fmt}: {b.size} bytes is not a whole number of {dt.itemsize}-byte "
            f"blocks ({b.size % dt.itemsize} bytes left over)"
        )
    return b.view(dt)


def _as_codes(codes, width: int, what: str) -> np.ndarray:
    c = np.asarray(codes)
    if c.ndim != 2 or c.shape[1] != width:
        raise ValueError(f"{what}: codes must have shape (n_blocks, {width}), got {c.shape}")
    if c.size and (c.min() < 0 or c.max() > 3):
        raise ValueError(f"{what}: codes must be in 0..3, got {c.min()}..{c.max()}")
    return c.astype(np.uint8)


def _block_name(block: int, blocks_per_row: int | None) -> str:
    if not blocks_per_row:
        return f"block {block}"
    return f"row {block // blocks_per_row}, block {block % blocks_per_row} (flat block {block})"


# ---- PQ2_0 ---------------------------------------------------------------------------------


def pq2_unpack(blocks) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8[nb,128], d float16[nb]) of PQ2_0 blocks."""
    b = as_blocks(blocks, "PQ2_0")
    # (nb, 32, 1) >> (4,) -> (nb, 32, 4): axis 1 is j/4, axis 2 is j%4, so reshape gives j.
    codes = (b["qs"][:, :, None] >> _SHIFTS) & 3
    return codes.reshape(-1, PQ2_BLOCK_WEIGHTS), b["d"].astype(np.float16)


def pq2_pack(codes, d) -> np.ndarray:
    """uint8[nb,34] PQ2_0 blocks from codes (nb,128) in 0..3 and fp16 scales (nb,)."""
    c = _as_codes(codes, PQ2_BLOCK_WEIGHTS, "pq2_pack")
    out = np.zeros(c.shape[0], dtype=PQ2_BLOCK)
    out["d"] = np.asarray(d, dtype=np.float16).reshape(-1)
    out["qs"] = np.bitwise_or.reduce(c.reshape(-1, 32, 4) << _SHIFTS, axis=2)
    return out.view(np.uint8).reshape(-1, PQ2_BLOCK_BYTES)


def pq2_fields(raw, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(qs uint8[n,G,32], d float16[n,G]) of a raw PQ2_0 matrix, G = k/128 (copies)."""
    g = check_matrix(raw, n, k)
    b = as_blocks(raw, "PQ2_0").reshape(n, g)
    return b["qs"].copy(), b["d"].copy()


def pq2_from_fields(qs, d) -> np.ndarray:
    """Flat raw PQ2_0 bytes from qs uint8[..., 32] and d float16[...] (same leading shape)."""
    qs = np.asarray(qs, dtype=np.uint8)
    out = np.zeros(qs.shape[:-1], dtype=PQ2_BLOCK)
    out["qs"] = qs
    out["d"] = d
    return out.reshape(-1).view(np.uint8)


def pq2_matrix_bytes(n: int, k: int) -> int:
    if k % PQ2_BLOCK_WEIGHTS:
        raise ValueError(f"K={k} is not a multiple of {PQ2_BLOCK_WEIGHTS}")
    return n * (k // PQ2_BLOCK_WEIGHTS) * PQ2_BLOCK_BYTES


def check_shape(n: int, k: int) -> int:
    """G = k/128, the blocks per row of an n x k PQ2_0 matrix, after checking the shape."""
    if n < 1 or k < 1 or k % PQ2_BLOCK_WEIGHTS:
        raise ValueError(
            f"bad PQ2_0 matrix shape N={n}, K={k}: need N >= 1 and K a positive "
            f"multiple of {PQ2_BLOCK_WEIGHTS}"
        )
    return k // PQ2_BLOCK_WEIGHTS


def check_matrix(raw, n: int, k: int) -> int:
    """G = k/128 of a raw PQ2_0 matrix after checking its shape and its byte count."""
    g = check_shape(n, k)
    size = as_bytes(raw).size
    want = pq2_matrix_bytes(n, k)
    if size != want:
        raise FormatError(f"PQ2_0 matrix N={n}, K={k} takes {want} bytes, buffer has {size}")
    return g


# ---- PTQ1_0 --------------------------------------------------------------------------------


def _digits(b: np.ndarray, ndigits: int) -> np.ndarray:
    """Base-3 digits 0..ndigits-1 of packed bytes b (...,) -> (..., ndigits), each in 0..2."""
    v = (b.astype(np.int32)[..., None] * _POW3_ASC[:ndigits]) & 0xFF
    return ((v * 3) >> 8).astype(np.uint8)


def _pack_digits(x: np.ndarray) -> np.ndarray:
    """Bytes from base-3 digits x (..., 5 or 4) in 0..2: ceil(q * 256 / 243)."""
    q = x.astype(np.int32) @ _POW3_DESC[: x.shape[-1]]
    return ((q * 256 + 242) // 243).astype(np.uint8)


def ptq1_unpack(blocks28) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8[nb,128] in {0,1,2}, d float16[nb]) of PTQ1_0 blocks (code = digit)."""
    b = as_blocks(blocks28, "PTQ1_0")
    nb = b.shape[0]
    # The element order of FORMATS.md 1.2, a row of its table each: the digits (nb, m, n) of the
    # bytes m transposed to (nb, n, m).
    e0 = _digits(b["qs"][:, :16], 5).transpose(0, 2, 1).reshape(nb, 80)
    e1 = _digits(b["qs"][:, 16:], 5).transpose(0, 2, 1).reshape(nb, 40)
    e2 = _digits(b["qh"], 4).transpose(0, 2, 1).reshape(nb, 8)
    return np.concatenate([e0, e1, e2], axis=1), b["d"].astype(np.float16)


def _first_code3(codes: np.ndarray) -> tuple[int, int] | None:
    bad = codes == 3
    if not bad.any():
        return None
    block = int(np.argmax(bad.any(axis=1)))
    return block, int(np.argmax(bad[block]))


def ptq1_pack(codes, d, blocks_per_row: int | None = None) -> np.ndarray:
    """uint8[nb,28] PTQ1_0 blocks from codes (nb,128) in {0,1,2} and fp16 scales (nb,).

    A code 3 has no PTQ1_0 encoding: FormatError naming the row (block // blocks_per_row; pass
    blocks_per_row = K/128, or None for a flat list of blocks) and the block.
    """
    c = _as_codes(codes, PTQ1_BLOCK_WEIGHTS, "ptq1_pack")
    hit = _first_code3(c)
    if hit is not None:
        block, j = hit
        raise FormatError(
            f"PQ2_0 {_block_name(block, blocks_per_row)} holds code 3 (+2) at "
            f"weight {j}: PTQ1_0 has no encoding for it "
            f"({int((c == 3).any(axis=1).sum())} such blocks in all)"
        )
    nb = c.shape[0]
    out = np.zeros(nb, dtype=PTQ1_BLOCK)
    # Inverses of the orders in ptq1_unpack.
    out["qs"][:, :16] = _pack_digits(c[:, :80].reshape(nb, 5, 16).transpose(0, 2, 1))
    out["qs"][:, 16:] = _pack_digits(c[:, 80:120].reshape(nb, 5, 8).transpose(0, 2, 1))
    out["qh"] = _pack_digits(c[:, 120:].reshape(nb, 4, 2).transpose(0, 2, 1))
    out["d"] = np.asarray(d, dtype=np.float16).reshape(-1)
    return out.view(np.uint8).reshape(-1, PTQ1_BLOCK_BYTES)


# ---- TQ2_0 ---------------------------------------------------------------------------------


def tq2_unpack(blocks66) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8[nb,256], d float16[nb]) of TQ2_0 blocks."""
    b = as_blocks(blocks66, "TQ2_0")
    # qs as (nb, half h, 1, byte i), the codes as (nb, h, shift s, i): FORMATS.md 1.3's order
    qs = b["qs"].reshape(-1, 2, 1, 32)
    codes = (qs >> _SHIFTS[:, None]) & 3
    return codes.reshape(-1, TQ2_BLOCK_WEIGHTS), b["d"].astype(np.float16)


def tq2_pack(codes, d) -> np.ndarray:
    """uint8[nb,66] TQ2_0 blocks from codes (nb,256) in 0..3 and fp16 scales (nb,)."""
    c = _as_codes(codes, TQ2_BLOCK_WEIGHTS, "tq2_pack")
    out = np.zeros(c.shape[0], dtype=TQ2_BLOCK)
    planes = c.reshape(-1, 2, 4, 32) << _SHIFTS[:, None]  # (nb, h, s, i)
    out["qs"] = np.bitwise_or.reduce(planes, axis=2).reshape(-1, 64)
    out["d"] = np.asarray(d, dtype=np.float16).reshape(-1)
    return out.view(np.uint8).reshape(-1, TQ2_BLOCK_BYTES)


# ---- conversions on raw byte buffers (flat uint8 results) ----------------------------------


def ptq1_to_pq2(buf) -> np.ndarray:
    """PTQ1_0 blocks -> PQ2_0 blocks, lossless, same scales."""
    codes, d = ptq1_unpack(buf)
    return pq2_pack(codes, d).reshape(-1)


def tq2_to_pq2(buf) -> np.ndarray:
    """TQ2_0 blocks -> PQ2_0 blocks, lossless: each half block becomes one PQ2_0 block."""
    codes, d = tq2_unpack(buf)
    return pq2_pack(codes.reshape(-1, PQ2_BLOCK_WEIGHTS), np.repeat(d, 2)).reshape(-1)


def pq2_to_ptq1(buf, blocks_per_row: int | None = None) -> np.ndarray:
    """PQ2_0 blocks -> PTQ1_0 blocks; FormatError naming row and block on a code 3."""
    codes, d = pq2_unpack(buf)
    return ptq1_pack(codes, d, blocks_per_row).reshape(-1)


# ---- arithmetic ----------------------------------------------------------------------------


def pq2_dequantize(raw, n: int, k: int) -> np.ndarray:
    """float32[n,k] = (code - 1) * d. Exact: a small integer times an fp16 value fits in fp32."""
    check_matrix(raw, n, k)
    codes, d = pq2_unpack(raw)
    w = (codes.astype(np.float32) - 1) * d.astype(np.float32)[:, None]
    return w.reshape(n, k)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    # C roundf semantics. v - trunc(v) is exact, so the tie test is exact too.
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= 0.5, np.sign(v), 0.0)


def pq2_quantize(w) -> np.ndarray:
    """Flat raw PQ2_0 bytes of w[n,k] by the reference quantiser (FORMATS.md 1.5).

    It divides by the stored fp16 d, not the unrounded max, so pq2_dequantize(pq2_quantize(w))
    reproduces every weight at +-d, 0 exactly when w was ternary times an fp16 scale; rounding
    is half away from zero as C's roundf. ValueError for a non-finite weight or a block whose
    max|w| rounds to an fp16 infinity.
    """
    w = np.asarray(w)
    if w.ndim != 2 or w.shape[1] % PQ2_BLOCK_WEIGHTS or w.shape[0] < 1:
        raise ValueError(
            f"pq2_quantize: need w[n, k] with k a multiple of "
            f"{PQ2_BLOCK_WEIGHTS}, got shape {w.shape}"
        )
    blocks = w.astype(np.float64).reshape(-1, PQ2_BLOCK_WEIGHTS)
    if not np.isfinite(blocks).all():
        i = int(np.argmax(~np.isfinite(blocks).all(axis=1)))
        raise ValueError(f"pq2_quantize: block {i} holds a non-finite weight")
    with np.errstate(over="ignore"):
        d16 = np.abs(blocks).max(axis=1).astype(np.float16)
    if np.isinf(d16).any():
        i = int(np.argmax(np.isinf(d16)))
        raise ValueError(
            f"pq2_quantize: block {i} has max|w| = {np.abs(blocks[i]).max():g}, beyond fp16 (65504)"
        )
    d = d16.astype(np.float64)[:, None]
    q = _round_half_away(blocks / np.where(d == 0, 1.0, d))
    codes = np.where(d == 0, 1, np.clip(q + 1, 0, 3)).astype(np.uint8)
    return pq2_pack(codes, d16).reshape(-1)
