"""numpy references of the arithmetic: group-128 Q8 activations and the PQ2_0 matmul.

quantize_q8 is bit-exact by construction (FORMATS.md 3.1); matmul_q8 is the exact answer to the
same Q8 problem (integer dots, scales applied in float64); matmul_float is the unquantised product
the Q8 path approximates.
"""

from __future__ import annotations

import numpy as np

from .formats import PQ2_BLOCK_WEIGHTS, check_matrix, pq2_dequantize, pq2_unpack

GROUP = PQ2_BLOCK_WEIGHTS
Q8_MAX = 127
# The fp32 value of 1.0f/127 (the C expression), computed as a correctly rounded fp32 division
# rather than by rounding the double 1/127, so no double rounding can creep in.
INV_127_F32 = np.float32(1.0) / np.float32(Q8_MAX)


def plane_order(k: int) -> np.ndarray:
    """Index array p with q8[..., pos] = q[..., p[pos]]: the plane order (FORMATS.md 3.1), in
    which plane s holds the activations that meet code s (shift 2s) of each weight byte."""
    if k % GROUP:
        raise ValueError(f"K={k} is not a multiple of {GROUP}")
    i = np.arange(GROUP).reshape(32, 4).T.reshape(-1)  # pos (s, b) -> element 4b + s
    return (np.arange(0, k, GROUP)[:, None] + i).reshape(-1)


def _as_x(x, name: str = "x") -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] % GROUP or x.shape[0] < 1:
        raise ValueError(f"{name} must be (m, k) with k a multiple of {GROUP}, got {x.shape}")
    if x.dtype != np.float32:
        raise ValueError(f"{name} must be float32, got {x.dtype}")
    return x


def _q8_groups(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8[m, G, 128] in element order, scales float32[m, G]); all arithmetic in fp32."""
    m, k = x.shape
    xg = x.reshape(m, k // GROUP, GROUP)
    a = np.abs(xg)
    amax = np.where(np.isnan(a), np.float32(0), a).max(axis=2)  # NaN ignored (an all-NaN group: 0)
    scale = amax * INV_127_F32  # fp32 reciprocal multiply
    div = np.where(scale == 0, np.float32(1), scale)  # a zero group divides by 1
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(xg / div[:, :, None])  # fp32 division, round half to even
    q = np.where(np.isnan(q), np.float32(0), q)  # a NaN quotient (NaN, or inf / inf) is 0
    q = np.clip(q, -Q8_MAX, Q8_MAX).astype(np.int8)
    return q, scale.astype(np.float32)


def quantize_q8(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q8 int8[m,k] in plane order, scales float32[m,k/128], sums int32[m,k/128]) of x[m,k]."""
    x = _as_x(x)
    m, k = x.shape
    q, scales = _q8_groups(x)
    sums = q.astype(np.int32).sum(axis=2, dtype=np.int32)
    # (m, G, b, s) -> (m, G, s, b): position s*32 + b holds element 4b + s.
    q8 = q.reshape(m, k // GROUP, 32, 4).transpose(0, 1, 3, 2).reshape(m, k)
    return np.ascontiguousarray(q8), scales, sums


BITS_GROUP_WORDS = 128  # PQ2_BITS_GROUP_WORDS of native/src/cuda/device/codes.cuh


def bitslice_q8(q8) -> np.ndarray:
    """uint32[m, k/128, 128]: the bit-sliced copy of plane-order q8[m, k] the m == 1 GPU kernels
    read (codes.cuh; FORMATS.md 3.3, "Bit-sliced activations"), so that AND-POPC with the tile
    bytes as loaded gives the integer dot product."""
    q8 = np.asarray(q8, dtype=np.int8)
    m, k = q8.shape
    g = k // GROUP
    # plane order -> element order: position s*32 + b holds element 4b + s
    q = q8.reshape(m, g, 4, 32).transpose(0, 1, 3, 2).reshape(m, g, GROUP).view(np.uint8)
    e = q.reshape(m, g, 4, 2, 4, 4)  # element 32tq + 16w + 4c + s
    bits = (
        e[None] >> np.arange(8, dtype=np.uint8).reshape(8, 1, 1, 1, 1, 1, 1)
    ) & 1  # (b, m, g, tq, w, c, s)
    shift = (8 * np.arange(4).reshape(4, 1) + 2 * np.arange(4).reshape(1, 4)).astype(np.uint32)
    b1 = (bits.astype(np.uint32) * (np.uint32(3) << shift)).sum(
        axis=(5, 6), dtype=np.uint32
    )  # (b, m, g, tq, w)
    words = np.concatenate([b1, b1 & np.uint32(0xAAAAAAAA)], axis=4)  # w = 0..3
    return np.ascontiguousarray(words.transpose(1, 2, 0, 3, 4).reshape(m, g, BITS_GROUP_WORDS))


def matmul_q8(raw, n: int, k: int, x) -> np.ndarray:
    """float64[m,n]: the exact answer of the Q8 problem pq2_matmul_host solves.

    Per (row, group) the integer dot(code - 1, q) (exact: float64 holds integers far beyond
    2 * 127 * 128), times d_w * d_x, summed over groups in float64.
    """
    x = _as_x(x)
    g = check_matrix(raw, n, k)
    if x.shape[1] != k:
        raise ValueError(f"x has K={x.shape[1]}, weights have K={k}")
    codes, dw = pq2_unpack(raw)
    wt = (codes.astype(np.float64) - 1).reshape(n, g, GROUP).transpose(1, 2, 0)  # (G, 128, n)
    q, dx = _q8_groups(x)
    dots = np.matmul(q.astype(np.float64).transpose(1, 0, 2), wt)  # (G, m, n)
    dw = dw.astype(np.float64).reshape(n, g).T  # (G, n)
    dx = dx.astype(np.float64).T  # (G, m)
    return np.einsum("gmn,gm,gn->mn", dots, dx, dw)


def matmul_float(raw, n: int, k: int, x) -> np.ndarray:
    """float64[m,n] = x . W^T with dequantised weights and unquantised x, in float64."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x must be (m, {k}), got {x.shape}")
    return x @ pq2_dequantize(raw, n, k).astype(np.float64).T


def rel_rms(out, ref) -> float:
    """sqrt(sum (out - ref)^2 / sum ref^2); inf when out holds a NaN or Inf."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"shapes differ: {out.shape} vs {ref.shape}")
    if not np.isfinite(out).all():
        return float("inf")
    err = float(np.sum((out - ref) ** 2))
    den = float(np.sum(ref**2))
    if den == 0:
        return 0.0 if err == 0 else float("inf")
    return float(np.sqrt(err / den))


def worst_element(out, ref) -> str:
    """Where out and ref differ most, for assertion messages."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.abs(out - ref)
    diff = np.where(np.isnan(diff), np.inf, diff)
    i = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return f"worst at {tuple(int(v) for v in i)}: got {out[i]!r}, want {ref[i]!r}"


# ---- the rotation and the weight path (FORMATS.md 4) ---------------------------------------------


def sylvester(b: int) -> np.ndarray:
    """The unnormalised b x b Sylvester-Hadamard matrix: H[r, c] = (-1)^popcount(r & c)."""
    r = np.arange(b)
    bits = np.bitwise_and(r[:, None], r[None, :])
    parity = np.zeros_like(bits)
    while bits.any():
        parity ^= bits & 1
        bits >>= 1
    return np.where(parity == 1, -1.0, 1.0)


def fwht(x, block: int) -> np.ndarray:
    """float64 x with the normalised Walsh-Hadamard transform applied to every aligned block of
    `block` elements along the last axis: log2(block) butterfly passes, then 1/sqrt(block)."""
    x = np.array(x, dtype=np.float64)
    if block < 1 or block & (block - 1) or x.shape[-1] % block:
        raise ValueError(f"block {block} must be a power of two dividing {x.shape[-1]}")
    y = x.reshape(-1, x.shape[-1] // block, block)
    h = 1
    while h < block:
        z = y.reshape(y.shape[0], y.shape[1], block // (2 * h), 2, h)
        a, b = z[..., 0, :].copy(), z[..., 1, :].copy()
        z[..., 0, :], z[..., 1, :] = a + b, a - b
        h *= 2
    return (y / np.sqrt(block)).reshape(x.shape)


def rotate(x, block: int, signs=None, inverse: bool = False) -> np.ndarray:
    """float64: x' = H_B(s * x), or with inverse s * (H_B x); signs None means all +1."""
    s = np.ones(np.shape(x)[-1]) if signs is None else np.asarray(signs, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    return s * fwht(x, block) if inverse else fwht(s * x, block)


def gdn_v_grouped(x, v_heads: int, k_heads: int) -> np.ndarray:
    """x (last axis: width = hd * v_heads in the tiled V-head order [hd, nk, rep]) in the grouped
    order [hd, rep, nk] (FORMATS.md 4, `gdn_v_grouped`)."""
    x = np.asarray(x)
    width = x.shape[-1]
    hd, rep = width // v_heads, v_heads // k_heads
    tiled = x.reshape(*x.shape[:-1], rep, k_heads, hd)  # [.., r, k, d]
    return np.swapaxes(tiled, -3, -2).reshape(x.shape)  # [.., k, r, d]


def rmsnorm(x, weight, eps: float) -> np.ndarray:
    """float64 x / sqrt(mean(x^2) + eps) * weight along the last axis."""
    x = np.asarray(x, dtype=np.float64)
    return (
        x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(weight, np.float64)
    )


def gated_rmsnorm(o, z, weight, eps: float, v_heads: int) -> np.ndarray:
    """float64 rmsnorm(o) * weight * silu(z) per V head of width / v_heads elements (a
    Gated-DeltaNet layer's output norm; rows on the first axis)."""
    o = np.asarray(o, dtype=np.float64)
    m, width = o.shape
    heads = (m, v_heads, width // v_heads)
    return (rmsnorm(o.reshape(heads), weight, eps) * swiglu(z, 1.0).reshape(heads)).reshape(
        m, width
    )


def swiglu(gate, up) -> np.ndarray:
    """float64 silu(gate) * up."""
    g = np.asarray(gate, dtype=np.float64)
    return g / (1.0 + np.exp(-g)) * np.asarray(up, dtype=np.float64)


def fold(w, block: int, signs=None) -> np.ndarray:
    """The folded weights W' = W diag(s) H_B (rows of w: outputs), so that W' rotate(x) = W x."""
    return rotate(w, block, signs, inverse=False)  # (W diag(s) H)[n] = H (s * W[n]): H symmetric


def unfold(w_folded, block: int, signs=None) -> np.ndarray:
    """The inverse of fold: W = W' H_B diag(s)."""
    return rotate(w_folded, block, signs, inverse=True)
