"""numpy arithmetic references (pyq2.spec.reference): Q8 activation rules of FORMATS.md and
matmul."""

import numpy as np
import pytest

from pyq2.spec import formats as F
from pyq2.spec import reference as R

# Q8 activations cost about 0.65% relative RMS against the unquantised product on gaussian data
# (0.85% worst over 20 seeds of the shapes below; a single output can be further off).
Q8_VS_FLOAT_REL_TOL = 1e-2
# matmul_q8 against the same sum taken another way (plane order, sums correction): float64
# rounding only.
F64_REL_TOL = 1e-12


# ---- references: FORMATS.md rules one element at a time, with numpy fp32 scalars ---------


def naive_q8_group(xs):
    """(q list in element order, fp32 scale) of one group of 128 fp32 values."""
    amax = max(abs(np.float32(v)) for v in xs)
    scale = np.float32(amax) * (np.float32(1.0) / np.float32(127))
    div = scale if scale != 0 else np.float32(1.0)
    q = [max(-127, min(127, round(float(np.float32(v) / div)))) for v in xs]  # round: half even
    return q, scale


def group_with(values, fill=0.0):
    x = np.full((1, 128), fill, dtype=np.float32)
    x[0, : len(values)] = values
    return x


# ---- quantize_q8 ---------------------------------------------------------------------------


def test_all_zero_group_and_negative_zero():
    x = np.zeros((2, 256), np.float32)
    x[1, 128:] = -0.0
    q8, scales, sums = R.quantize_q8(x)
    assert not q8.any() and not sums.any()
    assert scales.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert np.signbit(scales).sum() == 0  # 0 * (1/127), never -0


def test_ties_round_half_to_even():
    # max|x| = 127 gives scale exactly 1.0 (127 * fp32(1/127) rounds to 1), so x / scale = x.
    x = group_with([127, 0.5, 1.5, 2.5, -2.5, -0.5, 126.5, -126.5, 3.5, -0.0])
    assert R.INV_127_F32 * np.float32(127) == 1.0
    q8, scales, sums = R.quantize_q8(x)
    q = q8[0, R.plane_order(128).argsort()]  # back to element order
    assert scales[0, 0] == 1.0
    assert q[:10].tolist() == [127, 0, 2, 2, -2, 0, 126, -126, 4, 0]
    assert sums[0, 0] == 127 + 2 + 2 - 2 + 126 - 126 + 4


def test_scale_is_reciprocal_multiply_not_division():
    a = np.arange(1, 4000, dtype=np.float32) * np.float32(0.37)
    differs = a[a * R.INV_127_F32 != a / np.float32(127)]
    assert differs.size, "no value where multiply and divide differ"
    v = differs[0]
    _, scales, _ = R.quantize_q8(group_with([v, -v / 3]))
    assert scales[0, 0] == v * R.INV_127_F32 and scales[0, 0] != v / np.float32(127)


@pytest.mark.parametrize(
    "values",
    [
        [1e30, -5e29, 1.0, 3e29],
        [3.0e38, -3.0e38, 1e37],
        [1e-40, -5e-41, 3e-41, 1e-45],  # subnormal group, subnormal non-zero scale
        [1.4e-45, -1.4e-45],  # scale underflows to 0: divide by 1, q = 0
        [0.1, -0.2, 0.3, 1e-8, -7.0],
    ],
    ids=["1e30", "3e38", "subnormal", "min-subnormal", "mixed"],
)
def test_edge_groups_match_naive(values):
    x = group_with(values)
    q8, scales, sums = R.quantize_q8(x)
    q, scale = naive_q8_group(x[0])
    assert scales[0, 0].tobytes() == scale.tobytes()
    assert q8[0, R.plane_order(128).argsort()].tolist() == q
    assert sums[0, 0] == sum(q)
    assert max(abs(v) for v in q) == (0 if scale == 0 else 127)


def test_nan_and_inf_groups():
    """max|x| ignores NaN (an all-NaN group has scale 0); a NaN quotient gives q = 0, so NaN
    inputs quantise to 0 and +-inf to 0 as well (inf / inf); finite values beside an inf
    divide by inf and give 0 too."""
    x = np.zeros((1, 512), np.float32)
    x[0, :4] = [np.nan, 2.0, -1.0, 0.5]  # NaN ignored: scale 2/127
    x[0, 128:256] = np.nan  # all NaN: scale 0, q 0
    x[0, 256:260] = [np.inf, 3.0, -np.inf, np.nan]  # scale inf: every q 0
    x[0, 384:386] = [-np.inf, 1.0]
    q8, scales, sums = R.quantize_q8(x)
    q = q8[0, R.plane_order(512).argsort()]
    assert scales[0, 0] == np.float32(2.0) * R.INV_127_F32
    assert q[:4].tolist() == [0, 127, -64, 32] and sums[0, 0] == 127 - 64 + 32
    assert scales[0, 1] == 0 and not q[128:256].any()
    assert np.isinf(scales[0, 2]) and np.isinf(scales[0, 3]) and not q[256:].any()
    assert sums[0, 1:].tolist() == [0, 0, 0]


def test_gaussian_rows_match_naive():
    x = np.random.default_rng(1).standard_normal((3, 384)).astype(np.float32) * 5
    q8, scales, sums = R.quantize_q8(x)
    qe = q8[:, R.plane_order(384).argsort()]
    for m in range(3):
        for g in range(3):
            q, scale = naive_q8_group(x[m, g * 128 : (g + 1) * 128])
            assert qe[m, g * 128 : (g + 1) * 128].tolist() == q
            assert scales[m, g] == scale and sums[m, g] == sum(q)


def test_plane_order_positions():
    # q8[m][g*128 + (i%4)*32 + i/4] = q of element g*128 + i.
    x = np.random.default_rng(2).standard_normal((2, 256)).astype(np.float32)
    q8, _, _ = R.quantize_q8(x)
    for g in range(2):
        q, _ = naive_q8_group(x[1, g * 128 : (g + 1) * 128])
        for i in range(128):
            assert q8[1, g * 128 + (i % 4) * 32 + i // 4] == q[i]
    assert sorted(R.plane_order(256).tolist()) == list(range(256))


def test_quantize_q8_rejects_bad_input():
    with pytest.raises(ValueError, match="float32"):
        R.quantize_q8(np.zeros((1, 128)))
    with pytest.raises(ValueError, match=r"\(1, 100\)"):
        R.quantize_q8(np.zeros((1, 100), np.float32))


# ---- matmul --------------------------------------------------------------------------------


def random_weights(n, k, seed):
    rng = np.random.default_rng(seed)
    return F.pq2_quantize(rng.standard_normal((n, k)) * 0.02)


@pytest.mark.parametrize(
    "m,n,k", [(1, 33, 128), (3, 17, 384), (8, 65, 640), (16, 256, 2048)], ids=lambda v: str(v)
)
def test_matmul_q8_close_to_float(m, n, k):
    raw = random_weights(n, k, seed=n)
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    err = R.rel_rms(R.matmul_q8(raw, n, k, x), R.matmul_float(raw, n, k, x))
    assert err <= Q8_VS_FLOAT_REL_TOL, err


def test_matmul_q8_equals_plane_order_identity():
    # dot(code - 1, q) = dot(code, q) - sum(q), with codes and q both in plane order: the sum
    # the library computes.
    n, k, m = 9, 640, 4
    rng = np.random.default_rng(3)
    raw = F.pq2_pack(
        rng.integers(0, 4, (n * k // 128, 128)), rng.uniform(-1, 1, n * k // 128).astype(np.float16)
    ).reshape(-1)
    x = rng.standard_normal((m, k)).astype(np.float32)
    q8, sx, sums = R.quantize_q8(x)
    codes, dw = F.pq2_unpack(raw)
    cp = codes.reshape(n, k)[:, R.plane_order(k)].astype(np.int64).reshape(n, -1, 128)
    qp = q8.astype(np.int64).reshape(m, -1, 128)
    ints = np.einsum("ngi,mgi->mng", cp, qp) - sums[:, None, :]
    want = np.einsum(
        "mng,mg,ng->mn",
        ints.astype(np.float64),
        sx.astype(np.float64),
        dw.astype(np.float64).reshape(n, -1),
    )
    got = R.matmul_q8(raw, n, k, x)
    assert R.rel_rms(got, want) <= F64_REL_TOL, R.worst_element(got, want)


def test_matmul_float_is_dequantised_product():
    raw = random_weights(5, 256, seed=4)
    x = np.random.default_rng(5).standard_normal((2, 256)).astype(np.float32)
    want = x.astype(np.float64) @ F.pq2_dequantize(raw, 5, 256).astype(np.float64).T
    assert np.array_equal(R.matmul_float(raw, 5, 256, x), want)


def test_rel_rms():
    assert R.rel_rms([1.0, 2.0], [1.0, 2.0]) == 0
    assert R.rel_rms([np.nan, 2.0], [1.0, 2.0]) == float("inf")
    assert R.rel_rms([0.0], [0.0]) == 0 and R.rel_rms([1.0], [0.0]) == float("inf")
    assert abs(R.rel_rms([3.0, 4.0], [3.0, 4.5]) - 0.5 / np.hypot(3, 4.5)) < 1e-15


def test_gated_rmsnorm_is_the_model_references_per_head_norm():
    """reference.gated_rmsnorm (the gated producer's oracle) against the whole-model reference's
    own form of the same norm (pyq2.spec.qwen35_layers: rms_norm per head, times silu(z)), and
    one head worked through by hand."""
    from pyq2.spec.qwen35_layers import rms_norm, silu

    r = np.random.default_rng(9)
    m, heads, hd = 3, 5, 8
    o, z = r.standard_normal((2, m, heads * hd)) * 2
    w = 1 + 0.1 * r.standard_normal(hd)
    got = R.gated_rmsnorm(o, z, w, 1e-6, heads)
    model = rms_norm(o.reshape(m, heads, hd), w, 1e-6) * silu(z.reshape(m, heads, hd))
    assert np.allclose(got, model.reshape(m, -1), rtol=1e-6, atol=1e-6)  # model's: float32
    h = o[1, hd : 2 * hd]
    want = (
        h
        / np.sqrt(np.mean(h * h) + 1e-6)
        * w
        * z[1, hd : 2 * hd]
        / (1 + np.exp(-z[1, hd : 2 * hd]))
    )
    assert np.allclose(got[1, hd : 2 * hd], want, rtol=1e-12)
