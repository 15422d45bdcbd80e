"""GPU entry points of libpq2 over torch CUDA tensors (optional: needs torch with CUDA).

    w = PQ2Weights.from_host(raw_bytes, n, k, layout="tiles", rt=2)   # upload once
    y = w.matmul(x)                                                    # x: [m, k] cuda tensor

The library itself takes plain device pointers; torch is only this module's allocator and
stream source. Nothing here synchronises except where a function says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native, host, layouts

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the host
        raise RuntimeError("pyq2.gpu needs PyTorch with CUDA (pip install torch)") from e
    return torch


def _dtype_code(t) -> int:
    name = str(t.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"dtype {t.dtype} is not one of float32, float16, bfloat16")
    return DTYPES[name]


def _stream_ptr(stream):
    torch = _torch()
    s = stream if stream is not None else torch.cuda.current_stream()
    return _native.load()[0].cast("void *", s.cuda_stream)


CONFIG_FIELDS = ("family", "row_subtiles", "warps", "unroll", "stages", "blocks", "splits")
FAMILY_ROWBLOCK = 1  # PQ2_FAMILY_ROWBLOCK (pq2.h)


def matmul_config(
    row_subtiles: int, warps: int, unroll: int, stages: int, blocks: int = 0, splits: int = 0
):
    """A pq2_matmul_config (cffi struct) for explicit launches (tuning, tests): the row-block
    family with row blocks of `row_subtiles` 16-row sub-tiles, `warps` warps per block, `unroll`
    groups per batch, `stages` (1-2 register batches, 3-8 a shared-memory ring), a persistent grid
    of `blocks` per SM (> 0) or `splits` blocks per row block (> 1); see pq2.h.
    """
    ffi, _ = _native.load()
    c = ffi.new("pq2_matmul_config *")
    c.family = FAMILY_ROWBLOCK
    c.row_subtiles, c.warps, c.unroll, c.stages = row_subtiles, warps, unroll, stages
    c.blocks, c.splits = blocks, splits
    return c


@dataclass
class PQ2Weights:
    """A PQ2_0 matrix resident on the GPU in the planes or tiles layout."""

    data: Any  # torch.uint8 cuda tensor, layout bytes
    n: int
    k: int
    layout: str = "tiles"
    rt: int = 2

    @classmethod
    def from_host(cls, raw, n: int, k: int, layout: str = "tiles", rt: int = 2, device=None):
        """Convert raw PQ2_0 blocks (host bytes) to `layout` and upload them."""
        torch = _torch()
        rt = layouts.layout_rt(layout, rt)
        buf = host.convert_layout(
            np.asarray(raw, dtype=np.uint8).reshape(-1), n, k, "raw", layout, 0, rt
        )
        data = torch.from_numpy(buf).to(device or "cuda")
        return cls(data, n, k, layout, rt)

    def struct(self):
        ffi, _ = _native.load()
        w = ffi.new("pq2_weights *")
        w.data = ffi.cast("void *", self.data.data_ptr())
        w.n, w.k = self.n, self.k
        w.layout = layouts.LAYOUTS[self.layout]
        w.rt = layouts.layout_rt(self.layout, self.rt)
        return w

    def config_for(self, m: int):
        ffi, lib = _native.load()
        c = ffi.new("pq2_matmul_config *")
        _native.check(lib.pq2_matmul_config_for(self.struct(), m, c))
        return {f: getattr(c, f) for f in CONFIG_FIELDS}

    def workspace_size(self, m: int, cfg=None) -> int:
        ffi, lib = _native.load()
        out = ffi.new("size_t *")
        _native.check(
            lib.pq2_matmul_workspace_size(
                self.struct(), m, cfg if cfg is not None else ffi.NULL, out
            )
        )
        return int(out[0])

    def workspace(self, m: int, cfg=None):
        torch = _torch()
        return torch.empty(
            max(self.workspace_size(m, cfg), 256), dtype=torch.uint8, device=self.data.device
        )

    def matmul(
        self, x, out=None, out_dtype=None, workspace=None, cfg=None, stream=None, w_struct=None
    ):
        """y[m, n] = x[m, k] . W^T (x quantised to Q8 inside the call)."""
        torch = _torch()
        ffi, lib = _native.load()
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected [m, {self.k}]")
        x = x.contiguous()
        m = x.shape[0]
        if out is None:
            out = torch.empty(m, self.n, dtype=out_dtype or x.dtype, device=x.device)
        if workspace is None:
            workspace = self.workspace(m, cfg)
        _native.check(
            lib.pq2_matmul_cuda(
                w_struct if w_struct is not None else self.struct(),
                ffi.cast("void *", x.data_ptr()),
                _dtype_code(x),
                ffi.cast("void *", out.data_ptr()),
                _dtype_code(out),
                m,
                cfg if cfg is not None else ffi.NULL,
                ffi.cast("void *", workspace.data_ptr()),
                workspace.numel(),
                _stream_ptr(stream),
            )
        )
        return out

    def matmul_q8(self, q8, scales, sums, out, workspace, cfg=None, stream=None):
        """y = W . x on activations already quantised by quantize_q8()."""
        ffi, lib = _native.load()
        m = q8.shape[0]
        _native.check(
            lib.pq2_matmul_q8_cuda(
                self.struct(),
                ffi.cast("int8_t *", q8.data_ptr()),
                ffi.cast("float *", scales.data_ptr()),
                ffi.cast("int32_t *", sums.data_ptr()),
                ffi.cast("void *", out.data_ptr()),
                _dtype_code(out),
                m,
                cfg if cfg is not None else ffi.NULL,
                ffi.cast("void *", workspace.data_ptr()),
                workspace.numel(),
                _stream_ptr(stream),
            )
        )
        return out


def quantize_q8(x, stream=None):
    """(q8 int8 [m, k] plane order, scales f32 [m, k/128], sums i32 [m, k/128]) on the GPU."""
    torch = _torch()
    ffi, lib = _native.load()
    x = x.contiguous()
    m, k = x.shape
    q8 = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scales = torch.empty(m, k // 128, dtype=torch.float32, device=x.device)
    sums = torch.empty(m, k // 128, dtype=torch.int32, device=x.device)
    _native.check(
        lib.pq2_quantize_q8_cuda(
            ffi.cast("void *", x.data_ptr()),
            _dtype_code(x),
            m,
            k,
            ffi.cast("int8_t *", q8.data_ptr()),
            ffi.cast("float *", scales.data_ptr()),
            ffi.cast("int32_t *", sums.data_ptr()),
            _stream_ptr(stream),
        )
    )
    return q8, scales, sums
