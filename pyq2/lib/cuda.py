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

from ..spec import layouts
from . import cpu as host
from . import native as _native
from .optional import require_torch

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}


def _dtype_code(t) -> int:
    name = str(t.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"dtype {t.dtype} is not one of float32, float16, bfloat16")
    return DTYPES[name]


def _stream_ptr(stream):
    torch = require_torch()
    s = stream if stream is not None else torch.cuda.current_stream()
    return _native.load()[0].cast("void *", s.cuda_stream)


CONFIG_FIELDS = (
    "family",
    "row_subtiles",
    "tokens",
    "warps",
    "unroll",
    "stages",
    "blocks",
    "splits",
)
# PQ2_FAMILY_ROWBLOCK, PQ2_FAMILY_GEMM, PQ2_FAMILY_GEMM_SM90 (pq2.h)
FAMILY_ROWBLOCK, FAMILY_GEMM, FAMILY_GEMM_SM90 = 1, 2, 3


def _config(**fields):
    ffi, _ = _native.load()
    c = ffi.new("pq2_matmul_config *")
    for name, value in fields.items():
        setattr(c, name, value)
    return c


def matmul_config(
    row_subtiles: int, warps: int, unroll: int, stages: int, blocks: int = 0, splits: int = 0
):
    """A row-block pq2_matmul_config (cffi struct) for explicit launches (tuning, tests): row
    blocks of `row_subtiles` 16-row sub-tiles, `warps` warps per block, `unroll` groups per batch,
    `stages` (1-2 register batches, 3-8 a shared-memory ring), a persistent grid of `blocks` per
    SM (> 0) or `splits` blocks per row block (> 1); see pq2.h.
    """
    return _config(
        family=FAMILY_ROWBLOCK,
        row_subtiles=row_subtiles,
        warps=warps,
        unroll=unroll,
        stages=stages,
        blocks=blocks,
        splits=splits,
    )


def gemm_config(
    tokens: int,
    stages: int = 4,
    splits: int = 0,
    family: int = FAMILY_GEMM,
    blocks: int = 0,
    warps: int = 8,
    unroll: int = 1,
):
    """A GEMM pq2_matmul_config: blocks of 128 weight rows x `tokens`, a cp.async pipeline of
    `stages`, the 128-groups split over `splits` blocks (2..16). FAMILY_GEMM (portable,
    mma.sync): tokens 32, 64, 128, stages 2..4; FAMILY_GEMM_SM90 (wgmma, compute capability 9.0
    only): tokens 32, 64, 96, 128, stages 3..6, and `blocks` 1..4 (splits 0 or 1): a stream-K
    grid of that many blocks per multiprocessor; `warps` 12 (tile grids of 96 or 128 tokens): a
    wide block, whose producer warpgroup gives registers to the consumers, and there `unroll` 2
    (96 tokens): two groups a consumer iteration, one promoted while the next multiplies."""
    return _config(
        family=family,
        row_subtiles=8,
        tokens=tokens,
        warps=warps,
        unroll=unroll,
        stages=stages,
        blocks=blocks,
        splits=splits,
    )


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
        torch = require_torch()
        rt = layouts.layout_rt(layout, rt)
        buf = host.convert_layout(
            np.asarray(raw, dtype=np.uint8).reshape(-1), n, k, "raw", layout, 0, rt
        )
        data = torch.from_numpy(buf).to(device or "cuda")
        return cls(data, n, k, layout, rt)

    @property
    def geometry(self) -> layouts.Layout:
        """The matrix's Layout (name, n, k, rt): what pq2_weights says of it besides its bytes."""
        return layouts.Layout(self.layout, self.n, self.k, self.rt)

    def struct(self):
        ffi, _ = _native.load()
        w = ffi.new("pq2_weights *")
        w.data = ffi.cast("void *", self.data.data_ptr())
        w.bytes = self.data.numel() * self.data.element_size()
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
        torch = require_torch()
        return torch.empty(
            max(self.workspace_size(m, cfg), 256), dtype=torch.uint8, device=self.data.device
        )

    def matmul(
        self, x, out=None, out_dtype=None, workspace=None, cfg=None, stream=None, w_struct=None
    ):
        """y[m, n] = x[m, k] . W^T (x quantised to Q8 inside the call)."""
        torch = require_torch()
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

    def matmul_q8(self, x: Q8Operand, out, workspace=None, cfg=None, stream=None):
        """y = W . x on a Q8 operand made upstream (quantize_q8 or a producer)."""
        ffi, lib = _native.load()
        if workspace is None:
            workspace = self.workspace(x.m, cfg)
        _native.check(
            lib.pq2_matmul_q8_cuda(
                self.struct(),
                x.struct(),
                ffi.cast("void *", out.data_ptr()),
                _dtype_code(out),
                x.m,
                cfg if cfg is not None else ffi.NULL,
                ffi.cast("void *", workspace.data_ptr()),
                workspace.numel(),
                _stream_ptr(stream),
            )
        )
        return out

    def get_rows(
        self, ids, out_dtype=None, rotation: DeviceRotation | None = None, stream=None, out=None
    ):
        """[len(ids), k]: rows ids (int32 cuda tensor) dequantised, then the inverse rotation
        (into out when given)."""
        torch = require_torch()
        ffi, lib = _native.load()
        ids = ids.to(torch.int32).contiguous()
        if out is None:
            out = torch.empty(
                ids.numel(), self.k, dtype=out_dtype or torch.float32, device=ids.device
            )
        elif tuple(out.shape) != (ids.numel(), self.k) or not out.is_contiguous():
            raise ValueError(
                f"out has shape {tuple(out.shape)}; expected [{ids.numel()}, {self.k}]"
            )
        _native.check(
            lib.pq2_get_rows_cuda(
                self.struct(),
                ffi.cast("int32_t *", ids.data_ptr()),
                ids.numel(),
                ffi.cast("void *", out.data_ptr()),
                _dtype_code(out),
                rotation.struct() if rotation is not None else ffi.NULL,
                _stream_ptr(stream),
            )
        )
        return out

    def dequantize(self, out_dtype=None, stream=None, out=None):
        """[n, k] dense weights: (code - 1) * d (into out, contiguous, when given)."""
        torch = require_torch()
        ffi, lib = _native.load()
        if out is None:
            out = torch.empty(
                self.n, self.k, dtype=out_dtype or torch.float32, device=self.data.device
            )
        elif tuple(out.shape) != (self.n, self.k) or not out.is_contiguous():
            raise ValueError(f"out has shape {tuple(out.shape)}; expected [{self.n}, {self.k}]")
        _native.check(
            lib.pq2_dequantize_cuda(
                self.struct(),
                ffi.cast("void *", out.data_ptr()),
                _dtype_code(out),
                _stream_ptr(stream),
            )
        )
        return out


@dataclass
class Q8Operand:
    """The Q8 operand of a matmul (pq2.h pq2_q8) on the GPU: q8 int8 [m, k] in plane order (None
    at m = 1 when only the bit slices are wanted), scales f32 and sums i32 [m, k/128], and the
    kernel operand (uint8, or None). Unpacks as (q8, scales, sums)."""

    q8: Any
    scales: Any
    sums: Any
    kernel_operand: Any
    m: int
    k: int

    @classmethod
    def empty(cls, m: int, k: int, device="cuda", kernel_operand: bool = True, q8: bool = True):
        torch = require_torch()
        ffi, lib = _native.load()
        size = ffi.new("size_t *")
        _native.check(lib.pq2_q8_kernel_operand_bytes(m, k, size))
        ko = None
        if kernel_operand and size[0]:
            ko = torch.empty(int(size[0]), dtype=torch.uint8, device=device)
        return cls(
            torch.empty(m, k, dtype=torch.int8, device=device) if q8 else None,
            torch.empty(m, k // 128, dtype=torch.float32, device=device),
            torch.empty(m, k // 128, dtype=torch.int32, device=device),
            ko,
            m,
            k,
        )

    def struct(self):
        ffi, _ = _native.load()
        q = ffi.new("pq2_q8 *")
        q.q8 = ffi.cast("int8_t *", self.q8.data_ptr()) if self.q8 is not None else ffi.NULL
        q.scales = ffi.cast("float *", self.scales.data_ptr())
        q.sums = ffi.cast("int32_t *", self.sums.data_ptr())
        ko = self.kernel_operand
        q.kernel_operand = ffi.cast("void *", ko.data_ptr()) if ko is not None else ffi.NULL
        return q

    def __iter__(self):
        return iter((self.q8, self.scales, self.sums))


def quantize_q8(
    x, stream=None, kernel_operand: bool = False, out: Q8Operand | None = None
) -> Q8Operand:
    """The Q8 operand of x [m, k] (pq2_quantize_q8_cuda), into out when given."""
    ffi, lib = _native.load()
    x = x.contiguous()
    m, k = x.shape
    out = Q8Operand.empty(m, k, x.device, kernel_operand) if out is None else out
    _native.check(
        lib.pq2_quantize_q8_cuda(
            ffi.cast("void *", x.data_ptr()),
            _dtype_code(x),
            m,
            k,
            out.struct(),
            _stream_ptr(stream),
        )
    )
    return out


# ---- the rotation and the producers (pq2.h "the rotation and the rest of the weight path") ----


@dataclass
class DeviceRotation:
    """A Hadamard rotation on the GPU: block size B and the width's int8 sign vector (a cuda
    tensor, or None for all +1). From a file's contract: DeviceRotation.of(rotation, width); from
    host signs: DeviceRotation.from_signs(block, signs)."""

    block: int
    signs: Any = None

    @classmethod
    def of(cls, rotation, width: int, device="cuda") -> DeviceRotation:
        return cls.from_signs(rotation.block, rotation.signs_for(width), device)

    @classmethod
    def from_signs(cls, block: int, signs, device="cuda") -> DeviceRotation:
        """B and a host int8 sign vector (None: all +1), the signs copied to the device."""
        torch = require_torch()
        return cls(block, None if signs is None else torch.from_numpy(signs).to(device))

    def struct(self):
        ffi, _ = _native.load()
        r = ffi.new("pq2_rotation *")
        r.block = self.block
        r.signs = (
            ffi.cast("int8_t *", self.signs.data_ptr()) if self.signs is not None else ffi.NULL
        )
        return r


def _rot(rotation):
    return rotation.struct() if rotation is not None else _native.load()[0].NULL


def rotate(x, rotation: DeviceRotation, inverse: bool = False, out=None, stream=None):
    """H_B(s * x) (or s * H_B(x) with inverse) of x [m, width]; out=x rotates in place."""
    ffi, lib = _native.load()
    out = require_torch().empty_like(x) if out is None else out
    _native.check(
        lib.pq2_rotate_cuda(
            ffi.cast("void *", x.data_ptr()),
            _dtype_code(x),
            ffi.cast("void *", out.data_ptr()),
            _dtype_code(out),
            x.shape[0],
            x.shape[1],
            rotation.struct(),
            1 if inverse else 0,
            _stream_ptr(stream),
        )
    )
    return out


def _ptr(t):
    ffi, _ = _native.load()
    return ffi.cast("void *", t.data_ptr()) if t is not None else ffi.NULL


def norm_rotate_q8(
    x,
    norm_weight,
    eps: float,
    rotation: DeviceRotation | None,
    residual=None,
    h_out=None,
    normed=None,
    out: Q8Operand | None = None,
    stream=None,
) -> Q8Operand:
    """Q8 of rotate(RMSNorm(x + residual) * norm_weight); h = x + residual to h_out and the
    un-rotated normed activation to normed when given (pq2_norm_rotate_q8_cuda)."""
    ffi, lib = _native.load()
    m, width = x.shape
    out = Q8Operand.empty(m, width, x.device) if out is None else out
    _native.check(
        lib.pq2_norm_rotate_q8_cuda(
            _ptr(x),
            _ptr(residual),
            _ptr(h_out),
            _dtype_code(x),
            _ptr(norm_weight),
            _dtype_code(norm_weight),
            eps,
            m,
            width,
            _rot(rotation),
            out.struct(),
            _ptr(normed),
            _dtype_code(normed) if normed is not None else 0,
            _stream_ptr(stream),
        )
    )
    return out


def swiglu_rotate_q8(
    gate, up, rotation: DeviceRotation | None, out: Q8Operand | None = None, stream=None
) -> Q8Operand:
    """Q8 of rotate(silu(gate) * up); gate and up [m, width] views with the same row stride."""
    ffi, lib = _native.load()
    m, width = gate.shape
    if up.stride() != gate.stride() or gate.stride(1) != 1:
        raise ValueError("gate and up must be row-major views with the same row stride")
    out = Q8Operand.empty(m, width, gate.device) if out is None else out
    _native.check(
        lib.pq2_swiglu_rotate_q8_cuda(
            _ptr(gate),
            _ptr(up),
            gate.stride(0),
            _dtype_code(gate),
            m,
            width,
            _rot(rotation),
            out.struct(),
            _stream_ptr(stream),
        )
    )
    return out


def rotate_q8(
    x,
    rotation: DeviceRotation | None,
    v_heads: int = 0,
    k_heads: int = 0,
    out: Q8Operand | None = None,
    stream=None,
) -> Q8Operand:
    """Q8 of rotate(x), x first permuted to the grouped V-head order when v_heads > 0."""
    ffi, lib = _native.load()
    m, width = x.shape
    out = Q8Operand.empty(m, width, x.device) if out is None else out
    _native.check(
        lib.pq2_rotate_q8_cuda(
            _ptr(x),
            _dtype_code(x),
            m,
            width,
            _rot(rotation),
            v_heads,
            k_heads,
            out.struct(),
            _stream_ptr(stream),
        )
    )
    return out


def gated_norm_rotate_q8(
    o,
    z,
    norm_weight,
    eps: float,
    rotation: DeviceRotation | None,
    v_heads: int,
    k_heads: int = 0,
    out: Q8Operand | None = None,
    stream=None,
) -> Q8Operand:
    """Q8 of rotate(y), y = RMSNorm(o) * norm_weight * silu(z) per V head of width / v_heads
    elements, permuted to the grouped V-head order when k_heads > 0; o [m, width] float32
    contiguous, z [m, width] with unit column stride (pq2_gated_norm_rotate_q8_cuda)."""
    ffi, lib = _native.load()
    if o.dim() != 2 or not o.is_contiguous() or str(o.dtype) != "torch.float32":
        raise ValueError("o must be a contiguous float32 matrix")
    m, width = o.shape
    if tuple(z.shape) != (m, width) or z.stride(1) != 1:
        raise ValueError(f"z {tuple(z.shape)} must be [{m}, {width}] with unit column stride")
    if v_heads <= 0 or width % v_heads or tuple(norm_weight.shape) != (width // v_heads,):
        raise ValueError(
            f"norm_weight {tuple(norm_weight.shape)}: need one weight per element of a V head "
            f"({width} / v_heads {v_heads})"
        )
    if not norm_weight.is_contiguous() or {z.device, norm_weight.device} != {o.device}:
        raise ValueError("o, z and a contiguous norm_weight must be on one device")
    out = Q8Operand.empty(m, width, o.device) if out is None else out
    _native.check(
        lib.pq2_gated_norm_rotate_q8_cuda(
            _ptr(o),
            _ptr(z),
            z.stride(0),
            _dtype_code(z),
            _ptr(norm_weight),
            _dtype_code(norm_weight),
            eps,
            m,
            width,
            _rot(rotation),
            v_heads,
            k_heads,
            out.struct(),
            _stream_ptr(stream),
        )
    )
    return out


def attention_serves(head_dim: int, group: int) -> bool:
    """Whether pq2_attention_decode_cuda serves a head width and a group of query heads per KV
    head (pq2.h's PQ2_ATTENTION_* limits)."""
    lib = _native.load()[1]
    return (
        lib.PQ2_ATTENTION_MIN_HEAD_DIM <= head_dim <= lib.PQ2_ATTENTION_MAX_HEAD_DIM
        and head_dim & (head_dim - 1) == 0
        and 1 <= group <= lib.PQ2_ATTENTION_MAX_GROUP
    )


def attention_decode_partial(
    q,
    k_cache,
    v_cache,
    positions,
    m,
    l_sum,
    acc,
    chunks: int,
    chunk: int,
    scale: float,
    stream=None,
) -> None:
    """The partial softmax sums of a decode step's attention (pq2_attention_decode_cuda): q bf16
    [B, H, D] contiguous (normed and rotated), the bf16 caches [B', H_kv, context, D] with unit
    element stride, positions int64 [B]; m and l_sum float32 [B, H, n_chunks], acc [B, H, n_chunks,
    D]; `chunks` chunks of `chunk` positions launched per sequence and KV head."""
    torch = require_torch()
    ffi, lib = _native.load()
    b, h, d = q.shape
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4 or h % t.shape[1] or t.shape[3] != d:
            raise ValueError(f"{name} {tuple(t.shape)} does not match q {tuple(q.shape)}")
        if t.stride(3) != 1 or t.stride() != k_cache.stride():
            raise ValueError("the caches need unit element stride and the same strides")
    if not q.is_contiguous() or q.dtype != torch.bfloat16 or k_cache.dtype != torch.bfloat16:
        raise ValueError("q (contiguous) and the caches must be bfloat16")
    if v_cache.dtype != torch.bfloat16 or positions.dtype != torch.int64:
        raise ValueError("v_cache must be bfloat16 and positions int64")
    if tuple(v_cache.shape) != tuple(k_cache.shape) or k_cache.shape[0] < b:
        raise ValueError(f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)}: need the same "
                         f"shape, at least {b} sequences")  # fmt: skip
    tensors = (q, k_cache, v_cache, positions, m, l_sum, acc)
    if not q.is_cuda or any(t.device != q.device for t in tensors):
        raise ValueError("attention_decode_partial's tensors must be on one CUDA device")
    if any(t.dtype != torch.float32 for t in (m, l_sum, acc)) or not positions.is_contiguous():
        raise ValueError("m, l_sum and acc must be float32, positions contiguous")
    if positions.shape != (b,) or m.shape != l_sum.shape or m.shape[:2] != (b, h):
        raise ValueError(f"positions {tuple(positions.shape)} / m {tuple(m.shape)}: need [{b}] "
                         f"and [{b}, {h}, n_chunks]")  # fmt: skip
    if tuple(acc.shape) != (*m.shape, d) or not (m.is_contiguous() and l_sum.is_contiguous()
                                                 and acc.is_contiguous()):  # fmt: skip
        raise ValueError(f"acc {tuple(acc.shape)}: need {(*m.shape, d)}, all three contiguous")
    a = ffi.new("pq2_attention_decode *")
    a.dtype = DTYPES["bfloat16"]
    a.q, a.k_cache, a.v_cache = _ptr(q), _ptr(k_cache), _ptr(v_cache)
    a.positions = ffi.cast("const int64_t *", positions.data_ptr())
    a.m = ffi.cast("float *", m.data_ptr())
    a.l = ffi.cast("float *", l_sum.data_ptr())
    a.acc = ffi.cast("float *", acc.data_ptr())
    a.batch, a.n_head, a.n_head_kv, a.head_dim = b, h, k_cache.shape[1], d
    a.stride_b, a.stride_h, a.stride_s = k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)
    a.n_chunks, a.chunks, a.chunk, a.scale = m.shape[2], chunks, chunk, scale
    _native.check(lib.pq2_attention_decode_cuda(a, _stream_ptr(stream)))
