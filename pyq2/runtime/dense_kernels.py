"""The decode step's un-folded side projections (ssm_alpha, ssm_beta: dense rows read by the
un-rotated normed activations) as one Triton kernel for steps of a few rows.

y[m, n] = sum_k x[m, k] w[n, k] with a float32 sum: program (n, row block) reads weight row n once
and the block's activation rows, which stay in L2 for the other programs. A decode step's side
matrix is small (96 rows of 5120 at 27B); cuBLAS's split-K kernels for it outlast the input
projection that the side stream overlaps, and the recurrence waits on them
(tools/bench/NOTES.md, 2026-12-04). Importing this module needs triton.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

MAX_ROWS = 16  # the rows it takes
STEP_ROWS = 2  # DecodeStep's side calls of up to so many rows use it; cuBLAS is faster above
BK = 1024  # weight columns per iteration
WARPS = 4


@triton.jit
def _dense_rows(x, w, y, M, K, s_x, s_w, s_y, BM: tl.constexpr, BK: tl.constexpr):
    n = tl.program_id(0)
    rows = tl.program_id(1) * BM + tl.arange(0, BM)
    live = rows < M
    acc = tl.zeros((BM, BK), tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        mk = k < K
        wr = tl.load(w + n * s_w + k, mask=mk, other=0.0, eviction_policy="evict_first")
        xr = tl.load(x + rows[:, None] * s_x + k[None, :], mask=live[:, None] & mk[None, :],
                     other=0.0)  # fmt: skip
        acc += xr.to(tl.float32) * wr.to(tl.float32)[None, :]
    out = tl.sum(acc, 1)
    tl.store(y + rows * s_y + n, out.to(y.dtype.element_ty), mask=live)


def dense_rows(x: Any, w: Any, out: Any) -> None:
    """out (M, N) = x (M, K) . w (N, K)^T with a float32 sum, M <= MAX_ROWS; rows with unit
    stride, out's dtype any float."""
    m, k = x.shape
    n = w.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"dense_rows takes 1..{MAX_ROWS} rows, not {m}")
    if w.shape[1] != k or tuple(out.shape) != (m, n):
        raise ValueError(f"shapes x {tuple(x.shape)}, w {tuple(w.shape)}, out {tuple(out.shape)}")
    if x.stride(-1) != 1 or w.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("dense_rows needs rows with unit stride")
    bm = triton.next_power_of_2(m)
    _dense_rows[(n, 1)](
        x, w, out, m, k, x.stride(0), w.stride(0), out.stride(0), BM=bm,
        BK=max(16, BK // bm), num_warps=WARPS,
    )  # fmt: skip
