"""libpq2 as PyTorch operators (torch.library, namespace "pq2") and the PQ2Linear module.

    import pyq2.lib.torch_ops                        # registers torch.ops.pq2.*
    lin = PQ2Linear.from_weights(w, rotation)    # w: pyq2.lib.cuda.PQ2Weights, rotation optional
    y = torch.compile(lin, fullgraph=True)(x)    # x [..., k] -> y [..., n], dtype of x

Each operator returns new tensors and mutates none of its inputs. It runs on torch's current
stream of the input's device, takes its workspace from torch's caching allocator (torch.empty on
that device, sized by pq2_matmul_workspace_size) and has a fake (meta) kernel, so torch.compile
(fullgraph) traces through it and a CUDA graph captures it. A Q8 operand is four tensors
(pq2.h pq2_q8): q8 int8 [m, k] in plane order, scales f32 [m, k/128], sums i32 [m, k/128] and the
kernel operand uint8 [kernel_operand_bytes(k)] (bytes past what m needs unspecified). A rotation
is `block` (0: none) and `signs` (int8 [width] on the device, or None for all +1). Weights are
a uint8 tensor of layout bytes with n, k, layout (pq2.h pq2_layout: 1 planes, 2 tiles; 0 raw for
get_rows and dequantize) and rt. No autograd formula: the operators serve inference.

Needs torch >= 2.5 (torch.library.custom_op with an explicit schema); the rest of pyq2 does not
need torch at all.
"""

import contextlib
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

try:
    import torch
except ImportError as e:
    raise ImportError(
        "pyq2.lib.torch_ops needs PyTorch: pip install torch (the rest of pyq2 works without it)"
    ) from e

from ..spec import layouts
from . import cuda as gpu
from . import native as _native

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_fake"):
    raise ImportError(
        f"pyq2.lib.torch_ops needs torch >= 2.5 (torch.library.custom_op); this is torch "
        f"{torch.__version__}: pip install -U torch"
    )

# The operators' signatures. Weights: (Tensor weights, int n, int k, int layout, int rt);
# rotation: (int block, Tensor? signs); Q8 operand: (q8, scales, sums, kernel_operand).
_W = "Tensor weights, int n, int k, int layout, int rt"
_Q8 = "(Tensor, Tensor, Tensor, Tensor)"
SCHEMAS = {
    "matmul": f"({_W}, Tensor x) -> Tensor",
    "matmul_q8": (
        f"({_W}, Tensor q8, Tensor scales, Tensor sums, Tensor? kernel_operand, "
        "ScalarType out_dtype) -> Tensor"
    ),
    "quantize_q8": f"(Tensor x) -> {_Q8}",
    "rotate_q8": f"(Tensor x, int block, Tensor? signs, int v_heads=0, int k_heads=0) -> {_Q8}",
    "swiglu_rotate_q8": f"(Tensor gate, Tensor up, int block, Tensor? signs) -> {_Q8}",
    "norm_rotate_q8": (
        "(Tensor x, Tensor? residual, Tensor norm_weight, float eps, int block, Tensor? signs, "
        "ScalarType? normed_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
    ),
    "rotate": "(Tensor x, int block, Tensor? signs, bool inverse=False) -> Tensor",
    "get_rows": (
        f"({_W}, Tensor ids, ScalarType out_dtype, int block=0, Tensor? signs=None) -> Tensor"
    ),
    "dequantize": f"({_W}, ScalarType out_dtype) -> Tensor",
}
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Q8(NamedTuple):
    """The Q8 operand of a matmul as tensors (pq2.h pq2_q8)."""

    q8: torch.Tensor
    scales: torch.Tensor
    sums: torch.Tensor
    kernel_operand: torch.Tensor


@functools.cache
def kernel_operand_bytes(k: int) -> int:
    """Bytes of the kernel operand the producers return: the most any m needs (pq2.h: bit slices
    at m = 1, token records at 2..8, none above), so the size depends on k alone and one traced
    graph serves every m. The kernels write and read the first pq2_q8_kernel_operand_bytes(m, k)
    bytes; the rest are unspecified (clearing them would cost a kernel per call)."""
    ffi, lib = _native.load()
    size = ffi.new("size_t *")
    most = 0
    for m in range(1, lib.PQ2_ROWBLOCK_MAX_M + 1):
        _native.check(lib.pq2_q8_kernel_operand_bytes(m, k, size))
        most = max(most, int(size[0]))
    return most


# ---- helpers of the real kernels (run eagerly, never traced) --------------------------------

_initialised: set = set()


@contextlib.contextmanager
def _on(device):
    """Run on `device` and yield its current torch stream; pq2_cuda_init once per device, so that
    a CUDA graph captured after a first eager call captures no setup."""
    with torch.cuda.device(device):
        if device.index not in _initialised:
            _native.check(_native.load()[1].pq2_cuda_init())
            _initialised.add(device.index)
        yield torch.cuda.current_stream(device)


def _rows(t, name: str):
    """t as the library reads it: rows contiguous, 16-byte aligned (a copy only when not)."""
    if not t.is_cuda:
        raise ValueError(f"{name} is on {t.device}; the pq2 operators take CUDA tensors")
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _weights(weights, n: int, k: int, layout: int, rt: int, device) -> gpu.PQ2Weights:
    if weights.dtype != torch.uint8 or weights.device != device:
        raise ValueError(
            f"weights are {weights.dtype} on {weights.device}; expected torch.uint8 layout bytes "
            f"on {device}"
        )
    return gpu.PQ2Weights(_rows(weights, "weights"), n, k, layouts.layout_name(layout), rt)


def _rotation(block: int, signs, device) -> gpu.DeviceRotation | None:
    if block == 0:
        return None
    if signs is not None and (signs.dtype != torch.int8 or signs.device != device):
        raise ValueError(f"signs are {signs.dtype} on {signs.device}; expected torch.int8 there")
    return gpu.DeviceRotation(block, None if signs is None else _rows(signs, "signs"))


def _check_matrix(x, k: int, name: str) -> None:
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [m, {k}]")


def _q8_empty(m: int, k: int, device) -> gpu.Q8Operand:
    return gpu.Q8Operand(
        torch.empty(m, k, dtype=torch.int8, device=device),
        torch.empty(m, k // 128, dtype=torch.float32, device=device),
        torch.empty(m, k // 128, dtype=torch.int32, device=device),
        torch.empty(kernel_operand_bytes(k), dtype=torch.uint8, device=device),
        m,
        k,
    )


def _q8_tuple(q: gpu.Q8Operand):
    return q.q8, q.scales, q.sums, q.kernel_operand


# ---- the operators: real (CUDA) kernels ------------------------------------------------------


def _matmul(weights, n, k, layout, rt, x):
    _check_matrix(x, k, "x")
    w = _weights(weights, n, k, layout, rt, x.device)
    x = _rows(x, "x")
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        with _on(x.device) as stream:
            w.matmul(x, out=y, workspace=w.workspace(x.shape[0]), stream=stream)
    return y


def _matmul_q8(weights, n, k, layout, rt, q8, scales, sums, kernel_operand, out_dtype):
    m = scales.shape[0]
    _check_matrix(q8, k, "q8")
    if scales.shape != (m, k // 128) or sums.shape != (m, k // 128) or q8.shape[0] != m:
        raise ValueError(
            f"q8 {tuple(q8.shape)}, scales {tuple(scales.shape)}, sums {tuple(sums.shape)}: "
            f"expected [m, {k}], [m, {k // 128}], [m, {k // 128}]"
        )
    w = _weights(weights, n, k, layout, rt, q8.device)
    ko = kernel_operand if kernel_operand is not None and kernel_operand.numel() else None
    x = gpu.Q8Operand(
        _rows(q8, "q8"),
        _rows(scales, "scales"),
        _rows(sums, "sums"),
        None if ko is None else _rows(ko, "kernel_operand"),
        m,
        k,
    )
    y = torch.empty(m, n, dtype=out_dtype, device=q8.device)
    if m:
        with _on(q8.device) as stream:
            w.matmul_q8(x, y, workspace=w.workspace(m), stream=stream)
    return y


def _quantize_q8(x):
    _check_matrix(x, x.shape[-1], "x")
    x = _rows(x, "x")
    out = _q8_empty(x.shape[0], x.shape[1], x.device)
    if x.shape[0]:
        with _on(x.device) as stream:
            gpu.quantize_q8(x, stream=stream, out=out)
    return _q8_tuple(out)


def _rotate_q8(x, block, signs, v_heads=0, k_heads=0):
    _check_matrix(x, x.shape[-1], "x")
    x = _rows(x, "x")
    out = _q8_empty(x.shape[0], x.shape[1], x.device)
    if x.shape[0]:
        rot = _rotation(block, signs, x.device)
        with _on(x.device) as stream:
            gpu.rotate_q8(x, rot, v_heads, k_heads, out=out, stream=stream)
    return _q8_tuple(out)


def _swiglu_rotate_q8(gate, up, block, signs):
    if gate.shape != up.shape or gate.dim() != 2 or gate.dtype != up.dtype:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)}: need equal [m, w]")
    # One row stride for both (the halves of a fused gate_up output, or two separate tensors);
    # anything else is copied to contiguous rows.
    stride = gate.stride(0) * gate.element_size()
    if not (
        gate.is_cuda
        and gate.stride() == up.stride()
        and gate.stride(1) == 1
        and stride % 16 == 0
        and gate.data_ptr() % 16 == 0
        and up.data_ptr() % 16 == 0
    ):
        gate = gate.clone(memory_format=torch.contiguous_format)
        up = up.clone(memory_format=torch.contiguous_format)
    out = _q8_empty(gate.shape[0], gate.shape[1], gate.device)
    if gate.shape[0]:
        rot = _rotation(block, signs, gate.device)
        with _on(gate.device) as stream:
            gpu.swiglu_rotate_q8(gate, up, rot, out=out, stream=stream)
    return _q8_tuple(out)


def _norm_rotate_q8(x, residual, norm_weight, eps, block, signs, normed_dtype=None):
    _check_matrix(x, x.shape[-1], "x")
    x = _rows(x, "x")
    m, width = x.shape
    residual = None if residual is None else _rows(residual, "residual")
    h = torch.empty(m if residual is not None else 0, width, dtype=x.dtype, device=x.device)
    normed = torch.empty(
        m if normed_dtype is not None else 0, width, dtype=normed_dtype or x.dtype, device=x.device
    )
    out = _q8_empty(m, width, x.device)
    if m:
        rot = _rotation(block, signs, x.device)
        with _on(x.device) as stream:
            gpu.norm_rotate_q8(
                x,
                _rows(norm_weight, "norm_weight"),
                eps,
                rot,
                residual=residual,
                h_out=h if residual is not None else None,
                normed=normed if normed_dtype is not None else None,
                out=out,
                stream=stream,
            )
    return (*_q8_tuple(out), h, normed)


def _rotate(x, block, signs, inverse=False):
    _check_matrix(x, x.shape[-1], "x")
    x = _rows(x, "x")
    y = torch.empty_like(x)
    if x.shape[0]:
        rot = _rotation(block, signs, x.device)
        if rot is None:
            raise ValueError("pq2::rotate needs a rotation (block > 0)")
        with _on(x.device) as stream:
            gpu.rotate(x, rot, inverse, out=y, stream=stream)
    return y


def _get_rows(weights, n, k, layout, rt, ids, out_dtype, block=0, signs=None):
    w = _weights(weights, n, k, layout, rt, ids.device)
    ids = _rows(ids.reshape(-1).to(torch.int32), "ids")
    out = torch.empty(ids.numel(), k, dtype=out_dtype, device=ids.device)
    if ids.numel():
        rot = _rotation(block, signs, ids.device)
        with _on(ids.device) as stream:
            w.get_rows(ids, rotation=rot, stream=stream, out=out)
    return out


def _dequantize(weights, n, k, layout, rt, out_dtype):
    w = _weights(weights, n, k, layout, rt, weights.device)
    with _on(weights.device) as stream:
        return w.dequantize(out_dtype, stream=stream)


_IMPLS: dict[str, Callable[..., Any]] = {
    "matmul": _matmul,
    "matmul_q8": _matmul_q8,
    "quantize_q8": _quantize_q8,
    "rotate_q8": _rotate_q8,
    "swiglu_rotate_q8": _swiglu_rotate_q8,
    "norm_rotate_q8": _norm_rotate_q8,
    "rotate": _rotate,
    "get_rows": _get_rows,
    "dequantize": _dequantize,
}

# ---- fake (meta) kernels: shapes and dtypes only ---------------------------------------------


def _check_float(x, name: str) -> None:
    torch._check(x.dtype in FLOAT_DTYPES, lambda: f"{name} is {x.dtype}: need f32, f16 or bf16")


def _q8_fake(x, m, k):
    return (
        x.new_empty((m, k), dtype=torch.int8),
        x.new_empty((m, k // 128), dtype=torch.float32),
        x.new_empty((m, k // 128), dtype=torch.int32),
        x.new_empty((kernel_operand_bytes(int(k)),), dtype=torch.uint8),  # k is static
    )


def _matmul_fake(weights, n, k, layout, rt, x):
    torch._check(x.dim() == 2 and x.shape[1] == k, lambda: f"x {tuple(x.shape)}: need [m, {k}]")
    _check_float(x, "x")
    return x.new_empty((x.shape[0], n))


def _matmul_q8_fake(weights, n, k, layout, rt, q8, scales, sums, kernel_operand, out_dtype):
    torch._check(q8.dim() == 2 and q8.shape[1] == k, lambda: f"q8 {tuple(q8.shape)}: need [m, {k}]")
    return scales.new_empty((scales.shape[0], n), dtype=out_dtype)


def _quantize_q8_fake(x):
    _check_float(x, "x")
    return _q8_fake(x, x.shape[0], x.shape[1])


def _rotate_q8_fake(x, block, signs, v_heads=0, k_heads=0):
    _check_float(x, "x")
    return _q8_fake(x, x.shape[0], x.shape[1])


def _swiglu_rotate_q8_fake(gate, up, block, signs):
    _check_float(gate, "gate")
    return _q8_fake(gate, gate.shape[0], gate.shape[1])


def _norm_rotate_q8_fake(x, residual, norm_weight, eps, block, signs, normed_dtype=None):
    _check_float(x, "x")
    m, width = x.shape
    h = x.new_empty((m if residual is not None else 0, width))
    normed = x.new_empty((m if normed_dtype is not None else 0, width), dtype=normed_dtype)
    return (*_q8_fake(x, m, width), h, normed)


def _rotate_fake(x, block, signs, inverse=False):
    _check_float(x, "x")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _get_rows_fake(weights, n, k, layout, rt, ids, out_dtype, block=0, signs=None):
    return ids.new_empty((ids.numel(), k), dtype=out_dtype)


def _dequantize_fake(weights, n, k, layout, rt, out_dtype):
    return weights.new_empty((n, k), dtype=out_dtype)


_FAKES: dict[str, Callable[..., Any]] = {
    "matmul": _matmul_fake,
    "matmul_q8": _matmul_q8_fake,
    "quantize_q8": _quantize_q8_fake,
    "rotate_q8": _rotate_q8_fake,
    "swiglu_rotate_q8": _swiglu_rotate_q8_fake,
    "norm_rotate_q8": _norm_rotate_q8_fake,
    "rotate": _rotate_fake,
    "get_rows": _get_rows_fake,
    "dequantize": _dequantize_fake,
}

OPS = {}
for _name, _schema in SCHEMAS.items():
    OPS[_name] = torch.library.custom_op(
        f"pq2::{_name}", _IMPLS[_name], mutates_args=(), device_types="cuda", schema=_schema
    )
    torch.library.register_fake(f"pq2::{_name}", _FAKES[_name])


# ---- Python entry points over pyq2.lib.cuda's objects ------------------------------------


def _w_args(w: gpu.PQ2Weights):
    return w.data, w.n, w.k, layouts.layout_id(w.layout), layouts.layout_rt(w.layout, w.rt)


def _rot_args(rotation: gpu.DeviceRotation | None):
    return (0, None) if rotation is None else (rotation.block, rotation.signs)


def matmul(w: gpu.PQ2Weights, x):
    """torch.ops.pq2.matmul: y [m, n] (dtype of x) = x [m, k] . W^T."""
    return torch.ops.pq2.matmul(*_w_args(w), x)


def matmul_q8(w: gpu.PQ2Weights, x: Q8, out_dtype=torch.float32):
    """torch.ops.pq2.matmul_q8: y [m, n] = W . x on a Q8 operand from a producer below."""
    return torch.ops.pq2.matmul_q8(*_w_args(w), *x, out_dtype)


def quantize_q8(x) -> Q8:
    return Q8(*torch.ops.pq2.quantize_q8(x))


def rotate_q8(x, rotation: gpu.DeviceRotation | None, v_heads: int = 0, k_heads: int = 0) -> Q8:
    return Q8(*torch.ops.pq2.rotate_q8(x, *_rot_args(rotation), v_heads, k_heads))


def swiglu_rotate_q8(gate, up, rotation: gpu.DeviceRotation | None) -> Q8:
    return Q8(*torch.ops.pq2.swiglu_rotate_q8(gate, up, *_rot_args(rotation)))


def norm_rotate_q8(
    x,
    norm_weight,
    eps: float,
    rotation: gpu.DeviceRotation | None,
    residual=None,
    normed_dtype=None,
):
    """(Q8, h, normed): h = x + residual ([0, width] without a residual), normed the un-rotated
    RMSNorm output in normed_dtype ([0, width] when normed_dtype is None)."""
    *q, h, normed = torch.ops.pq2.norm_rotate_q8(
        x, residual, norm_weight, eps, *_rot_args(rotation), normed_dtype
    )
    return Q8(*q), h, normed


def rotate(x, rotation: gpu.DeviceRotation, inverse: bool = False):
    return torch.ops.pq2.rotate(x, rotation.block, rotation.signs, inverse)


def get_rows(
    w: gpu.PQ2Weights, ids, out_dtype=torch.float32, rotation: gpu.DeviceRotation | None = None
):
    return torch.ops.pq2.get_rows(*_w_args(w), ids, out_dtype, *_rot_args(rotation))


def dequantize(w: gpu.PQ2Weights, out_dtype=torch.float32):
    return torch.ops.pq2.dequantize(*_w_args(w), out_dtype)


# ---- the module ------------------------------------------------------------------------------


class PQ2Linear(torch.nn.Module):
    """y [..., n] = x [..., k] . W^T for a PQ2_0 weight resident on the GPU (bias-free, like the
    projections of a ternary model). With a rotation (a folded weight, W' = W diag(s) H), the
    input is rotated on its way to Q8 (pq2::rotate_q8, then pq2::matmul_q8): two kernels, the
    same as the plain pq2::matmul. y has x's dtype (f32, f16 or bf16). The weight and the signs
    are buffers, so .to(device) moves them and .to(dtype) leaves them alone. Tiles layout for
    any number of rows; planes only up to 16 rows (pq2.h)."""

    def __init__(
        self,
        weight,
        n: int,
        k: int,
        rt: int = 2,
        layout: str = "tiles",
        rotation_block: int = 0,
        rotation_signs=None,
    ):
        super().__init__()
        if layouts.layout_name(layout) not in ("planes", "tiles"):
            raise ValueError(f"PQ2Linear needs the planes or tiles layout, not {layout!r}")
        self.in_features, self.out_features = k, n
        self.layout = layouts.layout_id(layout)
        self.rt = layouts.layout_rt(layout, rt)
        self.rotation_block = rotation_block
        self.register_buffer("weight", weight)
        self.register_buffer("rotation_signs", rotation_signs)

    @classmethod
    def from_weights(
        cls, w: gpu.PQ2Weights, rotation: gpu.DeviceRotation | None = None
    ) -> "PQ2Linear":
        """Shares w's device tensors (no copy)."""
        block, signs = _rot_args(rotation)
        return cls(w.data, w.n, w.k, w.rt, w.layout, block, signs)

    def forward(self, x):
        n, k = self.out_features, self.in_features
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k)
        w = (self.weight, n, k, self.layout, self.rt)
        if self.rotation_block:
            q = torch.ops.pq2.rotate_q8(x2, self.rotation_block, self.rotation_signs, 0, 0)
            y = torch.ops.pq2.matmul_q8(*w, *q, x.dtype)
        else:
            y = torch.ops.pq2.matmul(*w, x2)
        return y.reshape(*lead, n)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"layout={layouts.layout_name(self.layout)}, rt={self.rt}, "
            f"rotation_block={self.rotation_block}"
        )
