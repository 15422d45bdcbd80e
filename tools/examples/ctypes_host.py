"""A folded model's projections through libpq2 from a host that owns its buffers: plain ctypes.

    python tools/examples/ctypes_host.py [path/to/libpq2.so]     # needs a GPU and torch

torch is the host: it allocates every buffer and lends its current stream; libpq2 only reads and
writes them. The structs and signatures are pq2.h's (ABI 6); no cffi, and pyq2 only finds the
library. A folded weight W' = W diag(s) H_B reads rotated activations (FORMATS.md, "Prism
Hadamard rotation"), so a projection is two kernels: a producer of the Q8 operand, one per
stage of the model (rotate_q8: x' = Q8(H_B(s * x)); norm_rotate_q8: the RMSNorm of x + residual
first; swiglu_rotate_q8: silu(gate) * up first), then matmul_q8 (y = x' . W'^T, which is
x . W^T up to the quantisation). rotated_projection does both for raw PQ2_0 bytes; the pieces
take buffers the host already holds on the device (a loaded model's weights and signs). torch
is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys

ABI_VERSION = 7
PQ2_LAYOUT_RAW, PQ2_LAYOUT_TILES = 0, 2
PQ2_DTYPES = {"torch.float32": 0, "torch.float16": 1, "torch.bfloat16": 2}  # PQ2_DTYPE_*

P, i8, i32, i64, f32 = ctypes.POINTER, ctypes.c_int8, ctypes.c_int32, ctypes.c_int64, ctypes.c_float
size_t, ptr = ctypes.c_size_t, ctypes.c_void_p  # void *: device pointers and the cudaStream_t


class pq2_weights(ctypes.Structure):
    _fields_ = [
        ("data", ptr),  # const void *: host or device memory, as the entry point says
        ("bytes", size_t),  # size of the buffer at data
        ("n", i64),
        ("k", i64),
        ("layout", i32),  # PQ2_LAYOUT_*
        ("rt", i32),  # TILES: 16-row sub-tiles per tile (1, 2, 4); else 0
    ]


class pq2_q8(ctypes.Structure):
    _fields_ = [
        ("q8", P(i8)),  # [m][k] in plane order, 16-byte aligned
        ("scales", P(f32)),  # [m][k/128]
        ("sums", P(i32)),  # [m][k/128]
        ("kernel_operand", ptr),  # NULL or pq2_q8_kernel_operand_bytes(m, k) bytes
    ]


class pq2_rotation(ctypes.Structure):
    _fields_ = [
        ("block", i32),  # B: a power of two, 64..4096, dividing the width
        ("signs", P(i8)),  # const int8_t *: [width] of +1 / -1 on the device; NULL: all +1
    ]


class pq2_matmul_config(ctypes.Structure):  # passed as NULL here: the tuned configuration
    _fields_ = [
        (f, i32) for f in "family row_subtiles tokens warps unroll stages blocks splits".split()
    ]


# Struct pointers (ctypes has no const) and, per entry point used here, the argument types;
# each returns a pq2_status (an int32).
PW, PQ, PR, PC = P(pq2_weights), P(pq2_q8), P(pq2_rotation), P(pq2_matmul_config)
SIGNATURES = {
    "pq2_layout_bytes": [i32, i64, i64, i32, P(size_t)],  # layout, n, k, rt, &bytes
    "pq2_convert_layout": [PW, ptr, size_t, i32, i32],  # src, dst, dst_bytes, dst_layout, dst_rt
    "pq2_q8_kernel_operand_bytes": [i64, i64, P(size_t)],  # m, k, &bytes
    "pq2_matmul_workspace_size": [PW, i64, PC, P(size_t)],  # w, m, cfg, &bytes
    # x, dtype, m, width, rot, v_heads, k_heads, out, stream
    "pq2_rotate_q8_cuda": [ptr, i32, i64, i64, PR, i32, i32, PQ, ptr],
    # x, residual, h_out, dtype, norm_weight, norm_dtype, eps, m, width, rot, out, normed,
    # normed_dtype, stream
    "pq2_norm_rotate_q8_cuda": [ptr, ptr, ptr, i32, ptr, i32, f32, i64, i64, PR, PQ, ptr, i32, ptr],
    # gate, up, ld (the row stride of both, in elements), dtype, m, width, rot, out, stream
    "pq2_swiglu_rotate_q8_cuda": [ptr, ptr, i64, i32, i64, i64, PR, PQ, ptr],
    # w, x, y, y_dtype, m, cfg, workspace, workspace_bytes, stream
    "pq2_matmul_q8_cuda": [PW, PQ, ptr, i32, i64, PC, ptr, size_t, ptr],
}


def load(path=None) -> ctypes.CDLL:
    """libpq2 with SIGNATURES declared; a failing call raises RuntimeError naming the status and
    the library's message. path None: $PYQ2_LIBRARY, else the copy bundled in the pyq2 package."""
    if path is None:
        from pyq2.lib.native import library_path  # only to find the file

        path = library_path()
    lib = ctypes.CDLL(str(path))
    lib.pq2_abi_version.restype = ctypes.c_uint32
    lib.pq2_status_name.argtypes, lib.pq2_status_name.restype = [i32], ctypes.c_char_p  # never NULL
    lib.pq2_last_error.argtypes, lib.pq2_last_error.restype = [], ctypes.c_char_p
    if lib.pq2_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path}: ABI {lib.pq2_abi_version()}, this host declares {ABI_VERSION}")

    def check(status, func, args):
        if status != 0:  # pq2_last_error() is thread-local: it names this call's values
            name = lib.pq2_status_name(status).decode()
            raise RuntimeError(f"{name}: {lib.pq2_last_error().decode(errors='replace')}")
        return status

    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype, fn.errcheck = argtypes, i32, check
    return lib


def to_tiles(lib, raw, n: int, k: int, rt: int = 2) -> bytearray:
    """The n x k matrix of raw PQ2_0 blocks (bytes-like: n rows of k/128 34-byte blocks, as in
    GGUF) in the TILES layout, converted in host memory (done once, offline, for a real model)."""
    mv = memoryview(raw).cast("B")
    src_buf = (ctypes.c_char * len(mv)).from_buffer_copy(mv)
    src = pq2_weights(ctypes.addressof(src_buf), len(mv), n, k, PQ2_LAYOUT_RAW, 0)
    size = size_t()
    lib.pq2_layout_bytes(PQ2_LAYOUT_TILES, n, k, rt, size)  # a struct or size_t goes by reference
    dst = bytearray(size.value)
    dst_buf = (ctypes.c_char * len(dst)).from_buffer(dst)
    lib.pq2_convert_layout(src, ctypes.addressof(dst_buf), len(dst), PQ2_LAYOUT_TILES, rt)
    return dst


# ---- the device half: every buffer is a torch tensor the host keeps alive while the kernels
# run (torch allocations are 256-byte aligned: every pq2.h alignment rule holds) ----


def _ptr(t, ctype):
    """A typed pointer to a tensor's data, or NULL for None."""
    return ctypes.cast(t.data_ptr(), P(ctype)) if t is not None else None


def _addr(t):
    """A tensor's device address for a void * argument, or NULL for None."""
    return t.data_ptr() if t is not None else None


def _dtype(t) -> int:
    if str(t.dtype) not in PQ2_DTYPES:
        raise ValueError(f"{t.dtype} is not one of {', '.join(PQ2_DTYPES)}")
    return PQ2_DTYPES[str(t.dtype)]


@contextlib.contextmanager
def _stream(t):
    """torch's current stream of t's device, as the int a cudaStream_t argument takes, with that
    device current (libpq2 launches on the current device)."""
    import torch

    with torch.cuda.device(t.device):
        yield torch.cuda.current_stream(t.device).cuda_stream


def _matrix(t, shape, name: str, dense: bool = True) -> None:
    """t must be a CUDA tensor of `shape`, contiguous (dense) or with contiguous rows."""
    ok = t.stride(-1) == 1 and (t.is_contiguous() or not dense)
    if not t.is_cuda or tuple(t.shape) != tuple(shape) or not ok:
        what = "contiguous" if dense else "with contiguous rows"
        raise ValueError(f"{name} must be a {list(shape)} CUDA tensor, {what}")


def device_weights(tiles, n: int, k: int, rt: int = 2) -> pq2_weights:
    """A pq2_weights naming an n x k TILES matrix already on the device (a uint8 CUDA tensor)."""
    return pq2_weights(tiles.data_ptr(), tiles.numel(), n, k, PQ2_LAYOUT_TILES, rt)


def rotation(block: int, signs) -> pq2_rotation:
    """A pq2_rotation: block B and the width's signs (an int8 CUDA tensor of +1 / -1, or None
    for all +1)."""
    return pq2_rotation(block, _ptr(signs, i8))


class Q8Buffers:
    """The Q8 operand of an m x k activation on the device (pq2.h pq2_q8): torch tensors and the
    struct naming them. It has its kernel operand (0 bytes above m = 8): a producer writes all
    the matmul reads, so the matmul is the only kernel after it."""

    def __init__(self, lib, m: int, k: int, device):
        import torch

        size = size_t()
        lib.pq2_q8_kernel_operand_bytes(m, k, size)
        self.m, self.k = m, k
        self.q8 = torch.empty(m, k, dtype=torch.int8, device=device)
        self.scales = torch.empty(m, k // 128, dtype=torch.float32, device=device)
        self.sums = torch.empty(m, k // 128, dtype=torch.int32, device=device)
        ko = torch.empty(size.value, dtype=torch.uint8, device=device) if size.value else None
        self.kernel_operand = ko
        self.struct = pq2_q8(
            _ptr(self.q8, i8), _ptr(self.scales, f32), _ptr(self.sums, i32), _addr(ko)
        )


def rotate_q8(lib, x, rot: pq2_rotation, q: Q8Buffers, v_heads: int = 0, k_heads: int = 0):
    """q = Q8(H_B(s * x)) of x [m, k] (f32, f16 or bf16); with v_heads > 0 x is first permuted
    to the grouped V-head order (a Gated-DeltaNet output; pq2.h)."""
    _matrix(x, (q.m, q.k), "x")
    with _stream(x) as stream:
        lib.pq2_rotate_q8_cuda(
            x.data_ptr(), _dtype(x), q.m, q.k, rot, v_heads, k_heads, q.struct, stream
        )


def norm_rotate_q8(
    lib, x, norm_weight, eps: float, rot: pq2_rotation, q: Q8Buffers, residual=None, h_out=None
):
    """q = Q8(H_B(s * RMSNorm(h) * norm_weight)), h = x + residual (residual None: h = x),
    written to h_out when given."""
    for t, name in ((x, "x"), (residual, "residual"), (h_out, "h_out")):
        if t is not None:
            _matrix(t, (q.m, q.k), name)
    _matrix(norm_weight, (q.k,), "norm_weight")
    with _stream(x) as stream:
        lib.pq2_norm_rotate_q8_cuda(
            x.data_ptr(), _addr(residual), _addr(h_out), _dtype(x),
            norm_weight.data_ptr(), _dtype(norm_weight), eps, q.m, q.k, rot, q.struct,
            None, 0, stream,  # normed NULL: the un-rotated normed rows are not wanted here
        )  # fmt: skip


def swiglu_rotate_q8(lib, gate, up, rot: pq2_rotation, q: Q8Buffers):
    """q = Q8(H_B(s * silu(gate) * up)); gate and up [m, k] with one row stride (two tensors,
    or the halves of one gate_up output)."""
    _matrix(gate, (q.m, q.k), "gate", dense=False)
    _matrix(up, (q.m, q.k), "up", dense=False)
    if up.stride(0) != gate.stride(0) or up.dtype != gate.dtype:
        raise ValueError("gate and up must have one dtype and one row stride")
    ld = gate.stride(0)
    with _stream(gate) as stream:
        lib.pq2_swiglu_rotate_q8_cuda(
            gate.data_ptr(), up.data_ptr(), ld, _dtype(gate), q.m, q.k, rot, q.struct, stream
        )


def matmul_q8(lib, w: pq2_weights, q: Q8Buffers, out=None):
    """y[m, n] = x' . W^T of the Q8 operand q and W on the device, into out when given (f32,
    f16 or bf16), else a new f32 tensor."""
    import torch

    dev = q.scales.device
    y = torch.empty(q.m, w.n, dtype=torch.float32, device=dev) if out is None else out
    _matrix(y, (q.m, w.n), "out")
    size = size_t()
    lib.pq2_matmul_workspace_size(w, q.m, None, size)  # cfg NULL: the tuned configuration
    ws = torch.empty(max(size.value, 256), dtype=torch.uint8, device=dev)
    with _stream(y) as stream:
        lib.pq2_matmul_q8_cuda(
            w, q.struct, y.data_ptr(), _dtype(y), q.m, None, ws.data_ptr(), ws.numel(), stream
        )
    # The workspace goes back to torch's stream-ordered allocator: reuse waits for the kernel.
    return y


def rotated_projection(lib_path, raw, n: int, k: int, x, block: int, signs, rt: int = 2):
    """y[m, n] f32 = Q8(H_B(s * x)) . W'^T, W' the folded n x k weight as raw PQ2_0 bytes, x a
    [m, k] CUDA tensor (f32, f16 or bf16), signs s a [k] tensor of +1 / -1 (None: all +1). Runs
    on torch's current stream and returns without synchronising."""
    import torch

    lib = load(lib_path)
    if not x.is_cuda or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be a [m, {k}] CUDA tensor, got {tuple(x.shape)} on {x.device}")
    dev, x = x.device, x.contiguous()
    tiles = torch.frombuffer(to_tiles(lib, raw, n, k, rt), dtype=torch.uint8).to(dev)
    signs = signs.to(dev, torch.int8).contiguous() if signs is not None else None
    q = Q8Buffers(lib, x.shape[0], k, dev)
    rotate_q8(lib, x, rotation(block, signs), q)  # v_heads = k_heads = 0: no permutation
    return matmul_q8(lib, device_weights(tiles, n, k, rt), q)


def main(argv=None) -> None:
    """A random folded weight: the error against the float product of the weights it holds."""
    import numpy as np
    import torch

    from pyq2.spec import formats, reference

    argv = sys.argv[1:] if argv is None else argv
    n, k, block, m = 512, 1024, 256, 4
    rng = np.random.default_rng(0)
    signs = rng.choice(np.array([-1, 1], np.int8), k)
    raw = formats.pq2_quantize(reference.fold(rng.standard_normal((n, k)), block, signs))
    w = reference.unfold(formats.pq2_dequantize(raw, n, k), block, signs)  # float64 W
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda()
    y = rotated_projection(argv[0] if argv else None, raw, n, k, x, block, torch.from_numpy(signs))
    want = x.cpu().double().numpy() @ w.T
    err = y.cpu().double().numpy() - want
    rel = np.sqrt((err**2).sum() / (want**2).sum())
    print(
        f"y[{m}, {n}]: max |error| {abs(err).max():.4g} of max |y| {abs(want).max():.4g}, "
        f"relative RMS {rel:.3g} against the float product"
    )


if __name__ == "__main__":
    main()
