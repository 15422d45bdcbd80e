"""The C host half of libpq2 (through pyq2.lib.cpu) against the numpy references, bit for bit.

Skipped when the library cannot be loaded, unless PYQ2_REQUIRE_NATIVE is set (CI sets it): then a
missing library fails every test loudly.
"""

import re

import numpy as np
import pytest

from pyq2.errors import Pq2Error
from pyq2.spec import formats as F
from pyq2.spec import layouts as L
from pyq2.spec import reference as R

from ..conftest import (
    LAYOUT_RTS,
    conversion_cases,
    conversion_id,
    native_or_skip,
    random_raw,
    shape_id,
    ternary_pq2,
)

# pq2_matmul_host accumulates in fp32 (per-group dot scaled by d_w * d_x, summed in increasing
# g); reference.matmul_q8 is the same Q8 problem in float64. The gap is fp32 rounding only.
MATMUL_REL_TOL = 1e-5

SHAPES = [(1, 128), (3, 384), (17, 640), (33, 128), (65, 384), (300, 2048)]


@pytest.fixture(scope="module", autouse=True)
def native():
    return native_or_skip()


@pytest.fixture(scope="module")
def host():
    from pyq2.lib import cpu as host

    return host


# ---- references and data ------------------------------------------------------------------


def edge_activations(m, k, seed):
    """Gaussian rows with the Q8 edge cases planted in whole groups."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100, (m, 1))).astype(np.float32)
    g = x.reshape(m, -1, 128)
    g[0, 0] = 0.0  # zero group: divide by 1
    if g.shape[1] > 1:
        g[0, 1, :10] = [127, 0.5, 1.5, 2.5, -2.5, -0.5, 126.5, -126.5, 3.5, -0.0]  # ties
        g[0, 1, 10:] = rng.uniform(-127, 127, 118).round()
    if g.shape[1] > 2:
        g[0, 2] *= np.float32(1e-40)  # subnormals
    if m > 1:
        g[1, 0] *= np.float32(1e30)
        g[1, -1] = -0.0
    if m > 2:
        g[2, 0] = 0.0
        g[2, 0, ::7] = np.float32(1.4e-45)  # scale underflows to 0
    return x


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


# ---- library basics -----------------------------------------------------------------------


def test_abi_and_last_error_after_success(native, host):
    ffi, lib = native
    assert lib.pq2_abi_version() == 7
    assert host.layout_bytes("tiles", 17, 384, 2) == L.layout_bytes("tiles", 17, 384, 2)
    assert ffi.string(lib.pq2_last_error()) == b""


@pytest.mark.parametrize("layout,rt", LAYOUT_RTS)
@pytest.mark.parametrize("n,k", SHAPES, ids=[shape_id(s) for s in SHAPES])
def test_layout_bytes(host, n, k, layout, rt):
    assert host.layout_bytes(layout, n, k, rt) == L.layout_bytes(layout, n, k, rt)


# ---- layouts, bit for bit -----------------------------------------------------------------

LAYOUT_CASES = conversion_cases(SHAPES)


@pytest.mark.parametrize(
    "shape,src,dst,src_rt,dst_rt", LAYOUT_CASES, ids=map(conversion_id, LAYOUT_CASES)
)
def test_convert_layout(host, shape, src, dst, src_rt, dst_rt):
    n, k = shape
    raw = random_raw(n, k, seed=n * k)
    src_buf = L.from_raw(raw, n, k, src, src_rt)
    got = host.convert_layout(src_buf, n, k, src, dst, src_rt, dst_rt)
    want = L.convert(src_buf, n, k, src, dst, src_rt, dst_rt)
    assert got.dtype == np.uint8 and np.array_equal(got, want)


def test_convert_from_tiles_ignores_padding(host):
    n, k, rt = 5, 256, 1
    raw = random_raw(n, k, seed=1)
    tiles = L.to_tiles(raw, n, k, rt)
    junk = tiles.copy()
    # Overwrite the code bytes of padding rows (any lane's row gid + 8 >= 8 > 5: lane bytes 4-7
    # and 12-15) and the padding scales; the raw result must not change.
    for g in range(2):
        for lane in range(32):
            o = g * 512 + lane * 16
            junk[o + 4 : o + 8] = 0xAA
            junk[o + 12 : o + 16] = 0xAA
    scales = junk[2 * 512 :].view("<u2").reshape(2, 16)
    rows = np.arange(16)  # sub-tile row 8h + i has scale index 2i + h
    scales[:, (2 * (rows % 8) + rows // 8)[rows >= n]] = 0x7E00
    assert np.array_equal(host.convert_layout(junk, n, k, "tiles", "raw", rt), raw)


# ---- formats, bit for bit -----------------------------------------------------------------


@pytest.mark.parametrize("nb", [1, 3, 17, 1000])
def test_ptq1_to_pq2(host, nb):
    # Random bytes: the digit decoding is defined for every byte value, canonical or not.
    src = np.random.default_rng(nb).integers(0, 256, nb * 28, dtype=np.uint8)
    assert np.array_equal(host.ptq1_to_pq2(src), F.ptq1_to_pq2(src))


@pytest.mark.parametrize("nb", [1, 3, 17, 1000])
def test_tq2_to_pq2(host, nb):
    src = np.random.default_rng(nb).integers(0, 256, nb * 66, dtype=np.uint8)
    assert np.array_equal(host.tq2_to_pq2(src), F.tq2_to_pq2(src))


@pytest.mark.parametrize("nb", [1, 3, 17, 1000])
def test_pq2_to_ptq1(host, nb):
    src = ternary_pq2(np.random.default_rng(nb), nb, finite=False)
    got = host.pq2_to_ptq1(src)
    assert np.array_equal(got, F.pq2_to_ptq1(src))
    assert np.array_equal(host.ptq1_to_pq2(got), src)


# ---- arithmetic ---------------------------------------------------------------------------

DEQ_CASES = [(s, lay, rt) for s in SHAPES for lay, rt in LAYOUT_RTS]


@pytest.mark.parametrize(
    "shape,layout,rt", DEQ_CASES, ids=[f"{shape_id(s)}-{lay}{rt or ''}" for s, lay, rt in DEQ_CASES]
)
def test_dequantize(host, shape, layout, rt):
    n, k = shape
    raw = random_raw(n, k, seed=3, finite=True)
    got = host.dequantize(L.from_raw(raw, n, k, layout, rt), n, k, layout, rt)
    want = F.pq2_dequantize(raw, n, k)
    assert got.shape == (n, k) and got.dtype == np.float32
    assert np.array_equal(bits(got), bits(want)), R.worst_element(got, want)


Q8_SHAPES = [(1, 128), (2, 384), (3, 640), (16, 4096), (5, 128 * 41)]


@pytest.mark.parametrize("m,k", Q8_SHAPES, ids=[f"m{m}-k{k}" for m, k in Q8_SHAPES])
def test_quantize_q8(host, m, k):
    x = edge_activations(m, k, seed=m + k)
    q8, scales, sums = host.quantize_q8(x)
    wq8, wscales, wsums = R.quantize_q8(x)
    assert np.array_equal(q8, wq8), np.argwhere(q8 != wq8)[:5]
    assert np.array_equal(bits(scales), bits(wscales)), np.argwhere(bits(scales) != bits(wscales))
    assert np.array_equal(sums, wsums)


def test_quantize_q8_nan_inf(host):
    """The C reference and numpy agree on NaN and inf inputs (NaN ignored by max|x|, NaN
    quotients give 0)."""
    x = np.random.default_rng(7).standard_normal((2, 640)).astype(np.float32)
    x[0, 3], x[0, 128:256], x[1, 300], x[1, 400:402] = np.nan, np.nan, np.inf, [np.nan, -np.inf]
    for got, want in zip(host.quantize_q8(x), R.quantize_q8(x), strict=True):
        assert np.array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


def test_quantize_q8_non_contiguous(host):
    x = edge_activations(4, 512, seed=9)
    xt = np.asfortranarray(x)
    assert np.array_equal(host.quantize_q8(xt)[0], R.quantize_q8(x)[0])
    wide = np.zeros((4, 1024), np.float32)
    wide[:, ::2] = x
    assert np.array_equal(host.quantize_q8(wide[:, ::2])[0], R.quantize_q8(x)[0])


MATMUL_CASES = [
    (m, n, k, lay, rt)
    for m, (n, k) in zip([1, 2, 3, 4, 5, 16], SHAPES, strict=True)
    for lay, rt in LAYOUT_RTS
]


@pytest.mark.parametrize(
    "m,n,k,layout,rt",
    MATMUL_CASES,
    ids=[f"m{c[0]}-n{c[1]}-k{c[2]}-{c[3]}{c[4] or ''}" for c in MATMUL_CASES],
)
def test_matmul(host, m, n, k, layout, rt):
    raw = random_raw(n, k, seed=k + n, finite=True)
    # Keep scales moderate so the products stay far from fp32 overflow.
    raw.reshape(-1, 34)[:, :2] = (
        np.random.default_rng(n)
        .uniform(-2, 2, raw.size // 34)
        .astype(np.float16)
        .view(np.uint8)
        .reshape(-1, 2)
    )
    x = edge_activations(m, k, seed=m)
    x[np.abs(x) > 1e6] = 1.0  # the 1e30 group would swamp the comparison
    y = host.matmul(L.from_raw(raw, n, k, layout, rt), n, k, x, layout, rt)
    want = R.matmul_q8(raw, n, k, x)
    assert y.shape == (m, n) and y.dtype == np.float32
    err = R.rel_rms(y, want)
    assert err <= MATMUL_REL_TOL, f"rel RMS {err:.3g}; {R.worst_element(y, want)}"


def test_matmul_same_bits_in_every_layout(host):
    n, k, m = 65, 640, 3
    raw = random_raw(n, k, seed=11, finite=True)
    raw.reshape(-1, 34)[:, :2] = np.array([0.01], np.float16).view(np.uint8)
    x = np.random.default_rng(12).standard_normal((m, k)).astype(np.float32)
    y = host.matmul(raw, n, k, x)
    for layout, rt in LAYOUT_RTS[1:]:  # every layout but raw
        y2 = host.matmul(L.from_raw(raw, n, k, layout, rt), n, k, x, layout, rt)
        assert np.array_equal(bits(y2), bits(y)), f"{layout} rt={rt}"
    assert np.array_equal(host.matmul(raw, n, k, x[1]), y[1])


# ---- errors -------------------------------------------------------------------------------


def test_k_not_multiple_of_128(host):
    with pytest.raises(Pq2Error) as e:
        host.convert_layout(np.zeros(34, np.uint8), 1, 100, "raw", "planes")
    assert e.value.status_name == "PQ2_ERR_SHAPE" and "100" in e.value.message
    with pytest.raises(Pq2Error) as e:
        host.quantize_q8(np.zeros((2, 100), np.float32))
    assert e.value.status_name == "PQ2_ERR_SHAPE" and "100" in e.value.message


def test_rt_3(host):
    raw = random_raw(16, 128)
    with pytest.raises(Pq2Error) as e:
        host.convert_layout(raw, 16, 128, "raw", "tiles", dst_rt=3)
    assert e.value.status_name == "PQ2_ERR_INVALID_ARGUMENT" and "3" in e.value.message
    with pytest.raises(Pq2Error) as e:
        host.layout_bytes("tiles", 16, 128, 3)
    assert e.value.status_name == "PQ2_ERR_INVALID_ARGUMENT"


def test_bad_layout_value(host):
    with pytest.raises(Pq2Error) as e:
        host.layout_bytes(7, 16, 128)
    assert e.value.status_name == "PQ2_ERR_INVALID_ARGUMENT" and "7" in e.value.message


def test_null_pointers(native):
    ffi, lib = native
    dst = ffi.new("uint8_t[]", 34)
    assert lib.pq2_ptq1_to_pq2(ffi.NULL, 28, dst, 34, 1) == lib.PQ2_ERR_NULL_POINTER
    assert lib.pq2_ptq1_to_pq2(dst, 28, ffi.NULL, 34, 1) == lib.PQ2_ERR_NULL_POINTER
    assert lib.pq2_layout_bytes(0, 1, 128, 0, ffi.NULL) == lib.PQ2_ERR_NULL_POINTER
    assert lib.pq2_convert_layout(ffi.NULL, dst, 34, 0, 0) == lib.PQ2_ERR_NULL_POINTER
    w = ffi.new(
        "pq2_weights *", {"data": ffi.NULL, "bytes": 34, "n": 1, "k": 128, "layout": 0, "rt": 0}
    )
    assert lib.pq2_convert_layout(w, dst, 34, 1, 0) == lib.PQ2_ERR_NULL_POINTER
    assert (
        lib.pq2_quantize_q8_host(ffi.NULL, 512, 1, 128, ffi.NULL, 128, ffi.NULL, 4, ffi.NULL, 4)
        == lib.PQ2_ERR_NULL_POINTER
    )
    assert ffi.string(lib.pq2_last_error()) != b""


def test_size_mismatch(native, host):
    ffi, lib = native
    # Not a whole number of blocks: the wrapper passes the true byte count, the library refuses.
    for fn, size in [(host.ptq1_to_pq2, 29), (host.tq2_to_pq2, 67), (host.pq2_to_ptq1, 35)]:
        with pytest.raises(Pq2Error) as e:
            fn(np.zeros(size, np.uint8))
        assert e.value.status_name == "PQ2_ERR_SHAPE" and str(size) in e.value.message, fn
    # dst_bytes one short of what the layout needs.
    raw = np.zeros(3 * 34, np.uint8)
    src = ffi.new(
        "pq2_weights *",
        {"data": ffi.from_buffer(raw), "bytes": raw.size, "n": 1, "k": 384, "layout": 0, "rt": 0},
    )
    dst = ffi.new("uint8_t[]", 16 * 3 * 34)
    assert lib.pq2_convert_layout(src, dst, 16 * 3 * 34 - 1, 2, 1) == lib.PQ2_ERR_SHAPE
    assert str(16 * 3 * 34 - 1) in ffi.string(lib.pq2_last_error()).decode()
    out = ffi.new("float[]", 384)
    assert lib.pq2_dequantize_host(src, out, 384 * 4 + 4) == lib.PQ2_ERR_SHAPE
    # Every buffer's size is checked against the shape: one byte short is refused, naming the
    # entry point, the buffer and both sizes; a larger buffer is fine.
    src.bytes = raw.size - 1
    assert lib.pq2_dequantize_host(src, out, 384 * 4) == lib.PQ2_ERR_SHAPE
    msg = ffi.string(lib.pq2_last_error()).decode()
    assert "pq2_dequantize_host" in msg and "bytes=101" in msg and "102" in msg, msg
    src.bytes = raw.size + 100
    assert lib.pq2_dequantize_host(src, out, 384 * 4) == lib.PQ2_OK
    src.bytes = raw.size
    x = ffi.new("float[]", 2 * 384)
    q8, sc, su = ffi.new("int8_t[]", 2 * 384), ffi.new("float[]", 6), ffi.new("int32_t[]", 6)
    full = (2 * 384 * 4, 2 * 384, 6 * 4, 6 * 4)
    assert lib.pq2_quantize_q8_host(x, full[0], 2, 384, q8, full[1], sc, full[2], su, full[3]) == 0
    for i, name in enumerate(["x", "q8", "scales", "sums"]):
        sizes = list(full)
        sizes[i] -= 1
        st = lib.pq2_quantize_q8_host(x, sizes[0], 2, 384, q8, sizes[1], sc, sizes[2], su, sizes[3])
        msg = ffi.string(lib.pq2_last_error()).decode()
        assert st == lib.PQ2_ERR_SHAPE and f"pq2_quantize_q8_host: {name} holds" in msg, msg
    y = ffi.new("float[]", 2)
    assert lib.pq2_matmul_host(src, x, 2 * 384 * 4, 2, y, 8) == lib.PQ2_OK
    assert lib.pq2_matmul_host(src, x, 2 * 384 * 4 - 4, 2, y, 8) == lib.PQ2_ERR_SHAPE
    assert lib.pq2_matmul_host(src, x, 2 * 384 * 4, 2, y, 7) == lib.PQ2_ERR_SHAPE
    assert "pq2_matmul_host: y holds 7 bytes" in ffi.string(lib.pq2_last_error()).decode()
    # Wrapper-side checks.
    with pytest.raises(ValueError, match="takes 102 bytes, the buffer has 101"):
        host.dequantize(raw[:-1], 1, 384)
    with pytest.raises(ValueError, match="K=384"):
        host.matmul(raw, 1, 384, np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError, match="float32, got float64"):
        host.matmul(raw, 1, 384, np.zeros((1, 384)))
    with pytest.raises(ValueError, match="'bogus'"):
        host.dequantize(raw, 1, 384, "bogus")


def test_code3_into_ptq1_names_row_and_block(host):
    codes = np.ones((12, 128), np.uint8)
    codes[7, 99] = 3
    raw = F.pq2_pack(codes, np.ones(12, np.float16)).reshape(-1)
    with pytest.raises(Pq2Error) as e:
        host.pq2_to_ptq1(raw, blocks_per_row=3)
    assert e.value.status_name == "PQ2_ERR_UNREPRESENTABLE"
    msg = e.value.message
    # Block 7 with 3 blocks per row is row 2, block 1 of that row.
    assert re.search(r"\brow\D{0,3}2\b", msg), msg
    assert re.search(r"\bblock\D{0,3}(1|7)\b", msg), msg
