"""The C ABI's pointer and size rules (pq2.h, the file comment): a pointer to numbers (float *,
int32_t *, size_t *) that is not aligned for its type is refused with PQ2_ERR_ALIGNMENT, naming
the entry point and the argument, before any buffer is read or written; a size query whose
answer would overflow refuses it (PQ2_ERR_SHAPE) rather than answering 0.

Each misaligned pointer points one byte into a buffer poisoned beforehand; the buffers of the
call are compared with their poisoned copies afterwards. The CUDA entry points' checks that come
before the device (so they run in a CUDA build with or without a GPU) are tested in a CUDA build
only: a build without CUDA answers PQ2_ERR_NO_CUDA before looking at its arguments.
"""

import numpy as np
import pytest

from ..conftest import fake_q8, native_or_skip

POISON = 0xA5
N, K, M = 4, 256, 2


@pytest.fixture(scope="module")
def native():
    return native_or_skip()


@pytest.fixture(scope="module")
def cuda_build(native):
    ffi, lib = native
    if not lib.pq2_built_with_cuda():
        pytest.skip("a build without CUDA answers PQ2_ERR_NO_CUDA first")
    return native


class Buffer:
    """A poisoned host buffer of `nbytes` bytes (with slack on both sides) and a pointer of
    `ctype` into it, at a 64-byte boundary plus `offset` (1: misaligned for any type wider than
    a byte)."""

    def __init__(self, ffi, nbytes, ctype, offset=0):
        self.raw = np.full(nbytes + 128, POISON, np.uint8)
        self.start = (-self.raw.ctypes.data) % 64 + offset
        cbuf = ffi.from_buffer("uint8_t[]", self.raw, require_writable=True)
        self.ptr = ffi.cast(ctype, cbuf + self.start)
        self.nbytes = nbytes
        self.before = self.raw.copy()

    def fill(self, values):
        """Writes `values` (bytes) at the pointer and makes that the state to compare with."""
        self.raw[self.start : self.start + len(values)] = np.frombuffer(values, np.uint8)
        self.before = self.raw.copy()

    def untouched(self):
        return np.array_equal(self.raw, self.before)


def check_refused(native, status, fn, arg, align):
    ffi, lib = native
    name = ffi.string(lib.pq2_status_name(status)).decode()
    msg = ffi.string(lib.pq2_last_error()).decode()
    assert name == "PQ2_ERR_ALIGNMENT", (fn, arg, name, msg)
    assert msg.startswith(f"{fn}: {arg} = ") and f"not {align}-byte aligned" in msg, msg


def weights(native, data):
    """A valid raw PQ2_0 matrix N x K over the host buffer `data` (a Buffer, aligned)."""
    ffi, lib = native
    rng = np.random.default_rng(38)
    raw = np.zeros((N * K // 128, 34), np.uint8)
    raw[:, :32] = rng.integers(0, 256, (len(raw), 32), dtype=np.uint8)
    raw[:, 32:] = np.frombuffer(np.full(len(raw), 0.5, np.float16).tobytes(), np.uint8).reshape(
        -1, 2
    )
    data.fill(raw.tobytes())
    w = ffi.new("pq2_weights *")
    w.data, w.bytes, w.n, w.k, w.layout, w.rt = data.ptr, raw.size, N, K, lib.PQ2_LAYOUT_RAW, 0
    return w


def activations(data):
    x = np.random.default_rng(7).standard_normal((M, K)).astype(np.float32)
    data.fill(x.tobytes())


# ---- host entry points ---------------------------------------------------------------------


def test_layout_bytes_misaligned_result(native):
    ffi, lib = native
    out = Buffer(ffi, 8, "size_t *", offset=1)
    st = lib.pq2_layout_bytes(lib.PQ2_LAYOUT_RAW, N, K, 0, out.ptr)
    check_refused(native, st, "pq2_layout_bytes", "bytes", ffi.alignof("size_t"))
    assert out.untouched()
    ok = Buffer(ffi, 8, "size_t *")
    assert lib.pq2_layout_bytes(lib.PQ2_LAYOUT_RAW, N, K, 0, ok.ptr) == lib.PQ2_OK
    assert ok.ptr[0] == N * K // 128 * 34


def test_dequantize_host_misaligned_out(native):
    ffi, lib = native
    data = Buffer(ffi, N * K // 128 * 34, "void *")
    w = weights(native, data)
    out = Buffer(ffi, N * K * 4, "float *", offset=1)
    st = lib.pq2_dequantize_host(w, out.ptr, N * K * 4)
    check_refused(native, st, "pq2_dequantize_host", "out", 4)
    assert out.untouched() and data.untouched()
    ok = Buffer(ffi, N * K * 4, "float *")
    assert lib.pq2_dequantize_host(w, ok.ptr, N * K * 4) == lib.PQ2_OK
    assert not ok.untouched()


@pytest.mark.parametrize("arg", ["x", "scales", "sums"])
def test_quantize_q8_host_misaligned(native, arg):
    ffi, lib = native
    groups = M * K // 128
    x = Buffer(ffi, M * K * 4, "float *", offset=1 if arg == "x" else 0)
    activations(x)
    q8 = Buffer(ffi, M * K, "int8_t *")
    scales = Buffer(ffi, groups * 4, "float *", offset=1 if arg == "scales" else 0)
    sums = Buffer(ffi, groups * 4, "int32_t *", offset=1 if arg == "sums" else 0)
    st = lib.pq2_quantize_q8_host(
        x.ptr, x.nbytes, M, K, q8.ptr, q8.nbytes, scales.ptr, scales.nbytes, sums.ptr, sums.nbytes
    )
    check_refused(native, st, "pq2_quantize_q8_host", arg, 4)
    assert all(b.untouched() for b in (x, q8, scales, sums))


def test_quantize_q8_host_takes_any_q8_address(native):
    """q8 is int8_t: any address is aligned for it."""
    ffi, lib = native
    groups = M * K // 128
    x = Buffer(ffi, M * K * 4, "float *")
    activations(x)
    q8 = Buffer(ffi, M * K, "int8_t *", offset=1)
    scales, sums = Buffer(ffi, groups * 4, "float *"), Buffer(ffi, groups * 4, "int32_t *")
    st = lib.pq2_quantize_q8_host(
        x.ptr, x.nbytes, M, K, q8.ptr, q8.nbytes, scales.ptr, scales.nbytes, sums.ptr, sums.nbytes
    )
    assert st == lib.PQ2_OK
    assert not q8.untouched() and not scales.untouched()


@pytest.mark.parametrize("arg", ["x", "y"])
def test_matmul_host_misaligned(native, arg):
    ffi, lib = native
    data = Buffer(ffi, N * K // 128 * 34, "void *")
    w = weights(native, data)
    x = Buffer(ffi, M * K * 4, "float *", offset=1 if arg == "x" else 0)
    activations(x)
    y = Buffer(ffi, M * N * 4, "float *", offset=1 if arg == "y" else 0)
    st = lib.pq2_matmul_host(w, x.ptr, x.nbytes, M, y.ptr, y.nbytes)
    check_refused(native, st, "pq2_matmul_host", arg, 4)
    assert x.untouched() and y.untouched() and data.untouched()
    y = Buffer(ffi, M * N * 4, "float *")
    x = Buffer(ffi, M * K * 4, "float *")
    activations(x)
    assert lib.pq2_matmul_host(w, x.ptr, x.nbytes, M, y.ptr, y.nbytes) == lib.PQ2_OK
    assert not y.untouched()


def test_every_offset_below_the_alignment_is_refused(native):
    ffi, lib = native
    data = Buffer(ffi, N * K // 128 * 34, "void *")
    w = weights(native, data)
    for offset in (1, 2, 3):
        out = Buffer(ffi, N * K * 4, "float *", offset=offset)
        st = lib.pq2_dequantize_host(w, out.ptr, N * K * 4)
        check_refused(native, st, "pq2_dequantize_host", "out", 4)
        assert out.untouched()


# ---- the size queries of the CUDA half (checked before the device) ------------------------


def test_q8_kernel_operand_bytes_refuses_an_overflowing_k(cuda_build):
    ffi, lib = cuda_build
    out = Buffer(ffi, 8, "size_t *")
    # m = 1: k / 128 groups of 512 bytes of bit slices; k = 2^62 needs 2^64 bytes, which wrapped
    # to 0. m = 9: no kernel operand, but the operand's q8 (m * k bytes) cannot exist either.
    for m, k in ((1, 1 << 62), (1, (1 << 63) - 128), (2, (1 << 63) - 128), (9, 1 << 62)):
        st = lib.pq2_q8_kernel_operand_bytes(m, k, out.ptr)
        msg = ffi.string(lib.pq2_last_error()).decode()
        assert st == lib.PQ2_ERR_SHAPE, (m, k, ffi.string(lib.pq2_status_name(st)))
        assert msg.startswith("pq2_q8_kernel_operand_bytes:") and str(k) in msg, msg
        assert "too large" in msg and out.untouched(), msg
    # The largest k the bit slices of m = 1 fit (groups * 512 <= 2^63 - 1) is still answered.
    k = ((1 << 63) - 1) // 512 * 128
    assert lib.pq2_q8_kernel_operand_bytes(1, k, out.ptr) == lib.PQ2_OK
    assert out.ptr[0] == k // 128 * 512
    for m, k, want in ((1, 1024, 8 * 512), (8, 1024, 8 * 64), (9, 1024, 0)):
        assert lib.pq2_q8_kernel_operand_bytes(m, k, out.ptr) == lib.PQ2_OK
        assert out.ptr[0] == want, (m, k)


def test_q8_operand_of_an_overflowing_shape_is_refused(cuda_build):
    """A writer of a Q8 operand checks its size as the query does, before the device."""
    ffi, lib = cuda_build
    fake = ffi.cast("void *", 256)  # never dereferenced
    q = fake_q8(ffi)
    st = lib.pq2_quantize_q8_cuda(fake, lib.PQ2_DTYPE_F32, 9, 1 << 62, q, ffi.NULL)
    msg = ffi.string(lib.pq2_last_error()).decode()
    assert st == lib.PQ2_ERR_SHAPE and msg.startswith("pq2_quantize_q8_cuda:"), msg
    assert "too large" in msg, msg


def test_q8_kernel_operand_bytes_misaligned_result(cuda_build):
    ffi, lib = cuda_build
    out = Buffer(ffi, 8, "size_t *", offset=1)
    st = lib.pq2_q8_kernel_operand_bytes(1, 1024, out.ptr)
    check_refused(cuda_build, st, "pq2_q8_kernel_operand_bytes", "bytes", ffi.alignof("size_t"))
    assert out.untouched()


def test_matmul_workspace_size_misaligned_result(cuda_build):
    ffi, lib = cuda_build
    w = ffi.new("pq2_weights *")
    w.data, w.n, w.k, w.layout, w.rt = ffi.cast("void *", 256), 64, 1024, lib.PQ2_LAYOUT_TILES, 2
    size = ffi.new("size_t *")
    assert lib.pq2_layout_bytes(w.layout, w.n, w.k, w.rt, size) == lib.PQ2_OK
    w.bytes = size[0]
    out = Buffer(ffi, 8, "size_t *", offset=1)
    st = lib.pq2_matmul_workspace_size(w, 1, ffi.NULL, out.ptr)
    check_refused(cuda_build, st, "pq2_matmul_workspace_size", "bytes", ffi.alignof("size_t"))
    assert out.untouched()
