"""The rest of the weight path on the GPU against numpy: the Hadamard rotation, the fused
producers of the Q8 operand, rows of a matrix with the inverse rotation, dequantisation, and the
folding contract end to end (rotate, then the PQ2 matmul, equals the unfolded float weights).

Exact where the operation is exact: the producers' Q8 equals numpy's Q8 of the GPU's own rotated
fp32 values bit for bit (the same device code rotates both), the permutation and dequantisation
are exact, the kernel operand a producer writes gives the matmul the same bits as the one the
matmul makes itself. Named tolerances elsewhere (relative RMS against float64):
  ROT_TOL[f32] = 2e-6   fp32 butterflies: log2(B) roundings of 2^-24
  ROT_TOL[f16] = 2^-11, ROT_TOL[bf16] = 2^-8   the output dtype's unit roundoff
  FOLD_TOL = 1e-2       Q8 of the rotated activations against the unquantised product (the Q8
                        path's bound; observed ~5e-3)
"""

import zlib

import numpy as np
import pytest

from ..conftest import f64, gpu_module

torch = gpu_module()

from pyq2.errors import Pq2Error  # noqa: E402
from pyq2.gguf import io as gguf_io  # noqa: E402
from pyq2.lib import native as _native  # noqa: E402
from pyq2.lib.cuda import (  # noqa: E402
    DeviceRotation,
    PQ2Weights,
    Q8Operand,
    gated_norm_rotate_q8,
    norm_rotate_q8,
    quantize_q8,
    rotate,
    rotate_q8,
    swiglu_rotate_q8,
)
from pyq2.spec import formats, reference  # noqa: E402
from pyq2.spec.rotation import Rotation  # noqa: E402

_ffi, _lib = _native.load()

pytestmark = pytest.mark.gpu

ROT_TOL = {torch.float32: 2e-6, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
FOLD_TOL = 1e-2
BLOCKS = [64, 128, 256, 512, 1024, 2048, 4096]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def signs_of(width, *key):
    return rng("signs", width, *key).choice(np.array([-1, 1], np.int8), width)


def device_rotation(block, signs):
    return DeviceRotation(block, None if signs is None else torch.from_numpy(signs).cuda())


def widths_for(block):
    unit = max(block, 128)
    return [unit, 3 * unit]


def rel_rms(y, ref):
    y = np.asarray(y, dtype=np.float64)
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.sqrt(np.sum((y - ref) ** 2) / max(np.sum(ref**2), 1e-300)))


def poisoned(m, k, kernel_operand=True):
    """A Q8 operand whose every byte is garbage (NaN scales), so an unwritten part shows."""
    out = Q8Operand.empty(m, k, kernel_operand=kernel_operand)
    out.q8.fill_(-128)
    out.scales.fill_(float("nan"))
    out.sums.fill_(-(2**31))
    if out.kernel_operand is not None:
        out.kernel_operand.fill_(0xAB)
    return out


def assert_q8_equal(got, want_f32):
    """got (a Q8Operand) equals numpy's Q8 of the fp32 values want_f32 [m, k], bit for bit."""
    rq, rs, rsum = reference.quantize_q8(np.ascontiguousarray(want_f32, dtype=np.float32))
    assert np.array_equal(got.q8.cpu().numpy(), rq), "q8 differs"
    assert np.array_equal(got.scales.cpu().numpy().view(np.uint32), rs.view(np.uint32)), "scales"
    assert np.array_equal(got.sums.cpu().numpy(), rsum), "sums differ"


# ---- rotate ------------------------------------------------------------------------------


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_rotate_every_block(block, inverse):
    for width in widths_for(block):
        for m, dtype in ((1, torch.float32), (3, torch.bfloat16), (17, torch.float16)):
            x = torch.from_numpy(rng("x", block, width, m).standard_normal((m, width))).to(dtype)
            s = signs_of(width, block)
            y = torch.full((m, width), float("nan"), dtype=dtype, device="cuda")
            rotate(x.cuda(), device_rotation(block, s), inverse, out=y)
            ref = reference.rotate(f64(x), block, s, inverse)
            err = rel_rms(f64(y), ref)
            assert err <= ROT_TOL[dtype], f"B={block} width={width} m={m}: rel RMS {err:.3g}"


def test_rotate_in_place_identity_signs_and_round_trip():
    x = torch.from_numpy(rng("ip").standard_normal((5, 3072))).float().cuda()
    rot = DeviceRotation(1024, None)
    want = reference.rotate(f64(x), 1024)
    y = x.clone()
    rotate(y, rot, out=y)
    assert rel_rms(f64(y), want) <= ROT_TOL[torch.float32]
    back = rotate(y, rot, inverse=True)  # H is its own inverse: signs all +1
    assert rel_rms(f64(back), f64(x)) <= 2 * ROT_TOL[torch.float32]


def test_rotate_matches_the_explicit_sylvester_matrix():
    for block in (64, 128, 256):
        width = max(block, 128)  # widths are multiples of 128: two blocks of 64
        x = torch.from_numpy(rng("syl", block).standard_normal((2, width))).float().cuda()
        h = np.kron(np.eye(width // block), reference.sylvester(block) / np.sqrt(block))
        y = rotate(x, DeviceRotation(block, None))
        assert rel_rms(f64(y), f64(x) @ h.T) <= ROT_TOL[torch.float32]


# ---- producers -----------------------------------------------------------------------------


# m = 100 and 300: grids of 500 blocks and more of 256 threads at widths 5120 and 17408, past what
# the device holds at once (rotate.cu then keeps 2 RMSNorm loads in flight, not 8); at m = 300
# the rows of 5120 take a block per row on a device of at most 150 SMs
@pytest.mark.parametrize("m", [1, 2, 5, 9, 16, 33, 100, 300])
@pytest.mark.parametrize("block,width", [(1024, 5120), (128, 768), (4096, 4096), (1024, 17408)])
def test_norm_rotate_q8_is_q8_of_the_rotated_normed_values(m, block, width):
    """The producer's Q8 (kernel operand included) is numpy's Q8 of rotate(normed) where normed
    is the producer's own un-rotated output, rotated by pq2_rotate_cuda: bit for bit. normed is
    RMSNorm(x + residual) * weight within fp32 rounding, h = x + residual exactly (f32)."""
    r = rng("norm", m, block, width)
    x = torch.from_numpy(r.standard_normal((m, width))).float().cuda()
    res = torch.from_numpy(r.standard_normal((m, width))).float().cuda()
    w = torch.from_numpy(1 + 0.1 * r.standard_normal(width)).float().cuda()
    s = signs_of(width, "norm")
    rot = device_rotation(block, s)
    h = torch.full_like(x, float("nan"))
    normed = torch.full_like(x, float("nan"))
    out = norm_rotate_q8(
        x, w, 1e-6, rot, residual=res, h_out=h, normed=normed, out=poisoned(m, width)
    )
    assert torch.equal(h, x + res)
    ref = reference.rmsnorm(f64(x) + f64(res), f64(w), 1e-6)
    assert rel_rms(f64(normed), ref) <= 1e-6
    assert_q8_equal(out, rotate(normed, rot).cpu().numpy())
    # the kernel operand: the matmul given it equals the matmul that makes its own
    wt = PQ2Weights.from_host(formats.pq2_quantize(r.standard_normal((300, width))), 300, width)
    y1 = torch.full((m, 300), float("nan"), device="cuda")
    y2 = torch.full((m, 300), float("nan"), device="cuda")
    wt.matmul_q8(out, y1)
    wt.matmul_q8(Q8Operand(out.q8, out.scales, out.sums, None, m, width), y2)
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_without_residual_or_rotation(dtype):
    """rot NULL: the Q8 of the normed values as pq2_quantize_q8_cuda writes it; no residual:
    h = x; bf16/f16 inputs and weights."""
    m, width = 3, 640
    r = rng("plain-norm", str(dtype))
    x = torch.from_numpy(r.standard_normal((m, width))).to(dtype).cuda()
    w = torch.from_numpy(1 + 0.1 * r.standard_normal(width)).to(dtype).cuda()
    normed = torch.empty(m, width, dtype=torch.float32, device="cuda")
    out = norm_rotate_q8(x, w, 1e-5, None, normed=normed, out=poisoned(m, width))
    assert_q8_equal(out, normed.cpu().numpy())
    assert rel_rms(f64(normed), reference.rmsnorm(f64(x), f64(w), 1e-5)) <= 1e-6


@pytest.mark.parametrize("m", [1, 4, 16, 40, 300])
def test_swiglu_rotate_q8(m):
    """gate and up as the two halves of a fused gate_up output (row stride 2 * width)."""
    width, block = 17408, 1024
    r = rng("swiglu", m)
    gu = torch.from_numpy(r.standard_normal((m, 2 * width))).float().cuda()
    gate, up = gu[:, :width], gu[:, width:]
    s = signs_of(width, "swiglu")
    out = swiglu_rotate_q8(gate, up, device_rotation(block, s), out=poisoned(m, width))
    ref = reference.rotate(reference.swiglu(f64(gate), f64(up)), block, s)
    q8, xs, sums = reference.quantize_q8(ref.astype(np.float32))
    # q8 may differ by one step where fp32 and float64 round to either side of a half-integer
    got = out.q8.cpu().numpy().astype(np.int32)
    assert np.abs(got - q8).max() <= 1 and np.mean(got != q8) < 1e-3
    assert np.allclose(out.scales.cpu().numpy(), xs, rtol=1e-5)


@pytest.mark.parametrize("m", [1, 3, 16, 800])
def test_rotate_q8_with_the_gdn_permutation(m):
    """Permuted exactly (numpy does the permutation, the GPU rotates: the same Q8 bits)."""
    width, block, nv, nk = 6144, 1024, 48, 16
    x = torch.from_numpy(rng("gdn", m).standard_normal((m, width))).float().cuda()
    s = signs_of(width, "gdn")
    rot = device_rotation(block, s)
    out = rotate_q8(x, rot, nv, nk, out=poisoned(m, width))
    permuted = torch.from_numpy(reference.gdn_v_grouped(x.cpu().numpy(), nv, nk)).cuda()
    assert_q8_equal(out, rotate(permuted, rot).cpu().numpy())
    plain = rotate_q8(x, None, out=poisoned(m, width))  # no permutation, no rotation
    q = quantize_q8(x)
    assert torch.equal(plain.q8, q.q8) and torch.equal(plain.scales, q.scales)


GATED_SHAPES = [  # (width, v_heads, k_heads, block): 27B's heads; heads of 64, 4, 8 and 16
    (6144, 48, 16, 1024),  # elements; one head; heads of 32 in 1024-thread blocks (B 4096)
    (768, 12, 4, 256),
    (512, 128, 32, 128),
    (256, 32, 8, 256),
    (1024, 64, 16, 1024),
    (128, 1, 1, 64),
    (4096, 128, 64, 4096),
]


@pytest.mark.parametrize("m", [1, 3, 300])
@pytest.mark.parametrize("shape", GATED_SHAPES)
@pytest.mark.parametrize("z_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("permute", [True, False])
def test_gated_norm_rotate_q8(m, shape, z_dtype, permute):
    """The gated RMSNorm per V head (o float32, z a column range of a wider output: ld_z >
    width), permuted or not: within one Q8 step of numpy's float64 (fp32 and float64 round the
    norm to either side of a half-integer), scales within fp32 noise."""
    width, nv, nk, block = shape
    r = rng("gated", m, width, permute)
    o = torch.from_numpy(r.standard_normal((m, width)) * 3).float().cuda()
    zz = torch.from_numpy(r.standard_normal((m, width + 64))).to(z_dtype).cuda()
    z = zz[:, 32 : 32 + width]
    hd = width // nv
    w = torch.from_numpy(1 + 0.2 * r.standard_normal(hd)).to(z_dtype).cuda()  # bf16 too
    s = signs_of(width, "gated")
    out = gated_norm_rotate_q8(o, z, w, 1e-6, device_rotation(block, s), nv, nk if permute else 0,
                               out=poisoned(m, width))  # fmt: skip
    y = reference.gated_rmsnorm(f64(o), f64(z), f64(w), 1e-6, nv)
    if permute:
        y = reference.gdn_v_grouped(y, nv, nk)
    ref = reference.rotate(y, block, s)
    q8, xs, _ = reference.quantize_q8(ref.astype(np.float32))
    got = out.q8.cpu().numpy().astype(np.int32)
    assert np.abs(got - q8).max() <= 1 and (got != q8).sum() <= max(1, got.size // 1000)
    assert np.allclose(out.scales.cpu().numpy(), xs, rtol=1e-5)


# The RMSNorm a block per row (rotate.cu norm_by_rows: rows of 2 to 8 tiles of 1024, at least two
# rows per SM) against the same rows as a grid of 17 (a block per tile): input dtypes, with and
# without the residual and the dense outputs, each cross-warp Hadamard (B 256, 512, 1024) and none.
NORM_ROWS = [
    (torch.float32, 5120, 1024, True, True),
    (torch.bfloat16, 5120, 256, True, False),
    (torch.float16, 8192, 512, False, True),
    (torch.float32, 2048, None, True, True),
]


@pytest.mark.parametrize(
    "dtype,width,block,residual,outputs", NORM_ROWS, ids=lambda v: str(v).replace("torch.", "")
)
def test_norm_by_rows_gives_the_tile_kernels_bits(dtype, width, block, residual, outputs):
    """Rows of a large grid equal the same rows as a grid of 17, bit for bit: the Q8 operand
    and h and the normed values where asked for."""
    m = 2 * torch.cuda.get_device_properties(0).multi_processor_count + 37
    r = rng("norm-rows", str(dtype), width, block)
    x = torch.from_numpy(r.standard_normal((m, width))).to(dtype).cuda()
    res = torch.from_numpy(r.standard_normal((m, width))).to(dtype).cuda() if residual else None
    w = torch.from_numpy(1 + 0.1 * r.standard_normal(width)).to(dtype).cuda()
    rot = device_rotation(block, signs_of(width, "norm")) if block else None

    def run(rows):
        n = rows.stop - rows.start
        h = torch.full((n, width), float("nan"), dtype=dtype, device="cuda") if outputs else None
        normed = torch.full((n, width), float("nan"), device="cuda") if outputs else None
        out = norm_rotate_q8(
            x[rows].contiguous(),
            w,
            1e-6,
            rot,
            residual=res[rows].contiguous() if residual else None,
            h_out=h,
            normed=normed,
            out=poisoned(n, width),
        )
        return out, [t for t in (h, normed) if t is not None]

    big, big_dense = run(slice(0, m))
    for part in (slice(0, 17), slice(m - 17, m)):
        small, small_dense = run(part)
        assert torch.equal(big.q8[part], small.q8)
        assert torch.equal(big.scales[part].view(torch.int32), small.scales.view(torch.int32))
        assert torch.equal(big.sums[part], small.sums)
        for got, want in zip(big_dense, small_dense, strict=True):
            assert torch.equal(got[part], want)


# ---- rows and dequantisation ----------------------------------------------------------------


@pytest.mark.parametrize("layout,rt", [("raw", 0), ("planes", 0), ("tiles", 2), ("tiles", 4)])
def test_get_rows_and_dequantize(layout, rt):
    n, k, block = 1000, 1024, 512
    r = rng("rows", layout)
    raw = formats.pq2_quantize(r.standard_normal((n, k)))
    w = PQ2Weights.from_host(raw, n, k, layout, rt)
    dense = formats.pq2_dequantize(raw, n, k)
    got = w.dequantize()
    assert np.array_equal(got.cpu().numpy(), dense)
    assert torch.equal(w.dequantize(torch.float16), got.half())
    ids = torch.tensor([5, 0, 999, 5, -1, 1000], dtype=torch.int32, device="cuda")
    rows = w.get_rows(ids)
    assert np.array_equal(rows[:4].cpu().numpy(), dense[[5, 0, 999, 5]])
    assert torch.isnan(rows[4:]).all()  # ids outside the matrix give NaN rows
    s = signs_of(k, "rows")
    inv = w.get_rows(ids[:4], rotation=device_rotation(block, s))
    ref = reference.rotate(dense[[5, 0, 999, 5]], block, s, inverse=True)
    assert rel_rms(f64(inv), ref) <= ROT_TOL[torch.float32]


@pytest.mark.parametrize("layout,rt", [("raw", 0), ("planes", 0), ("tiles", 1), ("tiles", 4)])
@pytest.mark.parametrize("n,k", [(37, 128), (65, 2176), (3, 4224)])
def test_dequantize_every_dtype(layout, rt, n, k):
    # every code (3 included), fp16 scales of every magnitude (f16 overflows to inf past 32752 at
    # code 3, bf16 rounds to nearest even); k below, off and above the kernel's 2048-element
    # chunks; rows off every tile height; the output poisoned, with a poisoned guard band after it
    r = rng("dequantize", layout, n, k)
    codes = r.integers(0, 4, (n * k // 128, 128), dtype=np.uint8)
    d = (2.0 ** r.uniform(-14, 15.9, n * k // 128)).astype(np.float16) * r.choice(
        [-1, 1], n * k // 128
    )
    raw = formats.pq2_pack(codes, d)
    w = PQ2Weights.from_host(raw.reshape(-1), n, k, layout, rt)
    dense = torch.from_numpy(formats.pq2_dequantize(raw.reshape(-1), n, k))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        buf = torch.full((n * k + 64,), float("nan"), dtype=dtype, device="cuda")
        got = w.dequantize(out=buf[: n * k].view(n, k))
        assert torch.equal(got.cpu().view(bits), dense.to(dtype).view(bits)), dtype
        assert torch.isnan(buf[n * k :]).all()


# ---- folding: rotate, then the PQ2 matmul, equals the unfolded weights ---------------------


def check_fold(raw, n, k, block, signs, xs):
    """y = PQ2(W') . Q8(rotate(x)) against x . W^T with W = unfold(dequant(W'))."""
    w_unfolded = reference.unfold(formats.pq2_dequantize(raw, n, k), block, signs)
    wt = PQ2Weights.from_host(raw, n, k, "tiles", 2)
    rot = device_rotation(block, signs)
    for x in xs:
        m = x.shape[0]
        y = torch.full((m, n), float("nan"), device="cuda")
        wt.matmul_q8(rotate_q8(x, rot), y)
        err = rel_rms(f64(y), f64(x) @ w_unfolded.T)
        assert err <= FOLD_TOL, f"m={m}: rel RMS {err:.3g}"


def test_folded_random_matrices():
    for n, k, block in ((512, 5120, 1024), (300, 768, 128), (257, 4096, 4096)):
        r = rng("fold", n, k)
        s = signs_of(k, "fold", block)
        raw = formats.pq2_quantize(reference.fold(r.standard_normal((n, k)), block, s))
        xs = [torch.from_numpy(r.standard_normal((m, k))).float().cuda() for m in (1, 2, 7, 16)]
        check_fold(raw, n, k, block, s, xs)


def test_demo_model_is_folded(tmp_path):
    """Every folded weight of the demo model reads rotated activations; the embedding row
    lookup with the inverse gives the unfolded rows."""
    from pyq2.offline.demo import write_demo_model

    path = write_demo_model(tmp_path / "demo.gguf")
    with gguf_io.open_gguf(path) as gf:
        widths = {t.name: t.ne[0] for t in gf.tensors}
        rot = Rotation.from_file(gf, widths)
        assert rot is not None and rot.block == 128
        for t in gf.tensors:
            if not rot.folds(t.name) or t.name == "output.weight":
                continue
            k, n = t.ne
            raw = np.array(gf.data(t))
            x = [
                torch.from_numpy(rng("demo", t.name).standard_normal((m, k))).float().cuda()
                for m in (1, 5)
            ]
            check_fold(raw, n, k, rot.block, rot.signs_for(k), x)
        emb = gf.tensor("token_embd.weight")
        k, n = emb.ne
        raw = np.array(gf.data(emb))
        s = rot.signs_for(k)
        ids = torch.tensor([0, 7, n - 1], dtype=torch.int32, device="cuda")
        rows = PQ2Weights.from_host(raw, n, k, "tiles", 2).get_rows(
            ids, rotation=device_rotation(rot.block, s)
        )
        want = reference.unfold(formats.pq2_dequantize(raw, n, k), rot.block, s)[[0, 7, n - 1]]
        assert rel_rms(f64(rows), want) <= ROT_TOL[torch.float32]


# ---- errors ------------------------------------------------------------------------------


def test_bad_arguments_return_status():
    x = torch.zeros(2, 1024, device="cuda")
    buf = torch.zeros(2 * 1024 + 128, device="cuda")

    def status_of(fn):
        with pytest.raises(Pq2Error) as e:
            fn()
        return e.value

    cases = [
        (lambda: rotate(x, DeviceRotation(96, None)), "INVALID_ARGUMENT", "rot->block=96"),
        (lambda: rotate(x, DeviceRotation(8192, None)), "INVALID_ARGUMENT", "8192"),
        (
            lambda: rotate(torch.zeros(2, 640, device="cuda"), DeviceRotation(256, None)),
            "SHAPE",
            "640",
        ),
        (
            lambda: rotate(torch.zeros(2, 1000, device="cuda"), DeviceRotation(64, None)),
            "SHAPE",
            "1000",
        ),
        (
            lambda: rotate(
                buf[:2048].view(2, 1024), DeviceRotation(128, None), out=buf[128:].view(2, 1024)
            ),
            "INVALID_ARGUMENT",
            "overlap",
        ),
        (
            lambda: rotate_q8(torch.zeros(1, 6144, device="cuda"), None, 48, 5),
            "SHAPE",
            "v_heads=48",
        ),
        (
            lambda: gated_norm_rotate_q8(x, x, torch.ones(256, device="cuda"), 1e-6, None, 4),
            "SHAPE",
            "v_heads=4",  # heads of 256
        ),
        (
            lambda: gated_norm_rotate_q8(x, x, torch.ones(128, device="cuda"), 1e-6, None, 8, 3),
            "SHAPE",
            "k_heads=3",
        ),
        (
            lambda: gated_norm_rotate_q8(x, x, torch.ones(128, device="cuda"), -1.0, None, 8),
            "INVALID_ARGUMENT",
            "eps",
        ),
        (
            lambda: norm_rotate_q8(x, torch.ones(1024, device="cuda"), float("nan"), None),
            "INVALID_ARGUMENT",
            "eps",
        ),
        (
            lambda: norm_rotate_q8(x, torch.ones(1024, device="cuda"), 1e-6, None, h_out=x),
            "INVALID_ARGUMENT",
            "overlaps",
        ),
    ]
    for fn, status, words in cases:
        e = status_of(fn)
        assert e.status_name == "PQ2_ERR_" + status and words in e.message, (status, words, e)
    with pytest.raises(ValueError, match="one weight per element of a V head"):
        gated_norm_rotate_q8(x, x, torch.ones(1024, device="cuda"), 1e-6, None, 8)
    with pytest.raises(ValueError, match="contiguous float32"):
        gated_norm_rotate_q8(x.half(), x, torch.ones(128, device="cuda"), 1e-6, None, 8)
    # a permuted width past 32-bit indices is refused before any launch
    st = _lib.pq2_rotate_q8_cuda(
        _ffi.cast("void *", x.data_ptr()),
        0,
        1,
        3 << 30,
        _ffi.NULL,
        1 << 20,
        1 << 20,
        Q8Operand.empty(1, 1024).struct(),
        _ffi.NULL,
    )
    assert _ffi.string(_lib.pq2_status_name(st)) == b"PQ2_ERR_SHAPE"
    assert "2^31 - 1" in _ffi.string(_lib.pq2_last_error()).decode()
    # a NULL part of the Q8 operand, or no operand, is refused
    q = Q8Operand.empty(2, 1024).struct()
    q.scales = _ffi.NULL
    st = _lib.pq2_rotate_q8_cuda(
        _ffi.cast("void *", x.data_ptr()), 0, 2, 1024, _ffi.NULL, 0, 0, q, _ffi.NULL
    )
    assert _ffi.string(_lib.pq2_last_error()).decode().endswith("out->scales is NULL")
    st = _lib.pq2_rotate_q8_cuda(
        _ffi.cast("void *", x.data_ptr()), 0, 2, 1024, _ffi.NULL, 0, 0, _ffi.NULL, _ffi.NULL
    )
    assert _ffi.string(_lib.pq2_status_name(st)) == b"PQ2_ERR_NULL_POINTER"
    # weights not 16-byte aligned are refused by the weight readers, nothing launched
    raw = formats.pq2_quantize(rng("align").standard_normal((16, 256)))
    w = PQ2Weights.from_host(raw, 16, 256, "planes")
    out = torch.full((16, 256), float("nan"), device="cuda")
    ws = w.struct()
    ws.data = _ffi.cast("void *", w.data.data_ptr() + 4)
    ids = torch.zeros(1, dtype=torch.int32, device="cuda")
    for st in (
        _lib.pq2_dequantize_cuda(ws, _ffi.cast("void *", out.data_ptr()), 0, _ffi.NULL),
        _lib.pq2_get_rows_cuda(
            ws,
            _ffi.cast("int32_t *", ids.data_ptr()),
            1,
            _ffi.cast("void *", out.data_ptr()),
            0,
            _ffi.NULL,
            _ffi.NULL,
        ),
    ):
        assert _ffi.string(_lib.pq2_status_name(st)) == b"PQ2_ERR_ALIGNMENT"
        assert "16-byte" in _ffi.string(_lib.pq2_last_error()).decode()
    torch.cuda.synchronize()
    assert torch.isnan(out).all()
