"""One rotated projection through libpq2 from a host that owns its buffers: plain ctypes, no cffi.

    python tools/examples/ctypes_host.py [path/to/libpq2.so]     # needs a GPU and torch

torch is the host: it allocates every buffer and lends its current stream; libpq2 only reads and
writes them. The structs and signatures are pq2.h's (ABI 6). A folded weight W' = W diag(s) H_B
reads rotated activations (FORMATS.md, "Prism Hadamard rotation"), so a projection is two
kernels: pq2_rotate_q8_cuda (x' = Q8(H_B(s * x))) and pq2_matmul_q8_cuda (y = x' . W'^T, which
is x . W^T up to the quantisation). torch is imported inside the functions.
"""

from __future__ import annotations

import ctypes
import sys

ABI_VERSION = 6
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
    # w, x, y, y_dtype, m, cfg, workspace, workspace_bytes, stream
    "pq2_matmul_q8_cuda": [PW, PQ, ptr, i32, i64, PC, ptr, size_t, ptr],
}


def load(path=None) -> ctypes.CDLL:
    """libpq2 with SIGNATURES declared; a failing call raises RuntimeError naming the status and
    the library's message. path None: $PYQ2_LIBRARY, else the copy bundled in the pyq2 package."""
    if path is None:
        from pyq2._native import library_path  # only to find the file

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


def _ptr(t, ctype):
    """A typed pointer to a tensor's data, or NULL for None."""
    return ctypes.cast(t.data_ptr(), P(ctype)) if t is not None else None


def rotated_projection(lib_path, raw, n: int, k: int, x, block: int, signs, rt: int = 2):
    """y[m, n] f32 = Q8(H_B(s * x)) . W'^T, W' the folded n x k weight as raw PQ2_0 bytes, x a
    [m, k] CUDA tensor (f32, f16 or bf16), signs s a [k] tensor of +1 / -1 (None: all +1). Runs
    on torch's current stream and returns without synchronising."""
    import torch

    lib = load(lib_path)
    if not x.is_cuda or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be a [m, {k}] CUDA tensor, got {tuple(x.shape)} on {x.device}")
    dev, m, x = x.device, x.shape[0], x.contiguous()
    with torch.cuda.device(dev):  # libpq2 launches on the current device
        stream = torch.cuda.current_stream(dev).cuda_stream  # the cudaStream_t, an int
        # torch allocations are 256-byte aligned: every pq2.h alignment rule holds
        tiles = torch.frombuffer(to_tiles(lib, raw, n, k, rt), dtype=torch.uint8).to(dev)
        w = pq2_weights(tiles.data_ptr(), tiles.numel(), n, k, PQ2_LAYOUT_TILES, rt)
        signs = signs.to(dev, torch.int8).contiguous() if signs is not None else None
        rot = pq2_rotation(block, _ptr(signs, i8))

        # The Q8 operand with its kernel operand (0 bytes above m = 8): the producer writes all
        # the matmul reads, so the matmul is the only kernel after it.
        size = size_t()
        lib.pq2_q8_kernel_operand_bytes(m, k, size)
        q8 = torch.empty(m, k, dtype=torch.int8, device=dev)
        scales = torch.empty(m, k // 128, dtype=torch.float32, device=dev)
        sums = torch.empty(m, k // 128, dtype=torch.int32, device=dev)
        ko = torch.empty(size.value, dtype=torch.uint8, device=dev) if size.value else None
        ko_ptr = ko.data_ptr() if ko is not None else None
        q = pq2_q8(_ptr(q8, i8), _ptr(scales, f32), _ptr(sums, i32), ko_ptr)
        # v_heads = k_heads = 0: no permutation before the rotation
        lib.pq2_rotate_q8_cuda(x.data_ptr(), PQ2_DTYPES[str(x.dtype)], m, k, rot, 0, 0, q, stream)

        lib.pq2_matmul_workspace_size(w, m, None, size)  # cfg NULL: the tuned configuration
        ws = torch.empty(max(size.value, 256), dtype=torch.uint8, device=dev)
        y = torch.empty(m, n, dtype=torch.float32, device=dev)
        lib.pq2_matmul_q8_cuda(w, q, y.data_ptr(), 0, m, None, ws.data_ptr(), ws.numel(), stream)
    # The temporaries go back to torch's stream-ordered allocator: reuse waits for the kernels.
    return y


def main(argv=None) -> None:
    """A random folded weight: the error against the float product of the weights it holds."""
    import numpy as np
    import torch

    from pyq2 import formats, reference

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
