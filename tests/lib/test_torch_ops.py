"""pyq2.lib.torch_ops: the torch.library operators (namespace pq2) and PQ2Linear.

- Always: importing pyq2.lib.torch_ops without torch fails with the install hint (a child Python
  that cannot import torch, so this runs whether torch is installed or not), and importing pyq2
  and its CPU modules imports no torch.
- With torch (CPU is enough): the operators are registered with their schemas; their fake
  kernels give the shapes and dtypes of the real ones on meta tensors, also through
  torch.compile(fullgraph=True).
- With torch + CUDA + a CUDA build (marked gpu): every operator equals the pyq2.lib.cuda (cffi) call
  bit for bit and passes torch.library.opcheck; PQ2Linear equals the cffi path; under
  torch.compile(fullgraph=True) and in a replayed CUDA graph the results are the eager bits.
  m = 1, 5 (row-block family) and 40 (GEMM family, tiles only).
"""

import importlib
import subprocess
import sys
import zlib

import numpy as np
import pytest

from pyq2.lib import native as _native

from ..conftest import graph_capture, needs_gpu, optional_torch, random_pq2, subprocess_env

torch = optional_torch()
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

MS = [1, 5, 40]  # a bit-slice row, a row-block batch, a GEMM batch
N, K, BLOCK = 300, 1024, 256  # N not a whole number of tiles; K of 8 groups, 4 rotation blocks


def gpu_test(f):
    return pytest.mark.gpu(needs_gpu(f))


def rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@pytest.fixture
def ops(monkeypatch):
    """pyq2.lib.torch_ops; over a CPU-only libpq2 (no kernel-operand size query) the fake kernels
    get a stand-in size."""
    mod = importlib.import_module("pyq2.lib.torch_ops")
    if not (_native.available() and _native.load()[1].pq2_built_with_cuda()):
        monkeypatch.setattr(mod, "kernel_operand_bytes", lambda k: k // 128 * 16)
    return mod


# ---- without torch ---------------------------------------------------------------------------


def run_python(code):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env()
    )


def test_torch_ops_without_torch_names_the_install():
    r = run_python("import sys; sys.modules['torch'] = None; import pyq2.lib.torch_ops")
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "pip install torch" in r.stderr, r.stderr


def test_pyq2_imports_no_torch():
    r = run_python(
        "import sys, pyq2, pyq2.lib.cuda, pyq2.lib.cpu, pyq2.spec.layouts, pyq2.spec.reference; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    assert r.returncode == 0, r.stderr


# ---- with torch, on the CPU: registration and fake kernels ------------------------------------


@needs_torch
def test_operators_are_registered(ops):
    assert str(torch.ops.pq2.matmul.default._schema) == (
        "pq2::matmul(Tensor weights, int n, int k, int layout, int rt, Tensor x) -> Tensor"
    )
    for name, schema in ops.SCHEMAS.items():
        assert str(getattr(torch.ops.pq2, name).default._schema) == f"pq2::{name}{schema}"


def meta(*shape, dtype=None):
    return torch.empty(*shape, dtype=dtype or torch.float32, device="meta")


def check_q8(q, m, k, ko_bytes):
    assert [(tuple(t.shape), t.dtype) for t in q] == [
        ((m, k), torch.int8),
        ((m, k // 128), torch.float32),
        ((m, k // 128), torch.int32),
        ((ko_bytes,), torch.uint8),
    ]


@needs_torch
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fake_kernels_give_shapes_and_dtypes(ops, m, dtype):
    dt = getattr(torch, dtype)
    p = torch.ops.pq2
    w, x, signs = meta(4096, dtype=torch.uint8), meta(m, K, dtype=dt), meta(K, dtype=torch.int8)
    ko = ops.kernel_operand_bytes(K)
    y = p.matmul(w, N, K, 2, 2, x)
    assert (y.shape, y.dtype) == ((m, N), dt)
    q = p.rotate_q8(x, BLOCK, signs)
    check_q8(q, m, K, ko)
    check_q8(p.quantize_q8(x), m, K, ko)
    gu = meta(m, 2 * K, dtype=dt)
    check_q8(p.swiglu_rotate_q8(gu[:, :K], gu[:, K:], BLOCK, None), m, K, ko)
    *q2, h, normed = p.norm_rotate_q8(x, x, meta(K), 1e-6, BLOCK, signs, torch.float32)
    check_q8(q2, m, K, ko)
    assert (h.shape, h.dtype, normed.shape, normed.dtype) == ((m, K), dt, (m, K), torch.float32)
    *_, h, normed = p.norm_rotate_q8(x, None, meta(K), 1e-6, 0, None)
    assert (h.shape, normed.shape) == ((0, K), (0, K))
    y = p.matmul_q8(w, N, K, 2, 2, *q, torch.bfloat16)
    assert (y.shape, y.dtype) == ((m, N), torch.bfloat16)
    r = p.rotate(x, BLOCK, signs, True)
    assert (r.shape, r.dtype) == ((m, K), dt)
    rows = p.get_rows(w, N, K, 0, 0, meta(m, dtype=torch.int32), dt, BLOCK, signs)
    assert (rows.shape, rows.dtype) == ((m, K), dt)
    d = p.dequantize(w, N, K, 2, 2, dt)
    assert (d.shape, d.dtype) == ((N, K), dt)


@needs_torch
def test_compile_fullgraph_traces_on_meta(ops):
    """Dynamo and AOTAutograd trace PQ2Linear and a producer chain through the fake kernels,
    with static and dynamic shapes (no device needed: the meta tensors run the fakes)."""
    torch._dynamo.reset()  # each module instance compiles its own forward: a fresh count
    w, signs = meta(4096, dtype=torch.uint8), meta(K, dtype=torch.int8)
    lin = ops.PQ2Linear(w, N, K, rt=2, rotation_block=BLOCK, rotation_signs=signs)
    for dynamic in (False, True):
        f = torch.compile(lin, fullgraph=True, backend="aot_eager", dynamic=dynamic)
        for m in MS:
            y = f(meta(2, m, K, dtype=torch.bfloat16))
            assert (y.shape, y.dtype) == ((2, m, N), torch.bfloat16)

    def chain(x, res, norm_weight, gu):
        q, h, _ = ops.norm_rotate_q8(x, norm_weight, 1e-6, None, residual=res)
        y = torch.ops.pq2.matmul_q8(w, N, K, 2, 2, *q, torch.float32)
        return y, h, ops.swiglu_rotate_q8(gu[:, :K], gu[:, K:], None)

    f = torch.compile(chain, fullgraph=True, backend="aot_eager", dynamic=True)
    y, h, q = f(meta(3, K), meta(3, K), meta(K), meta(3, 2 * K))
    assert y.shape == (3, N) and h.shape == (3, K)
    check_q8(q, 3, K, ops.kernel_operand_bytes(K))


@needs_torch
def test_pq2linear_refuses_the_raw_layout(ops):
    with pytest.raises(ValueError, match="planes or tiles"):
        ops.PQ2Linear(meta(4096, dtype=torch.uint8), N, K, layout="raw")


# ---- on the GPU: bit for bit against pyq2.lib.cuda
# -------------------------------------------------


def assert_same(got, want):
    """Same shape, dtype and bits."""
    assert (tuple(got.shape), got.dtype) == (tuple(want.shape), want.dtype)
    assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def assert_q8_same(got, want):
    """got (four tensors) against a pyq2.lib.cuda Q8Operand: q8, scales, sums, and the part of the
    kernel operand the kernels use."""
    for g, w in zip(got[:3], want, strict=True):
        assert_same(g, w)
    if want.kernel_operand is not None:
        used = want.kernel_operand.numel()
        assert_same(got.kernel_operand[:used], want.kernel_operand)


def weights(layout="tiles", rt=2, n=N, k=K, seed=0):
    from pyq2.lib.cuda import PQ2Weights

    return PQ2Weights.from_host(random_pq2(rng("w", n, k, seed), n, k), n, k, layout, rt)


def rotation(width=K, block=BLOCK):
    from pyq2.lib.cuda import DeviceRotation

    s = rng("signs", width).choice(np.array([-1, 1], np.int8), width)
    return DeviceRotation(block, torch.from_numpy(s).cuda())


def randn(*shape, dtype="float32", key=()):
    x = torch.from_numpy(rng("x", shape, dtype, key).standard_normal(shape).astype(np.float32))
    return x.to(getattr(torch, dtype)).cuda()


@gpu_test
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout,rt", [("tiles", 2), ("tiles", 4), ("planes", 0)])
def test_matmul(ops, m, dtype, layout, rt):
    if layout == "planes" and m > 16:
        pytest.skip("the GEMM family reads the tiles layout only")
    w = weights(layout, rt)
    x = randn(m, K, dtype=dtype)
    assert_same(ops.matmul(w, x), w.matmul(x))
    # a view 4 bytes off 16-byte alignment is copied first, not refused
    buf = torch.empty(m * K + 2, dtype=x.dtype, device="cuda")
    odd = buf[1 : 1 + m * K].view(m, K)
    odd.copy_(x)
    assert odd.data_ptr() % 16 != 0
    assert_same(ops.matmul(w, odd), w.matmul(x))


@gpu_test
@pytest.mark.parametrize("m", MS)
def test_producers_and_matmul_q8(ops, m):
    from pyq2.lib import cuda as gpu

    w, rot = weights(), rotation()
    x = randn(m, K, dtype="bfloat16")
    x_before = x.clone()

    q = ops.quantize_q8(x)
    assert_q8_same(q, gpu.quantize_q8(x, kernel_operand=True))
    q = ops.rotate_q8(x, rot)
    want = gpu.rotate_q8(x, rot)
    assert_q8_same(q, want)
    y_want = w.matmul_q8(want, torch.empty(m, N, dtype=torch.bfloat16, device="cuda"))
    assert_same(ops.matmul_q8(w, q, torch.bfloat16), y_want)
    assert_same(ops.matmul_q8(w, q._replace(kernel_operand=None), torch.bfloat16), y_want)
    assert_q8_same(ops.rotate_q8(x, None), gpu.rotate_q8(x, None))

    xg = randn(m, 6144, key="gdn")  # the gdn_v_grouped permutation, 48 V heads over 16 K heads
    rg = rotation(6144, 1024)
    assert_q8_same(ops.rotate_q8(xg, rg, 48, 16), gpu.rotate_q8(xg, rg, 48, 16))

    gu = randn(m, 2 * K, key="gu")  # the halves of a fused gate_up output
    gate, up = gu[:, :K], gu[:, K:]
    assert_q8_same(ops.swiglu_rotate_q8(gate, up, rot), gpu.swiglu_rotate_q8(gate, up, rot))
    g2, u2 = gate.contiguous(), up.contiguous()  # two tensors of their own
    assert_q8_same(ops.swiglu_rotate_q8(g2, u2, rot), gpu.swiglu_rotate_q8(gate, up, rot))

    res, nw = randn(m, K, dtype="bfloat16", key="res"), randn(K, key="nw")
    q, h, normed = ops.norm_rotate_q8(x, nw, 1e-6, rot, residual=res, normed_dtype=torch.float32)
    h_want, normed_want = torch.empty_like(x), torch.empty(m, K, device="cuda")
    want = gpu.norm_rotate_q8(x, nw, 1e-6, rot, residual=res, h_out=h_want, normed=normed_want)
    assert_q8_same(q, want)
    assert_same(h, h_want)
    assert_same(normed, normed_want)
    q, h, normed = ops.norm_rotate_q8(x, nw, 1e-6, None)
    assert_q8_same(q, gpu.norm_rotate_q8(x, nw, 1e-6, None))
    assert h.shape == (0, K) and normed.shape == (0, K)
    assert_same(x, x_before)  # no operator writes its inputs


@gpu_test
def test_rotate_get_rows_dequantize(ops):
    from pyq2.lib import cuda as gpu

    rot = rotation()
    x = randn(5, K, dtype="float16")
    for inverse in (False, True):
        assert_same(ops.rotate(x, rot, inverse), gpu.rotate(x, rot, inverse))
    for layout, rt in (("raw", 0), ("planes", 0), ("tiles", 2)):
        w = weights(layout, rt)
        ids = torch.tensor([5, 0, N - 1, 5], dtype=torch.int32, device="cuda")
        assert_same(ops.get_rows(w, ids), w.get_rows(ids))
        got = ops.get_rows(w, ids.long(), torch.bfloat16, rot)
        assert_same(got, w.get_rows(ids, torch.bfloat16, rot))
        assert_same(ops.dequantize(w, torch.float16), w.dequantize(torch.float16))


PRODUCERS = ("quantize_q8", "rotate_q8", "swiglu_rotate_q8", "norm_rotate_q8")


@gpu_test
@pytest.mark.parametrize("m", MS)
def test_opcheck(ops, m):
    """torch.library.opcheck: schema (no input written), fake against real, autograd
    registration, AOT dispatch with dynamic shapes. The AOT check compares every output byte,
    so a producer gets it only at m = 1, where its kernel operand is all written (at other m the
    bytes past pq2_q8_kernel_operand_bytes(m, k) are unspecified)."""
    w, rot = weights(), rotation()
    wa = (w.data, N, K, 2, 2)
    x, gu = randn(m, K), randn(m, 2 * K, key="gu")
    q = tuple(ops.rotate_q8(x, rot))
    p = torch.ops.pq2
    cases = [
        (p.matmul, (*wa, x)),
        (p.matmul_q8, (*wa, *q, torch.float32)),
        (p.quantize_q8, (x,)),
        (p.rotate_q8, (x, BLOCK, rot.signs)),
        (p.swiglu_rotate_q8, (gu[:, :K], gu[:, K:], BLOCK, rot.signs)),
        (p.norm_rotate_q8, (x, x, randn(K, key="nw"), 1e-6, BLOCK, rot.signs, torch.bfloat16)),
        (p.rotate, (x, BLOCK, rot.signs, True)),
        (p.get_rows, (*wa, torch.tensor([3, 1], dtype=torch.int32, device="cuda"), torch.float32)),
        (p.dequantize, (*wa, torch.bfloat16)),
    ]
    partial = ("test_schema", "test_autograd_registration", "test_faketensor")
    for op, args in cases:
        if m > 1 and op._qualified_op_name.split("::")[1] in PRODUCERS:
            torch.library.opcheck(op, args, test_utils=partial)
        else:
            torch.library.opcheck(op, args)


def cffi_linear(w, x, rot):
    """PQ2Linear's result through pyq2.lib.cuda: the plain matmul, or rotate_q8 then matmul_q8."""
    from pyq2.lib import cuda as gpu

    x2 = x.reshape(-1, w.k)
    if rot is None:
        y = w.matmul(x2)
    else:
        y = torch.empty(x2.shape[0], w.n, dtype=x.dtype, device="cuda")
        w.matmul_q8(gpu.rotate_q8(x2, rot), y)
    return y.reshape(*x.shape[:-1], w.n)


@gpu_test
@pytest.mark.parametrize("rotated", [False, True], ids=["plain", "rotated"])
def test_pq2linear_equals_the_cffi_path(ops, rotated):
    w, rot = weights(), rotation() if rotated else None
    lin = ops.PQ2Linear.from_weights(w, rot)
    for shape in [(m, K) for m in MS] + [(2, 3, K), (1, 1, 40, K)]:
        for dtype in ("float32", "bfloat16"):
            x = randn(*shape, dtype=dtype)
            assert_same(lin(x), cffi_linear(w, x, rot))


def producer_chain(ops, w, rot):
    """A layer's weight path: norm + rotate -> matmul, then swiglu + rotate -> matmul."""

    def f(x, res, norm_weight):
        q, h, _ = ops.norm_rotate_q8(x, norm_weight, 1e-6, rot, residual=res)
        gu = torch.ops.pq2.matmul_q8(w.data, w.n, w.k, 2, 2, *q, x.dtype)
        half = w.n // 2
        q2 = ops.swiglu_rotate_q8(gu[:, :half], gu[:, half:], None)
        return h, gu, q2.scales

    return f


@gpu_test
@pytest.mark.parametrize("m", MS)
def test_torch_compile_gives_the_eager_bits(ops, m):
    torch._dynamo.reset()  # each module instance compiles its own forward: a fresh count
    w, rot = weights(), rotation()
    x = randn(m, K, dtype="bfloat16")
    for lin in (ops.PQ2Linear.from_weights(w), ops.PQ2Linear.from_weights(w, rot)):
        assert_same(torch.compile(lin, fullgraph=True)(x), lin(x))
    wg = weights(n=512, k=K)
    f = producer_chain(ops, wg, rot)
    args = (x, randn(m, K, dtype="bfloat16", key="res"), randn(K, key="nw"))
    for got, want in zip(torch.compile(f, fullgraph=True)(*args), f(*args), strict=True):
        assert_same(got, want)


@gpu_test
@pytest.mark.parametrize("m", MS)
def test_cuda_graph_replay_gives_the_eager_bits(ops, m):
    """Captured once, replayed on new input data: the bits of eager calls on that data (the
    operators allocate their outputs and workspaces from the graph's pool during capture)."""
    w, rot = weights(), rotation()
    wg = weights(n=512, k=K)
    lin = ops.PQ2Linear.from_weights(w, rot)
    plain = ops.PQ2Linear.from_weights(w)
    chain = producer_chain(ops, wg, rot)

    def step(x, res, nw):
        return (lin(x), plain(x), *chain(x, res, nw))

    static = [randn(m, K, dtype="bfloat16"), randn(m, K, dtype="bfloat16", key=1), randn(K)]
    g, outs = graph_capture(step, static)
    for trial in range(2):
        new = [randn(m, K, dtype="bfloat16", key=("new", trial)), randn(m, K, dtype="bfloat16")]
        new.append(randn(K, key=("nw", trial)))
        for s, v in zip(static, new, strict=True):
            s.copy_(v)
        g.replay()
        for got, want in zip(outs, step(*new), strict=True):
            assert_same(got, want)
