"""Pythonic wrappers of the host (CPU) entry points of libpq2.

numpy in, numpy out. Inputs that are not contiguous are copied; dtypes are checked (ValueError
naming the dtype) rather than converted, since a silent float64 -> float32 cast would change the
problem. Sizes are passed to the library in bytes; a failing call raises pyq2.errors.Pq2Error
with the library's status name and message (pq2_last_error). Outputs are filled with NaN before
the call where they are floating, so an element the library skipped cannot pass a comparison.
"""

from __future__ import annotations

import numpy as np

from ..spec.formats import (
    PQ2_BLOCK_BYTES,
    PQ2_BLOCK_WEIGHTS,
    PTQ1_BLOCK_BYTES,
    TQ2_BLOCK_BYTES,
    as_bytes,
)
from ..spec.layouts import layout_id
from . import native as _native


def _layout(layout) -> int:
    # Names are resolved here; integers go to the library as they are, so it reports bad ones.
    return layout_id(layout) if isinstance(layout, str) else int(layout)


def _f32(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(
            f"{name} must be float32, got {x.dtype} (convert with "
            f".astype(np.float32) if that rounding is intended)"
        )
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (m, k), got shape {x.shape}")
    return np.ascontiguousarray(x)


def _in(ffi, arr: np.ndarray, ctype: str):
    return ffi.from_buffer(f"{ctype}[]", arr)


def _out(ffi, arr: np.ndarray, ctype: str):
    return ffi.from_buffer(f"{ctype}[]", arr, require_writable=True)


def layout_bytes(layout, n: int, k: int, rt: int = 0) -> int:
    """Bytes an n x k PQ2_0 matrix takes in `layout`, as the library computes it."""
    ffi, lib = _native.load()
    size = ffi.new("size_t *")
    _native.check(lib.pq2_layout_bytes(_layout(layout), n, k, rt, size))
    return int(size[0])


def _weights(buf, n: int, k: int, layout, rt: int):
    """(pq2_weights *, keep-alive) for buf after checking it holds the whole matrix."""
    ffi, _ = _native.load()
    data = as_bytes(buf)
    need = layout_bytes(layout, n, k, rt)
    if data.size != need:
        raise ValueError(
            f"a PQ2_0 matrix N={n}, K={k} in layout {layout!r} (rt={rt}) takes "
            f"{need} bytes, the buffer has {data.size}"
        )
    cdata = _in(ffi, data, "uint8_t")
    w = ffi.new(
        "pq2_weights *",
        {"data": cdata, "bytes": data.size, "n": n, "k": k, "layout": _layout(layout), "rt": rt},
    )
    return w, (data, cdata)


# ---- layouts -------------------------------------------------------------------------------


def convert_layout(buf, n: int, k: int, src, dst, src_rt: int = 0, dst_rt: int = 0) -> np.ndarray:
    """Flat uint8 bytes of the n x k matrix `buf` (layout src) in layout dst."""
    ffi, lib = _native.load()
    w, keep = _weights(buf, n, k, src, src_rt)
    out = np.empty(layout_bytes(dst, n, k, dst_rt), dtype=np.uint8)
    _native.check(
        lib.pq2_convert_layout(w, _out(ffi, out, "uint8_t"), out.nbytes, _layout(dst), dst_rt)
    )
    return out


# ---- formats -------------------------------------------------------------------------------
# n_blocks comes from the source size rounded down and src_bytes is the true size, so the
# library itself reports a buffer that is not a whole number of blocks.


def _to_pq2(fn, buf, src_block: int, pq2_per_block: int) -> np.ndarray:
    ffi, _ = _native.load()
    src = as_bytes(buf)
    nb = src.size // src_block
    out = np.empty(pq2_per_block * nb * PQ2_BLOCK_BYTES, dtype=np.uint8)
    _native.check(fn(_in(ffi, src, "uint8_t"), src.size, _out(ffi, out, "uint8_t"), out.nbytes, nb))
    return out


def ptq1_to_pq2(buf) -> np.ndarray:
    """PTQ1_0 blocks -> PQ2_0 blocks (flat uint8)."""
    return _to_pq2(_native.load()[1].pq2_ptq1_to_pq2, buf, PTQ1_BLOCK_BYTES, 1)


def tq2_to_pq2(buf) -> np.ndarray:
    """TQ2_0 blocks -> PQ2_0 blocks, two per TQ2_0 block (flat uint8)."""
    return _to_pq2(_native.load()[1].pq2_tq2_to_pq2, buf, TQ2_BLOCK_BYTES, 2)


def pq2_to_ptq1(buf, blocks_per_row: int | None = None) -> np.ndarray:
    """PQ2_0 blocks -> PTQ1_0 blocks (flat uint8). A code 3 raises Pq2Error
    (PQ2_ERR_UNREPRESENTABLE) naming row = block // blocks_per_row (default: one flat row)."""
    ffi, lib = _native.load()
    src = as_bytes(buf)
    nb = src.size // PQ2_BLOCK_BYTES
    out = np.empty(nb * PTQ1_BLOCK_BYTES, dtype=np.uint8)
    bpr = nb if blocks_per_row is None else blocks_per_row
    _native.check(
        lib.pq2_pq2_to_ptq1(
            _in(ffi, src, "uint8_t"), src.size, _out(ffi, out, "uint8_t"), out.nbytes, nb, bpr
        )
    )
    return out


# ---- arithmetic ----------------------------------------------------------------------------


def dequantize(buf, n: int, k: int, layout="raw", rt: int = 0) -> np.ndarray:
    """float32[n,k] = (code - 1) * d of the matrix in any layout."""
    ffi, lib = _native.load()
    w, keep = _weights(buf, n, k, layout, rt)
    out = np.full((n, k), np.nan, dtype=np.float32)
    _native.check(lib.pq2_dequantize_host(w, _out(ffi, out, "float"), out.nbytes))
    return out


def quantize_q8(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q8 int8[m,k] plane order, scales float32[m,k/128], sums int32[m,k/128]) of x[m,k]."""
    ffi, lib = _native.load()
    x = _f32(x, "x")
    m, k = x.shape
    g = k // PQ2_BLOCK_WEIGHTS
    q8 = np.zeros((m, k), dtype=np.int8)
    scales = np.full((m, g), np.nan, dtype=np.float32)
    sums = np.zeros((m, g), dtype=np.int32)
    _native.check(
        lib.pq2_quantize_q8_host(
            _in(ffi, x, "float"),
            x.nbytes,
            m,
            k,
            _out(ffi, q8, "int8_t"),
            q8.nbytes,
            _out(ffi, scales, "float"),
            scales.nbytes,
            _out(ffi, sums, "int32_t"),
            sums.nbytes,
        )
    )
    return q8, scales, sums


def matmul(buf, n: int, k: int, x, layout="raw", rt: int = 0) -> np.ndarray:
    """float32[m,n] = x[m,k] . W^T through the library's Q8 integer path (pq2_matmul_host).

    A 1-D x of length k is one row and gives a 1-D result of length n.
    """
    ffi, lib = _native.load()
    x_in = np.asarray(x)
    x2 = _f32(x_in.reshape(1, -1) if x_in.ndim == 1 else x_in, "x")
    m = x2.shape[0]
    if x2.shape[1] != k:
        raise ValueError(f"x has {x2.shape[1]} columns, the weights have K={k}")
    w, keep = _weights(buf, n, k, layout, rt)
    y = np.full((m, n), np.nan, dtype=np.float32)
    _native.check(
        lib.pq2_matmul_host(w, _in(ffi, x2, "float"), x2.nbytes, m, _out(ffi, y, "float"), y.nbytes)
    )
    return y[0] if x_in.ndim == 1 else y
