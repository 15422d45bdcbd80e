"""pq2_attention_decode_cuda's argument checks (pq2.h): every bad argument gets its own status
and a message naming the entry point, before the device is touched, so they run in a CUDA build
with or without a GPU (the pointers are aligned fakes, never dereferenced). A build without CUDA
answers PQ2_ERR_NO_CUDA. The kernel's results are tested on the GPU
(tests/runtime/test_mixer_kernels_gpu.py)."""

import pytest

from ..conftest import native_or_skip

FN = "pq2_attention_decode_cuda"


@pytest.fixture(scope="module")
def native():
    return native_or_skip()


def problem(ffi, lib, **changes):
    """A valid problem of fake, aligned pointers (27B-shaped: 24 query heads, 4 KV heads, head
    width 256), with `changes` applied."""
    a = ffi.new("pq2_attention_decode *")
    fake = 4096
    a.dtype = lib.PQ2_DTYPE_BF16
    a.q, a.k_cache, a.v_cache = (ffi.cast("void *", fake * i) for i in (1, 2, 3))
    a.positions = ffi.cast("int64_t *", fake * 4)
    a.m, a.l, a.acc = (ffi.cast("float *", fake * i) for i in (5, 6, 7))
    a.batch, a.n_head, a.n_head_kv, a.head_dim = 16, 24, 4, 256
    a.stride_b, a.stride_h, a.stride_s = 4 * 4096 * 256, 4096 * 256, 256
    a.n_chunks, a.chunks, a.chunk, a.scale = 32, 9, 256, 0.0625
    for name, value in changes.items():
        if name in ("q", "k_cache", "v_cache"):
            value = ffi.cast("void *", value)
        elif name == "positions":
            value = ffi.cast("int64_t *", value)
        elif name in ("m", "l", "acc"):
            value = ffi.cast("float *", value)
        setattr(a, name, value)
    return a


CASES = [
    # (changes, status, words the message must hold)
    (dict(q=0), "PQ2_ERR_NULL_POINTER", "q is NULL"),
    (dict(positions=0), "PQ2_ERR_NULL_POINTER", "positions is NULL"),
    (dict(acc=0), "PQ2_ERR_NULL_POINTER", "acc is NULL"),
    (dict(dtype=1), "PQ2_ERR_UNSUPPORTED", "bf16"),
    (dict(head_dim=48), "PQ2_ERR_UNSUPPORTED", "head_dim=48"),
    (dict(head_dim=512), "PQ2_ERR_UNSUPPORTED", "head_dim=512"),
    (dict(batch=0), "PQ2_ERR_SHAPE", "batch=0"),
    (dict(batch=65536), "PQ2_ERR_SHAPE", "batch=65536"),
    (dict(n_head_kv=0), "PQ2_ERR_SHAPE", "n_head_kv=0"),
    (dict(n_head=36, n_head_kv=4), "PQ2_ERR_SHAPE", "group 1..8"),  # group 9
    (dict(n_head=26), "PQ2_ERR_SHAPE", "n_head=26"),  # not a multiple of 4
    (dict(n_head=2), "PQ2_ERR_SHAPE", "n_head=2"),
    (dict(chunk=48), "PQ2_ERR_SHAPE", "chunk=48"),
    (dict(chunk=0), "PQ2_ERR_SHAPE", "chunk=0"),
    (dict(chunks=0), "PQ2_ERR_SHAPE", "chunks=0"),
    (dict(chunks=33), "PQ2_ERR_SHAPE", "n_chunks=32"),
    (dict(stride_s=260), "PQ2_ERR_SHAPE", "s=260"),  # not a multiple of 8
    (dict(stride_s=128), "PQ2_ERR_SHAPE", "s=128"),  # rows narrower than the head
    (dict(stride_s=1 << 23), "PQ2_ERR_SHAPE", "chunk * s"),  # offsets past 2^31 in a chunk
    (dict(stride_h=-8), "PQ2_ERR_SHAPE", "h=-8"),
    (dict(n_chunks=1 << 60, chunks=1), "PQ2_ERR_SHAPE", "overflows"),
    (dict(scale=float("inf")), "PQ2_ERR_INVALID_ARGUMENT", "scale=inf"),
    (dict(scale=float("nan")), "PQ2_ERR_INVALID_ARGUMENT", "scale=nan"),
    (dict(q=4096 + 8), "PQ2_ERR_ALIGNMENT", "q ="),
    (dict(v_cache=3 * 4096 + 2), "PQ2_ERR_ALIGNMENT", "v_cache ="),
    (dict(positions=4 * 4096 + 4), "PQ2_ERR_ALIGNMENT", "positions ="),
    (dict(l=6 * 4096 + 2), "PQ2_ERR_ALIGNMENT", "l ="),
]


@pytest.mark.parametrize("changes,status,words", CASES)
def test_bad_arguments_are_refused_before_the_device(native, changes, status, words):
    ffi, lib = native
    st = lib.pq2_attention_decode_cuda(problem(ffi, lib, **changes), ffi.NULL)
    name = ffi.string(lib.pq2_status_name(st)).decode()
    msg = ffi.string(lib.pq2_last_error()).decode()
    if not lib.pq2_built_with_cuda():
        assert name == "PQ2_ERR_NO_CUDA" and msg.startswith(FN), msg
        return
    assert name == status, msg
    assert msg.startswith(f"{FN}:") and words in msg, msg


def test_a_null_problem_is_refused(native):
    ffi, lib = native
    st = lib.pq2_attention_decode_cuda(ffi.NULL, ffi.NULL)
    expected = "PQ2_ERR_NULL_POINTER" if lib.pq2_built_with_cuda() else "PQ2_ERR_NO_CUDA"
    assert ffi.string(lib.pq2_status_name(st)).decode() == expected


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 128, 256, 512])
@pytest.mark.parametrize("group", [1, 6, 8, 9])
def test_attention_serves_agrees_with_the_checks(native, head_dim, group):
    """pyq2.lib.cuda.attention_serves, which routes a step to the kernel, says yes exactly where
    the entry point's checks accept the head width and group (a CUDA build). The scale is
    infinite, a check that comes after theirs: an accepted shape ends there, so nothing launches."""
    from pyq2.lib.cuda import attention_serves

    ffi, lib = native
    if not lib.pq2_built_with_cuda():
        pytest.skip("a build without CUDA answers PQ2_ERR_NO_CUDA before the checks")
    s = max(256, head_dim)
    a = problem(ffi, lib, head_dim=head_dim, n_head=4 * group, stride_s=s, stride_h=4096 * s,
                stride_b=4 * 4096 * s, scale=float("inf"))  # fmt: skip
    st = lib.pq2_attention_decode_cuda(a, ffi.NULL)
    name = ffi.string(lib.pq2_status_name(st)).decode()
    msg = ffi.string(lib.pq2_last_error()).decode()
    assert name in ("PQ2_ERR_INVALID_ARGUMENT", "PQ2_ERR_UNSUPPORTED", "PQ2_ERR_SHAPE"), msg
    assert attention_serves(head_dim, group) == (name == "PQ2_ERR_INVALID_ARGUMENT"), msg
