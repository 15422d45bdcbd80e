"""The GPU matmul (row-block family, M = 1..16) and the GPU Q8 quantiser against float64
references.

Skipped without torch + CUDA + a CUDA build of libpq2. Tests of explicit configurations beyond
the tuned table's need a tuning build (-DPQ2_TUNING_KERNELS=ON) and are skipped otherwise; the
dispatcher's own choices run in every build. Tolerances (relative RMS against the
float64 evaluation of the same Q8 problem, from reference.matmul_q8's definition):
  Y_TOL[f32]  = 1e-5   fp32 accumulation over K/128 groups (observed ~1e-7)
  Y_TOL[f16]  = 2^-11  the unit roundoff of the output dtype
  Y_TOL[bf16] = 2^-8
Q8_VS_FLOAT_TOL = 1e-2: the Q8 path against the unquantised float64 product (observed ~5e-3).
The quantiser is bit-exact with numpy (reference.quantize_q8).
"""

import math
import zlib

import numpy as np
import pytest

from ..conftest import gpu_module

torch = gpu_module()

from pyq2.errors import Pq2Error  # noqa: E402
from pyq2.lib import cpu as host  # noqa: E402
from pyq2.lib import native as _native  # noqa: E402
from pyq2.lib.cuda import (  # noqa: E402
    FAMILY_GEMM,
    FAMILY_GEMM_SM90,
    PQ2Weights,
    Q8Operand,
    gemm_config,
    matmul_config,
    quantize_q8,
)
from pyq2.spec import reference  # noqa: E402

_ffi, _lib = _native.load()

pytestmark = pytest.mark.gpu
TUNING_BUILD = bool(_lib.pq2_built_with_tuning_kernels())
needs_tuning_build = pytest.mark.skipif(
    not TUNING_BUILD, reason="explicit configurations: needs a -DPQ2_TUNING_KERNELS=ON build"
)

Y_TOL = {torch.float32: 1e-5, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
Q8_VS_FLOAT_TOL = 1e-2

MODEL_SHAPES = {  # name: (N, K), TARGETS.md
    "gate_up": (34816, 5120),
    "down": (5120, 17408),
    "in_proj": (16384, 5120),
    "qkv": (14336, 5120),
    "out": (5120, 6144),
    "lm_head": (248320, 5120),
}
ODD_SHAPES = {
    "n1_k128": (1, 128),
    "n17_k384": (17, 384),
    "n100_k5248": (100, 5248),
    "n1000_k640": (1000, 640),
    "n4111_k1024": (4111, 1024),
}


# ---- references (float64 on the GPU, written from FORMATS.md) --------------------------------


def make_planes(n, k, content, seed):
    """Code plane [n, k/4] uint8 and scale plane [n, k/128] fp16 on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if content == "random":  # every code, 3 included
        codes = torch.randint(0, 256, (n, k // 4), dtype=torch.uint8, device="cuda", generator=g)
    else:  # ternary: codes 0, 1, 2 about a third each, no 3
        c = torch.randint(0, 3, (n, k // 4, 4), dtype=torch.uint8, device="cuda", generator=g)
        codes = (c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)).to(torch.uint8)
    scales = (torch.rand(n, k // 128, device="cuda", generator=g) * 0.02 + 1e-3).half()
    zero = torch.rand(n, k // 128, device="cuda", generator=g) < 0.03  # all-zero blocks
    scales[zero] = 0
    codes.view(n, k // 128, 32)[zero] = 0x55
    return codes, scales


def weights_from_planes(codes, scales, layout, rt):
    n, k = codes.shape[0], codes.shape[1] * 4
    planes = torch.cat([codes.reshape(-1), scales.reshape(-1).view(torch.uint8)])
    if layout == "planes":
        return PQ2Weights(planes, n, k, "planes", 0)
    buf = host.convert_layout(planes.cpu().numpy(), n, k, "planes", "tiles", 0, rt)
    return PQ2Weights(torch.from_numpy(buf).cuda(), n, k, "tiles", rt)


def unpack_codes(codes):
    """[n, k] int8 codes (0..3) of the code plane: weight 4b+s is bits 2s..2s+1 of byte b."""
    n = codes.shape[0]
    shifts = torch.tensor([0, 2, 4, 6], device=codes.device, dtype=torch.uint8)
    return ((codes.unsqueeze(-1) >> shifts) & 3).reshape(n, -1)


def q8_reference(codes, scales, q8, xs, sums):
    """float64 [m, n]: sum_g d_w d_x (dot(code, q) - sum(q)), q taken back out of plane order."""
    m, k = q8.shape
    G = k // 128
    # plane order position (i % 4) * 32 + i // 4 holds element i
    i = torch.arange(128, device=q8.device)
    q = q8.view(m, G, 128)[:, :, (i % 4) * 32 + i // 4].double()  # [m, G, 128]
    w = unpack_codes(codes).view(-1, G, 128).double()  # [n, G, 128]
    dots = torch.einsum("ngk,mgk->mng", w, q) - sums.double().unsqueeze(1)  # exact integers
    return (dots * scales.double().unsqueeze(0) * xs.double().unsqueeze(1)).sum(-1)


def float_reference(codes, scales, x):
    n = codes.shape[0]
    G = scales.shape[1]
    w = (unpack_codes(codes).double() - 1).view(n, G, 128) * scales.double().unsqueeze(-1)
    return x.double() @ w.view(n, -1).T


def rel_rms(y, ref):
    y = y.double()
    if not torch.isfinite(y).all():
        return math.inf
    den = torch.sqrt((ref**2).mean())
    num = torch.sqrt(((y - ref) ** 2).mean())
    return float(num / den) if float(den) > 0 else float(num)


def activations(m, k, kind, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    if kind == "outliers":  # per-channel outliers as in real activations
        x[:, ::97] *= 40
    if kind == "zero":
        x.zero_()
    if kind == "huge":
        x *= {torch.float32: 1e30, torch.bfloat16: 1e30, torch.float16: 6e4 / 5}[dtype]
    return x.to(dtype)


_cache = {}


def weights(shape, content, layout, rt):
    key = (shape, content, layout, rt)
    if key not in _cache:
        if len(_cache) > 6:
            _cache.clear()
        codes, scales = make_planes(*shape, content, seed=zlib.crc32(repr(key).encode()) % 1000)
        _cache[key] = (codes, scales, weights_from_planes(codes, scales, layout, rt))
    return _cache[key]


def check_matmul(shape, m, dtype, layout, rt, content="ternary", kind="normal", cfg=None, seed=0):
    codes, scales, w = weights(shape, content, layout, rt)
    x = activations(m, shape[1], kind, dtype, seed)
    y = torch.full((m, shape[0]), float("nan"), dtype=dtype, device="cuda")  # poisoned
    w.matmul(x, out=y, cfg=cfg)
    xq = quantize_q8(x)
    q8, xs, sums = xq
    ref = q8_reference(codes, scales, q8, xs, sums)
    torch.cuda.synchronize()
    assert not torch.isnan(y).any(), "unwritten (NaN) outputs"
    if kind == "zero":
        assert (y == 0).all()
        return y, x, codes, scales
    err = rel_rms(y, ref)
    assert err <= Y_TOL[dtype], f"rel RMS {err:.3g} > {Y_TOL[dtype]:.3g}"
    return y, x, codes, scales


# ---- quantiser ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "m,k", [(1, 128), (3, 5120), (16, 17408), (5, 640), (17, 640), (40, 1280), (1001, 5248)]
)
def test_quantize_bit_exact(dtype, m, k):
    """(quantize.cu: m <= 16 runs the row kernel in one-warp blocks; larger m the flat kernel, one
    task per warp up to a wave of resident warps (17 x 5, 40 x 10) and two above (1001 x 41, an
    odd count: the last warp has one))"""
    x = activations(m, k, "outliers", dtype, seed=m * k)
    x[0, :128] = 0  # an all-zero group
    x[-1, 128:256] = 1e-40 if dtype == torch.float32 else 0  # subnormal group
    xq = quantize_q8(x)
    q8, xs, sums = xq
    rq, rs, rsum = reference.quantize_q8(x.float().cpu().numpy())
    assert np.array_equal(q8.cpu().numpy(), rq)
    assert np.array_equal(xs.cpu().numpy().view(np.uint32), rs.view(np.uint32))
    assert np.array_equal(sums.cpu().numpy(), rsum)


def test_quantize_nan_inf_like_host():
    """NaN and inf inputs: the GPU quantiser matches the C host reference bit for bit (max|x|
    ignores NaN, from 0; a NaN quotient gives q = 0): a group with one NaN, an all-NaN group, a
    group with +inf, a group with NaN and -inf. (numpy follows the same rule: test_host.py.)"""
    x = activations(1, 640, "normal", torch.float32, seed=11)
    x[0, 3] = float("nan")
    x[0, 128:256] = float("nan")
    x[0, 300] = float("inf")
    x[0, 400], x[0, 401] = float("nan"), float("-inf")
    xq = quantize_q8(x)
    q8, xs, sums = xq
    hq, hs, hsum = host.quantize_q8(x.cpu().numpy())
    assert np.array_equal(q8.cpu().numpy(), hq)
    assert np.array_equal(xs.cpu().numpy().view(np.uint32), hs.view(np.uint32))
    assert np.array_equal(sums.cpu().numpy(), hsum)


def test_quantize_near_half_quotients():
    """Quotients x / scale at and within 3 ulp of every half-integer, for several scales: the
    quantiser rounds x * (1 / scale) and hands products near a half-integer to the correctly
    rounded division (NOTES v17b); every q must still be the spec's rint(x / scale), bit-exact
    with numpy (whose float32 division is correctly rounded)."""
    cols = []
    for amax in (127.0, 3.7, 1e-3, 5e4, 1e-36):
        scale = np.float32(amax) * np.float32(1.0 / 127.0)  # the quantiser's scale of amax
        halves = ((np.arange(-127, 127) + 0.5) * np.float64(scale)).astype(np.float32)
        vals, up, down = [halves], halves, halves
        for _ in range(3):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            vals += [up, down]
        v = np.concatenate(vals)
        v = v[np.abs(v) <= np.float32(amax)]
        groups = -(-len(v) // 127)
        x = np.zeros((groups, 128), dtype=np.float32)
        x[:, 0] = amax  # every group's max|x|, so its scale is `scale`
        x.reshape(-1)[np.flatnonzero(np.arange(groups * 128) % 128)[: len(v)]] = v
        cols.append(x.reshape(-1))
    x = np.concatenate(cols)[None, :]
    q8, xs, sums = quantize_q8(torch.from_numpy(x).cuda())
    rq, rs, rsum = reference.quantize_q8(x)
    assert np.array_equal(q8.cpu().numpy(), rq)
    assert np.array_equal(xs.cpu().numpy().view(np.uint32), rs.view(np.uint32))
    assert np.array_equal(sums.cpu().numpy(), rsum)


@pytest.mark.parametrize("layout,rt", [("tiles", 2), ("planes", 0)], ids=["tiles2", "planes"])
def test_bit_slices_every_bit_at_m1(layout, rt):
    """Every activation bit of the m == 1 bit-slice kernels (the row-block family), through the
    quantiser's and the q8 path's bit slices: weights whose row n is zero but for +1 at element n
    (scale 1), so y[n] = q[n] * xs of its group. A wrong bit moves y[n] by xs or more. The kernel
    adds four float partials per row (lane tq's bit planes, with -sum(q) in plane 0), which
    cancel: their rounding is up to ~1e-3 xs, so the tolerance is xs / 64."""
    n = k = 640
    e = torch.arange(n, device="cuda")
    codes = torch.full((n, k // 4), 0x55, dtype=torch.uint8, device="cuda")  # code 1: weight 0
    sh = (2 * (e % 4)).to(torch.uint8)
    codes[e, e // 4] = (0x55 & ~(3 << sh) | (2 << sh)).to(torch.uint8)  # code 2: weight +1
    scales = torch.ones(n, k // 128, dtype=torch.float16, device="cuda")
    w = weights_from_planes(codes, scales, layout, rt)
    x = activations(1, k, "outliers", torch.float32, seed=5)
    xq = quantize_q8(x)
    q8, xs, sums = xq
    ref = q8_reference(codes, scales, q8, xs, sums).flatten()
    tol = xs.double().flatten()[e // 128] / 64
    explicit = ROWBLOCK_BY_TOKS[1] if layout == "tiles" else ROWBLOCK_PLANES_BY_TOKS[1]
    for cfg_rt, warps, unroll, stages in [(None,) * 4] + (explicit if TUNING_BUILD else []):
        cfg = None if cfg_rt is None else matmul_config(cfg_rt, warps, unroll, stages)
        y = torch.full((1, n), float("nan"), dtype=torch.float32, device="cuda")
        w.matmul(x, out=y, cfg=cfg)
        yq = torch.full((1, n), float("nan"), dtype=torch.float32, device="cuda")
        w.matmul_q8(xq, yq, w.workspace(1, cfg), cfg)
        torch.cuda.synchronize()
        for path, got in (("matmul", y), ("matmul_q8", yq)):
            got = got.double().flatten()
            bad = torch.nonzero(~((got - ref).abs() <= tol)).flatten()  # NaN counts as bad
            assert bad.numel() == 0, (
                f"{path} rt {cfg_rt} warps {warps}: {bad.numel()} outputs differ, "
                f"e.g. y[{bad[0]}] = {got[bad[0]]} against {ref[bad[0]]}"
            )


# ---- matmul ---------------------------------------------------------------------------------

ALL_M = list(range(1, 17))


def dtype_for(m):
    """The activation and output dtype a test uses at m (the three in turn)."""
    return [torch.bfloat16, torch.float16, torch.float32][m % 3]


def toks_class(m):
    """The row-block kernels' token class of m (1, 2, 8 or 16), which keys the per-class config
    lists (m <= 2: column planes)."""
    return m if m <= 2 else 8 if m <= 8 else 16


@pytest.mark.parametrize(
    "layout,rt",
    [("tiles", 1), ("tiles", 2), ("tiles", 4), ("planes", 0)],
    ids=["tiles1", "tiles2", "tiles4", "planes"],
)
@pytest.mark.parametrize("shape", list(ODD_SHAPES.values()), ids=list(ODD_SHAPES))
def test_odd_shapes_every_m(shape, layout, rt):
    for m in ALL_M:
        dtype = dtype_for(m)
        check_matmul(shape, m, dtype, layout, rt, content="random", seed=m)


@pytest.mark.parametrize(
    "layout,rt", [("tiles", 2), ("tiles", 4), ("planes", 0)], ids=["tiles2", "tiles4", "planes"]
)
@pytest.mark.parametrize("name", list(MODEL_SHAPES))
def test_model_shapes(name, layout, rt):
    """The dispatcher's own choice (the tuned table: tiles 2 and planes) at every M."""
    shape = MODEL_SHAPES[name]
    for m in ALL_M:
        dtype = dtype_for(m)
        check_matmul(shape, m, dtype, layout, rt, seed=m)


# (rt, warps, unroll, stages): register batches of 2 units x rt 2, and the bulk-copy ring
ROWBLOCK_BY_TOKS = {
    1: [(2, 8, 2, 2), (2, 8, 1, 4)],
    2: [(2, 8, 1, 1), (2, 4, 2, 3)],
    8: [(2, 8, 2, 2), (2, 4, 2, 3)],
    16: [(2, 8, 2, 1), (2, 8, 1, 4)],
}


# planes: (rt, warps, unroll, stages) of register kernels compiled for the planes layout
ROWBLOCK_PLANES_BY_TOKS = {
    1: [(2, 8, 1, 2), (1, 16, 2, 1)],
    2: [(2, 8, 1, 2), (1, 4, 2, 1)],
    8: [(2, 8, 2, 2), (1, 4, 2, 1)],
    16: [(2, 8, 1, 1), (1, 8, 2, 2)],
}


def check_rowblock_every_m(
    shape, layout, layout_rt, by_toks, content="ternary", warps_delta=0, ms=ALL_M
):
    """Every M in ms with each row-block configuration of its token class (by_toks):
    (rt, warps, unroll, stages) or (rt, warps, unroll, stages, blocks)."""
    for m in ms:
        dtype = dtype_for(m)
        for rt, warps, unroll, stages, *blocks in by_toks[toks_class(m)]:
            cfg = matmul_config(rt, warps + warps_delta, unroll, stages, blocks[0] if blocks else 0)
            check_matmul(shape, m, dtype, layout, layout_rt, content=content, cfg=cfg, seed=m)


# persistent grids, (warps, unroll, stages, blocks per SM); rt = the layout's
ROWBLOCK_PERSIST_BY_TOKS = {
    1: [(16, 1, 1, 1), (4, 2, 2, 3)],
    2: [(8, 1, 1, 2), (4, 2, 2, 3)],
    8: [(8, 1, 1, 1), (2, 1, 1, 2)],
    16: [(8, 1, 1, 1), (4, 2, 1, 2)],
}


# split row blocks, (rt, warps, unroll, stages, 0, splits) per token class
ROWBLOCK_SPLIT_BY_TOKS = {
    1: [(2, 16, 1, 1, 0, 2), (2, 8, 2, 2, 0, 4)],
    2: [(2, 8, 1, 1, 0, 3), (2, 4, 2, 2, 0, 2)],
    8: [(2, 8, 1, 2, 0, 3), (2, 4, 2, 1, 0, 2)],
    16: [(2, 8, 1, 1, 0, 4), (2, 4, 2, 1, 0, 3)],
}
ROWBLOCK_SPLIT_PLANES_BY_TOKS = {
    1: [(1, 8, 1, 2, 0, 2), (2, 8, 2, 1, 0, 3)],
    2: [(1, 8, 1, 2, 0, 2), (2, 8, 2, 1, 0, 3)],
    8: [(2, 8, 2, 2, 0, 4), (1, 4, 1, 1, 0, 2)],
    16: [(2, 8, 1, 1, 0, 2), (1, 8, 2, 2, 0, 3)],
}


def check_split_every_m(shape, layout, layout_rt, by_toks, content):
    """Every M: split row blocks against the reference, with a poisoned workspace (the arrival
    counters must be cleared by the call), twice on the same workspace, bit-identical, and the
    q8 path (its own counter clearing)."""
    codes, scales, w = weights(shape, content, layout, layout_rt)
    for m in ALL_M:
        dtype = dtype_for(m)
        x = activations(m, shape[1], "normal", dtype, m)
        xq = quantize_q8(x)
        q8, xs, sums = xq
        ref = q8_reference(codes, scales, q8, xs, sums)
        for rt, warps, unroll, stages, blocks, splits in by_toks[toks_class(m)]:
            cfg = matmul_config(rt, warps, unroll, stages, blocks, splits)
            work = w.workspace(m, cfg)
            work.fill_(0xAB)
            ys = []
            for _ in range(2):
                y = torch.full((m, shape[0]), float("nan"), dtype=dtype, device="cuda")
                w.matmul(x, out=y, workspace=work, cfg=cfg)
                ys.append(y)
            work.fill_(0xAB)
            yq = torch.full((m, shape[0]), float("nan"), dtype=dtype, device="cuda")
            w.matmul_q8(xq, yq, work, cfg)
            torch.cuda.synchronize()
            for y in ys + [yq]:
                assert not torch.isnan(y).any(), f"unwritten outputs, m={m} cfg splits={splits}"
                err = rel_rms(y, ref)
                assert err <= Y_TOL[dtype], f"m={m} splits={splits}: rel RMS {err:.3g}"
            assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], yq), (
                "split results not deterministic"
            )


@pytest.mark.parametrize("layout", ["tiles", "planes"])
@pytest.mark.parametrize(
    "shape",
    [MODEL_SHAPES["out"], MODEL_SHAPES["down"], (100, 5248), (17, 384), (1, 128)],
    ids=["out", "down", "n100_k5248", "n17_k384", "n1_k128"],
)
@needs_tuning_build
def test_rowblock_split_every_m(shape, layout):
    """config splits > 1: each row block's groups over 2-4 blocks (n1_k128 has 1 group: empty
    splits), the last block to arrive adding the partials in split order."""
    if layout == "tiles":
        check_split_every_m(shape, "tiles", 2, ROWBLOCK_SPLIT_BY_TOKS, "ternary")
    else:
        check_split_every_m(shape, "planes", 0, ROWBLOCK_SPLIT_PLANES_BY_TOKS, "random")


@pytest.mark.parametrize("rt", [1, 2, 4])
@pytest.mark.parametrize(
    "shape",
    [(9001, 640), (5120, 6144), (100, 5248), (1, 128)],
    ids=["n9001_k640", "out", "n100_k5248", "n1_k128"],
)
@needs_tuning_build
def test_rowblock_persistent_every_m(shape, rt):
    """config blocks > 0: a grid of at most blocks * SMs blocks, each looping over row blocks
    (n9001 and out have more row blocks than that grid; the small ones fewer)."""
    by_toks = {t: [(rt,) + c for c in cfgs] for t, cfgs in ROWBLOCK_PERSIST_BY_TOKS.items()}
    if rt == 1:  # rt 1, not compiled (spills): unroll 2 at m = 1, unroll 1 stages 1 at m > 8
        by_toks[1] = [(1, 16, 1, 1, 1), (1, 4, 1, 2, 3)]
        by_toks[16] = [(1, 8, 1, 2, 1), (1, 4, 2, 1, 2)]
    if rt == 4:  # rt 4 persistent kernels: unroll 1, stages 1, 2 <= m <= 8
        by_toks = {t: [c for c in cfgs if c[2:4] == (1, 1)] for t, cfgs in by_toks.items()}
    check_rowblock_every_m(
        shape, "tiles", rt, by_toks, content="random", ms=ALL_M if rt < 4 else range(2, 9)
    )


@pytest.mark.parametrize("name", list(MODEL_SHAPES))
@needs_tuning_build
def test_rowblock_planes_model_shapes(name):
    """The row-block family on the planes layout, every model shape and every M."""
    check_rowblock_every_m(MODEL_SHAPES[name], "planes", 0, ROWBLOCK_PLANES_BY_TOKS)


@pytest.mark.parametrize("shape", list(ODD_SHAPES.values()), ids=list(ODD_SHAPES))
@needs_tuning_build
def test_rowblock_planes_odd_shapes(shape):
    """Planes rows past n (no padding in that layout) are clamped on load and never stored."""
    check_rowblock_every_m(
        shape, "planes", 0, ROWBLOCK_PLANES_BY_TOKS, content="random", warps_delta=-1
    )


@pytest.mark.parametrize("name", list(MODEL_SHAPES))
@needs_tuning_build
def test_rowblock_model_shapes(name):
    """The row-block family on every model shape and every M (tiles rt 2, explicit config)."""
    check_rowblock_every_m(MODEL_SHAPES[name], "tiles", 2, ROWBLOCK_BY_TOKS)


# coarse rows: rt 4 row blocks on tiles rt 2 files, 3 <= m <= 8: (warps, stages, blocks per SM)
ROWBLOCK_COARSE = [(8, 1, 0), (4, 2, 0), (4, 1, 2)]


@pytest.mark.parametrize(
    "shape",
    [MODEL_SHAPES["out"], (100, 5248), (80, 640), (48, 640), (17, 384), (1, 128)],
    ids=["out", "n100_k5248", "n80_k640", "n48_k640", "n17_k384", "n1_k128"],
)
@needs_tuning_build
def test_rowblock_coarse_rows(shape):
    """Config rt 4 on a tiles rt 2 file: row block rb takes tile rows 2 rb and 2 rb + 1 (n 80, 17
    and 1: an odd number of tile rows, the missing one re-read from the last and never stored).
    Every M of 3..8 on the rows and persistent grids, against the reference, bit-identical to the
    rt 2 kernel with the same warps (the same per-row arithmetic and order) and to the q8 entry
    point; other M are refused with a clear error."""
    codes, scales, w = weights(shape, "ternary", "tiles", 2)
    for m in ALL_M:
        dtype = dtype_for(m)
        x = activations(m, shape[1], "normal", dtype, m)
        if not 3 <= m <= 8:
            with pytest.raises(Pq2Error) as e:
                w.matmul(x, cfg=matmul_config(4, 8, 1, 1))
            assert e.value.status_name == "PQ2_ERR_UNSUPPORTED" and "coarse rows" in e.value.message
            continue
        xq = quantize_q8(x)
        q8, xs, sums = xq
        ref = q8_reference(codes, scales, q8, xs, sums)
        for warps, stages, blocks in ROWBLOCK_COARSE:
            cfg = matmul_config(4, warps, 1, stages, blocks)
            y = torch.full((m, shape[0]), float("nan"), dtype=dtype, device="cuda")
            w.matmul(x, out=y, cfg=cfg)
            work = w.workspace(m, cfg)
            work.fill_(0xAB)
            yq = torch.full((m, shape[0]), float("nan"), dtype=dtype, device="cuda")
            w.matmul_q8(xq, yq, work, cfg)
            y2 = w.matmul(x, out_dtype=dtype, cfg=matmul_config(2, warps, 1, 1))
            torch.cuda.synchronize()
            what = f"m={m} warps={warps} stages={stages} blocks={blocks}"
            assert not torch.isnan(y).any(), f"unwritten outputs, {what}"
            err = rel_rms(y, ref)
            assert err <= Y_TOL[dtype], f"{what}: rel RMS {err:.3g}"
            assert torch.equal(y, yq), f"{what}: q8 entry point differs"
            assert torch.equal(y, y2), f"{what}: differs from the rt 2 kernel"


@pytest.mark.parametrize("m", [9, 16])
def test_token_constants_long_rows(m):
    """m > 8 stages each warp's activation scales and sums in shared memory (one 16-byte record
    per unit and token pair): a long k gives a warp many units (one warp: 512 here, 4096 records,
    128 rounds of the staging loop), in the ring, register, persistent and split kernels."""
    shape = (200, 65536)
    explicit = [
        matmul_config(2, 1, 1, 1),
        matmul_config(2, 3, 2, 1),
        matmul_config(2, 2, 1, 3),
        matmul_config(2, 4, 2, 1, 1),
        matmul_config(2, 3, 1, 1, 0, 3),
    ]
    for cfg in (explicit if TUNING_BUILD else []) + [None]:
        check_matmul(shape, m, torch.float32, "tiles", 2, content="random", cfg=cfg, seed=m)


@pytest.mark.parametrize("kind", ["zero", "huge", "outliers"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_activation_extremes(kind, dtype):
    for m in (1, 16):
        check_matmul((1000, 640), m, dtype, "tiles", 2, content="random", kind=kind)


def test_q8_path_close_to_float():
    shape = (4111, 5120)
    for m in (1, 8):
        y, x, codes, scales = check_matmul(shape, m, torch.float32, "tiles", 1)
        err = rel_rms(y, float_reference(codes, scales, x))
        assert err <= Q8_VS_FLOAT_TOL, f"Q8 vs float rel RMS {err:.3g}"


ROWBLOCK_CONFIGS = [
    (rt, warps, unroll, stages, 0)
    for rt in (1, 2, 4)
    for warps in (1, 3, 16)
    for unroll in (1, 2, 4)
    for stages in (1, 2, 3, 5)
]
ROWBLOCK_CONFIGS += [
    (rt, warps, unroll, stages, 1)  # persistent grids (tiles)
    for rt in (1, 2, 4)
    for warps in (1, 3, 16)
    for unroll in (1, 2, 4)
    for stages in (1, 2)
]
ROWBLOCK_CONFIGS += [
    (rt, warps, unroll, stages, 0, splits)  # split row blocks
    for rt in (1, 2, 4)
    for warps in (1, 3, 16)
    for unroll in (1, 2, 4)
    for stages in (1, 2)
    for splits in (2, 3)
]


@pytest.mark.parametrize("m", [1, 7, 9, 16])
@needs_tuning_build
def test_every_config(m):
    """Explicit configurations (what the tuner tries) are all correct, or refused clearly."""
    shape = (1000, 2560)
    for layout in ("tiles", "planes"):
        for rt, warps, unroll, stages, blocks, *splits in ROWBLOCK_CONFIGS:
            cfg = matmul_config(rt, warps, unroll, stages, blocks, *splits)
            try:
                check_matmul(
                    shape,
                    m,
                    torch.float32,
                    layout,
                    rt if layout == "tiles" else 0,
                    content="random",
                    cfg=cfg,
                    seed=rt + warps,
                )
            except Pq2Error as e:
                # may be refused: a ring too large for shared memory, the row-block family on
                # planes, a row-block combination not compiled (spills)
                assert e.status_name == "PQ2_ERR_UNSUPPORTED", e
                assert (
                    "shared memory" in e.message
                    or "tiles layout only" in e.message
                    or "no compiled row-block kernel" in e.message
                ), e


def test_deterministic_across_runs():
    shape = MODEL_SHAPES["down"]
    codes, scales, w = weights(shape, "ternary", "tiles", 4)
    x = activations(8, shape[1], "normal", torch.bfloat16, 1)
    # 16 warps reduce in shared memory, after register batches and after the ring
    explicit = [matmul_config(4, 16, 1, 2), matmul_config(4, 16, 1, 5)]
    for cfg in [None] + (explicit if TUNING_BUILD else []):
        ys = [w.matmul(x, out_dtype=torch.float32, cfg=cfg) for _ in range(3)]
        assert all(torch.equal(ys[0], y) for y in ys[1:])


def test_cuda_graph_capture_and_replay():
    shape = MODEL_SHAPES["out"]
    codes, scales, w = weights(shape, "ternary", "tiles", 4)
    m = 4
    x = activations(m, shape[1], "normal", torch.bfloat16, 2)
    y = torch.empty(m, shape[0], dtype=torch.bfloat16, device="cuda")
    ws = w.workspace(m)
    wstruct = w.struct()
    _lib.pq2_cuda_init()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        w.matmul(x, out=y, workspace=ws, w_struct=wstruct)  # warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        w.matmul(x, out=y, workspace=ws, w_struct=wstruct)
    for seed in (3, 4):
        x.copy_(activations(m, shape[1], "normal", torch.bfloat16, seed))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        xq = quantize_q8(x)
        q8, xs, sums = xq
        assert rel_rms(y, q8_reference(codes, scales, q8, xs, sums)) <= Y_TOL[torch.bfloat16]


# ---- the GEMM family (m > 16) -----------------------------------------------------------------

GEMM_M = [17, 31, 32, 33, 64, 100, 128, 511, 512, 2048, 4099]


@pytest.mark.parametrize("rt", [1, 2, 4])
@pytest.mark.parametrize(
    "shape",
    [(1, 128), (17, 384), (100, 5248), (1000, 640), (4111, 1024)],
    ids=["n1_k128", "n17_k384", "n100_k5248", "n1000_k640", "n4111_k1024"],
)
def test_gemm_every_m(shape, rt):
    """The dispatcher's GEMM configurations (tokens 32, 64, 128; splits chosen from the grid)
    at every boundary of m, rows and groups off the tile sizes, against the reference."""
    for m in GEMM_M:
        if m >= 2048 and shape[0] > 1000:
            continue  # the float64 reference of n x m x k/128 would need GBs
        check_matmul(shape, m, dtype_for(m), "tiles", rt, content="random", seed=m)


@pytest.mark.parametrize("name", list(MODEL_SHAPES))
def test_gemm_model_shapes(name):
    for m in (17, 64):
        check_matmul(MODEL_SHAPES[name], m, dtype_for(m), "tiles", 2, seed=m)


def check_explicit_configs(
    shape, family, tokens_list, stages_list, splits_list, same_as=None, blocks=0, m=100, **shape_kw
):
    """Every configuration of a GEMM family over the lists (with `blocks`, and the block shape's
    warps and unroll in shape_kw), at m on a poisoned workspace, twice: within the reference's
    tolerance and bit-identical; the q8 entry point gives the same bits, and so does
    same_as(tokens, stages, splits), a configuration to compare with (or None)."""
    codes, scales, w = weights(shape, "random", "tiles", 2)
    x = activations(m, shape[1], "normal", torch.float32, 7)
    xq = quantize_q8(x)
    ref = q8_reference(codes, scales, *xq)
    for tokens in tokens_list:
        for stages in stages_list:
            for splits in splits_list:
                cfg = gemm_config(tokens, stages, splits, family, blocks, **shape_kw)
                work = w.workspace(m, cfg)
                ys = []
                for _ in range(2):
                    work.fill_(0xAB)
                    y = torch.full((m, shape[0]), float("nan"), device="cuda")
                    ys.append(w.matmul(x, out=y, workspace=work, cfg=cfg))
                work.fill_(0xAB)
                yq = w.matmul_q8(xq, torch.full_like(ys[0], float("nan")), work, cfg)
                torch.cuda.synchronize()
                what = f"tokens={tokens} stages={stages} splits={splits}"
                assert rel_rms(ys[0], ref) <= Y_TOL[torch.float32], what
                assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], yq), what
                other = same_as(tokens, stages, splits) if same_as else None
                if other is not None:
                    assert torch.equal(ys[0], w.matmul(x, cfg=other)), what


def test_gemm_explicit_configs_and_determinism():
    """Every compiled GEMM kernel (tokens x stages), with and without split groups (16 splits of
    41 groups: splits of 2 and 3)."""
    check_explicit_configs((1000, 5248), FAMILY_GEMM, (32, 64, 128), (2, 3, 4), (0, 3, 16))


needs_sm90 = pytest.mark.skipif(
    torch.cuda.get_device_capability() != (9, 0), reason="the sm_90a GEMM needs a 9.0 GPU"
)


@needs_sm90
def test_gemm_sm90_explicit_configs_bit_identical_to_portable():
    """Every compiled sm_90a GEMM kernel (tokens x stages), with and without split groups; at
    tokens 32 and 64 the bits of the portable kernel of the same tile and splits (the same
    integer products, promoted in the same order)."""
    check_explicit_configs(
        (1000, 5120),
        FAMILY_GEMM_SM90,
        (32, 64, 96, 128),
        (3, 4, 5, 6),
        (1, 3, 16),
        same_as=lambda tokens, stages, splits: (
            gemm_config(tokens, 4, splits) if tokens in (32, 64) else None
        ),
    )


WIDE = [(96, 1), (96, 2), (128, 1)]  # the wide blocks' (tokens, unroll)


@needs_sm90
@pytest.mark.parametrize("tokens,unroll", WIDE, ids=["t96", "t96_pairs", "t128"])
def test_gemm_sm90_wide_blocks_give_the_narrow_blocks_bits(tokens, unroll):
    """Every compiled wide block (warps 12) at every depth, with and without split groups (an
    odd number of groups per split: the two-group loop's last group alone), within the
    reference, the same bits twice and through the q8 entry point, and the bits of the narrow
    block of the same tokens, depth and splits."""
    check_explicit_configs(
        (1000, 5120),
        FAMILY_GEMM_SM90,
        (tokens,),
        (3, 4, 5, 6),
        (1, 3, 16),
        same_as=lambda t, stages, splits: gemm_config(t, stages, splits, FAMILY_GEMM_SM90),
        warps=12,
        unroll=unroll,
    )


def sm90_problems(shape):
    """(rt, m, codes, scales, weights, x) at tile heights 1 and 4 and every m of GEMM_M (the
    largest m only for shapes of at most 1000 rows: the float64 reference's size)."""
    for rt in (1, 4):
        codes, scales, w = weights(shape, "random", "tiles", rt)
        for m in GEMM_M:
            if m >= 2048 and shape[0] > 1000:
                continue
            yield rt, m, codes, scales, w, activations(m, shape[1], "normal", torch.float32, m)


@needs_sm90
@pytest.mark.parametrize("tokens,unroll", WIDE, ids=["t96", "t96_pairs", "t128"])
@pytest.mark.parametrize(
    "shape", [(17, 1024), (1000, 512), (4111, 1536)], ids=["n17_k1024", "n1000_k512", "n4111_k1536"]
)
def test_gemm_sm90_wide_every_m(shape, tokens, unroll):
    """The wide blocks at every boundary of m, tile heights 1 and 4: the narrow block's bits."""
    wide = gemm_config(tokens, 4, 1, FAMILY_GEMM_SM90, warps=12, unroll=unroll)
    for rt, m, _, _, w, x in sm90_problems(shape):
        y = w.matmul(x, out=torch.full((m, shape[0]), float("nan"), device="cuda"), cfg=wide)
        want = w.matmul(x, cfg=gemm_config(tokens, 4, 1, FAMILY_GEMM_SM90))
        torch.cuda.synchronize()
        assert torch.equal(y, want), f"m={m} rt={rt}"


@needs_sm90
@pytest.mark.parametrize("blocks", [0, 1], ids=["tile_grid", "streamk"])
@pytest.mark.parametrize("tokens", [32, 64, 128])
@pytest.mark.parametrize(
    "shape",
    [(1, 512), (17, 1024), (100, 5120), (1000, 512), (4111, 1536)],
    ids=["n1_k512", "n17_k1024", "n100_k5120", "n1000_k512", "n4111_k1536"],
)
def test_gemm_sm90_every_m(shape, tokens, blocks):
    """The sm_90a kernels at every boundary of m, rows and groups off the tile sizes, tile
    heights 1 and 4, on a tile grid and a stream-K grid, against the reference (the portable
    kernel's bits at tokens 32 and 64 on a tile grid; the same bits on a second run)."""
    for rt, m, codes, scales, w, x in sm90_problems(shape):
        xq = quantize_q8(x)
        cfg = gemm_config(tokens, 4, 1, FAMILY_GEMM_SM90, blocks)
        y = w.matmul(x, out=torch.full((m, shape[0]), float("nan"), device="cuda"), cfg=cfg)
        torch.cuda.synchronize()
        what = f"m={m} rt={rt}"
        assert rel_rms(y, q8_reference(codes, scales, *xq)) <= Y_TOL[torch.float32], what
        if blocks:
            assert torch.equal(y, w.matmul(x, cfg=cfg)), what
        elif tokens in (32, 64):
            assert torch.equal(y, w.matmul(x, cfg=gemm_config(tokens, 4, 1))), what


@needs_sm90
@pytest.mark.parametrize("blocks", [1, 2, 4])
def test_gemm_sm90_streamk_configs_and_determinism(blocks):
    """Every compiled stream-K kernel (tokens x stages) at 1, 2 and 4 blocks per SM, on problems
    whose tiles are shared by many blocks (few groups per block) and by two (many): within the
    reference's tolerance, the same bits on a second run on a poisoned workspace and through the
    q8 entry point."""
    for shape, m in (((1000, 5120), 100), ((4111, 1536), 700)):
        check_explicit_configs(
            shape, FAMILY_GEMM_SM90, (32, 64, 96, 128), (3, 6), (0,), blocks=blocks, m=m
        )


@needs_sm90
def test_gemm_sm90_dispatch_and_a_misaligned_operand():
    """The dispatcher picks the sm_90a family above m = 32 where k is a multiple of 512 (the
    fallback lines of the tuned table) and the portable one elsewhere; a Q8 operand whose scales
    and sums are 4- but not 16-byte aligned runs on the portable family under the dispatcher
    (the same bits: no splits either way) and is refused with an explicit sm_90a
    configuration."""
    codes, scales, w = weights((1000, 1024), "random", "tiles", 2)
    assert w.config_for(512)["family"] == FAMILY_GEMM_SM90
    assert w.config_for(33)["family"] == FAMILY_GEMM_SM90
    assert w.config_for(32)["family"] == FAMILY_GEMM
    assert weights((1000, 640), "random", "tiles", 2)[2].config_for(512)["family"] == FAMILY_GEMM
    m, groups = 300, 1024 // 128
    xq = quantize_q8(activations(m, 1024, "normal", torch.float32, 3))
    want = w.matmul_q8(xq, torch.full((m, 1000), float("nan"), device="cuda"))
    sc = torch.empty(m * groups + 4, dtype=torch.float32, device="cuda")[1 : 1 + m * groups]
    su = torch.empty(m * groups + 4, dtype=torch.int32, device="cuda")[1 : 1 + m * groups]
    sc.copy_(xq.scales.reshape(-1)), su.copy_(xq.sums.reshape(-1))
    q = Q8Operand(xq.q8, sc.view(m, groups), su.view(m, groups), None, m, 1024)
    got = w.matmul_q8(q, torch.full((m, 1000), float("nan"), device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    with pytest.raises(Pq2Error) as e:
        cfg = gemm_config(128, 4, 1, FAMILY_GEMM_SM90)
        w.matmul_q8(q, torch.empty(m, 1000, device="cuda"), cfg=cfg)
    assert e.value.status_name == "PQ2_ERR_ALIGNMENT" and "16-byte" in e.value.message


@needs_sm90
def test_gemm_sm90_bad_configs():
    codes, scales, w = weights((1000, 1024), "random", "tiles", 2)
    x = activations(40, 1024, "normal", torch.float32, 0)
    for cfg, words in (
        (gemm_config(48, 4, 0, FAMILY_GEMM_SM90), "tokens=48"),
        (gemm_config(64, 2, 0, FAMILY_GEMM_SM90), "stages=2"),
        (gemm_config(64, 7, 0, FAMILY_GEMM_SM90), "stages=7"),
        (gemm_config(64, 4, 2, FAMILY_GEMM_SM90, 1), "blocks=1 splits=2"),
        (gemm_config(64, 4, 0, FAMILY_GEMM_SM90, 5), "blocks=5"),
        (gemm_config(64, 4, 0, FAMILY_GEMM, 1), "blocks=1"),
        (gemm_config(64, 4, 0, FAMILY_GEMM_SM90, warps=12), "warps=12 unroll=1 tokens=64"),
        (gemm_config(128, 4, 0, FAMILY_GEMM_SM90, warps=12, unroll=2), "unroll=2 tokens=128"),
        (gemm_config(96, 4, 0, FAMILY_GEMM_SM90, 1, warps=12), "tokens=96 blocks=1"),
        (gemm_config(96, 4, 0, FAMILY_GEMM_SM90, unroll=2), "warps=8 unroll=2"),
        (gemm_config(96, 4, 0, FAMILY_GEMM_SM90, warps=10), "warps=10"),
        (gemm_config(96, 4, 0, FAMILY_GEMM_SM90, warps=12, unroll=3), "unroll=3"),
        (gemm_config(64, 4, 0, FAMILY_GEMM, warps=12), "warps=12"),
    ):
        with pytest.raises(Pq2Error) as e:
            w.matmul(x, cfg=cfg)
        assert e.value.status_name == "PQ2_ERR_INVALID_ARGUMENT" and words in e.value.message
    # k = 640: 5 groups, not a multiple of 4 (the kernel's TMA rows of token scalars)
    codes, scales, w = weights((1000, 640), "random", "tiles", 2)
    with pytest.raises(Pq2Error) as e:
        x = activations(40, 640, "normal", torch.float32, 0)
        w.matmul(x, cfg=gemm_config(64, 4, 0, FAMILY_GEMM_SM90))
    assert e.value.status_name == "PQ2_ERR_UNSUPPORTED" and "multiple of 512" in e.value.message


def test_gemm_bad_configs():
    codes, scales, w = weights((1000, 640), "random", "tiles", 2)
    x = activations(40, 640, "normal", torch.float32, 0)
    for cfg, words in (
        (gemm_config(48), "tokens=48"),
        (gemm_config(64, 5), "stages=5"),
        (gemm_config(64, 4, 17), "splits=17"),
    ):
        with pytest.raises(Pq2Error) as e:
            w.matmul(x, cfg=cfg)
        assert e.value.status_name == "PQ2_ERR_INVALID_ARGUMENT" and words in e.value.message


# ---- errors ---------------------------------------------------------------------------------


def test_bad_arguments_return_status():
    codes, scales, w = weights((1000, 640), "random", "tiles", 2)
    x = activations(2, 640, "normal", torch.float32, 0)

    def status_of(fn):
        with pytest.raises(Pq2Error) as e:
            fn()
        return e.value

    pl = weights((1000, 640), "random", "planes", 0)[2]
    e = status_of(lambda: pl.matmul(activations(17, 640, "normal", torch.float32, 0)))
    assert e.status_name == "PQ2_ERR_UNSUPPORTED" and "tiles" in e.message  # no GEMM on planes
    e = status_of(
        lambda: w.matmul(
            activations(17, 640, "normal", torch.float32, 0), cfg=matmul_config(2, 8, 1, 1)
        )
    )
    assert e.status_name == "PQ2_ERR_SHAPE" and "m=17" in e.message  # the row-block family: m <= 16
    bad_k = PQ2Weights(w.data, 1000, 600, "tiles", 2)
    e = status_of(lambda: bad_k.workspace_size(1))
    assert e.status_name == "PQ2_ERR_SHAPE" and "600" in e.message
    raw = PQ2Weights(w.data, 1000, 640, "raw", 0)
    assert status_of(lambda: raw.workspace_size(1)).status_name == "PQ2_ERR_INVALID_ARGUMENT"
    big = torch.empty(2 * 640 + 8, dtype=torch.float32, device="cuda")
    xm = big[2 : 2 + 2 * 640].view(2, 640)  # 8-byte offset: misaligned
    e = status_of(lambda: w.matmul(xm))
    assert e.status_name == "PQ2_ERR_ALIGNMENT" and "x" in e.message
    ws = torch.empty(16, dtype=torch.uint8, device="cuda")
    assert status_of(lambda: w.matmul(x, workspace=ws)).status_name == "PQ2_ERR_WORKSPACE"
    big = weights((1000, 2560), "random", "tiles", 2)[2]
    xb = activations(2, 2560, "normal", torch.float32, 0)
    cases = [  # (weights, x, config, status, words of the message)
        (w, x, matmul_config(2, 0, 2, 1), "INVALID_ARGUMENT", "warps=0"),
        (w, x, matmul_config(2, 17, 2, 2), "INVALID_ARGUMENT", "warps=17"),
        (w, x, matmul_config(2, 4, 3, 1), "INVALID_ARGUMENT", "unroll=3"),
        (w, x, matmul_config(3, 4, 1, 1), "INVALID_ARGUMENT", "row_subtiles=3"),
        (w, x, matmul_config(2, 4, 2, 9), "INVALID_ARGUMENT", "stages=9"),
        (w, x, matmul_config(2, 4, 2, 2, 33), "INVALID_ARGUMENT", "blocks=33"),
        (w, x, matmul_config(2, 4, 1, 1, 0, 17), "INVALID_ARGUMENT", "splits=17"),
        (big, xb, matmul_config(2, 8, 4, 8), "UNSUPPORTED", "shared memory"),
        (w, x, matmul_config(2, 16, 2, 8), "UNSUPPORTED", "shared memory"),  # 16*8*2*1088 B
        (
            w,
            x,
            matmul_config(2, 4, 2, 4, 2),
            "UNSUPPORTED",
            "blocks=2",
        ),  # ring: one block per row block
        (w, x, matmul_config(2, 4, 1, 3, 0, 2), "UNSUPPORTED", "splits=2"),  # ring: no splits
        (w, x, matmul_config(2, 4, 1, 1, 1, 2), "UNSUPPORTED", "splits=2"),  # persistent: no splits
        (pl, x, matmul_config(2, 4, 2, 3), "UNSUPPORTED", "tiles layout only"),  # ring: tiles only
        (
            w,
            x,
            matmul_config(4, 4, 1, 3),
            "UNSUPPORTED",
            "reads whole tiles",
        ),  # ring: row_subtiles = rt
        (w, x, matmul_config(1, 8, 2, 4), "UNSUPPORTED", "reads whole tiles"),
        (
            pl,
            x,
            matmul_config(2, 4, 1, 1, 1),
            "UNSUPPORTED",
            "persistent",
        ),  # persistent: tiles only
        (w, x, matmul_config(4, 4, 1, 1), "UNSUPPORTED", "no compiled"),  # coarse rows at m = 2
    ]
    for weights_, x_, cfg, status, words in cases:
        e = status_of(lambda w_=weights_, x_=x_, c=cfg: w_.matmul(x_, cfg=c))
        assert e.status_name == "PQ2_ERR_" + status and words in e.message, (status, words, e)
    cfg = matmul_config(2, 4, 1, 1)
    cfg.family = 0
    e = status_of(lambda: w.matmul(x, cfg=cfg))
    assert e.status_name == "PQ2_ERR_INVALID_ARGUMENT" and "family=0" in e.message
    st = _lib.pq2_matmul_cuda(
        w.struct(), _ffi.NULL, 0, _ffi.NULL, 0, 1, _ffi.NULL, _ffi.NULL, 0, _ffi.NULL
    )
    assert _ffi.string(_lib.pq2_status_name(st)) == b"PQ2_ERR_NULL_POINTER"


def test_dispatch_takes_the_nearest_listed_shape_at_m_up_to_8():
    """A shape the tuned table does not list takes, at m <= 8, the entries of the listed shape
    nearest it (select.cu): 18432 x 5120 (a 2-way shard's gate_up) those of 16384 x 5120; at
    m = 9..16 and for the GEMM families the lines for any shape, as 1000 x 1024 gets them."""
    unlisted = weights((18432, 5120), "ternary", "tiles", 2)[2]
    listed = weights((16384, 5120), "ternary", "tiles", 2)[2]
    far = weights((1000, 1024), "ternary", "tiles", 2)[2]
    for m in (1, 2, 3, 5, 8):
        assert unlisted.config_for(m) == listed.config_for(m), m
    for m in (9, 16, 17, 300):  # (the GEMM's split count follows the shape)
        got, want = unlisted.config_for(m), far.config_for(m)
        assert {**got, "splits": 0} == {**want, "splits": 0}, m
