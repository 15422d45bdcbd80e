// rotate.cu - the CUDA entry points of the rotation and the fused producers of the Q8
// operand (pq2.h). Each checks its arguments, then fills one row transform (rotate/rotate.h) and
// launches it. The rotation's check and the launch are shared with api/get_rows_dequantize.cu
// (api/transform.h).
#include "api/transform.h"
#include "device/device.h"
#include "device/dtypes.cuh"
#include "device/launch.cuh"
#include "quantize/quantize.h"
#include "rotate/rotate.h"

namespace {

// m rows of `width` elements: m > 0, width a positive multiple of 128.
pq2_status check_rows(const char *fn, int64_t m, int64_t width)
{
    if (m <= 0 || width <= 0 || width % 128 != 0)
        return pq2_set_error(
            PQ2_ERR_SHAPE, "%s: m=%lld width=%lld: need m > 0 and width a positive multiple of 128",
            fn, (long long)m, (long long)width);
    return PQ2_OK;
}

// A producer's common part: sizes, rotation, the Q8 operand; the source is the caller's.
pq2_status begin_producer(const char *fn, int32_t dtype, int64_t m, int64_t width,
                          const pq2_rotation *rot, const pq2_q8 *out, pq2_row_transform *t)
{
    *t = pq2_row_transform{};
    PQ2_CHECK(pq2_check_dtype(fn, "dtype", dtype));
    PQ2_CHECK(check_rows(fn, m, width));
    PQ2_CHECK(pq2_api_set_rotation(fn, rot, width, t));
    pq2_q8_sink o;
    PQ2_CHECK(pq2_q8_resolve(fn, "out", out, m, width, &o));
    t->q8 = o.q8, t->scales = o.scales, t->sums = o.sums, t->bits = o.bits, t->records = o.records;
    t->x_dtype = dtype, t->m = m, t->width = width, t->ld = width;
    return PQ2_OK;
}

// An RMSNorm's weight and eps: a weight, of a known dtype; eps finite and >= 0.
pq2_status check_norm(const char *fn, const void *norm_weight, int32_t norm_dtype, float eps)
{
    PQ2_CHECK_PTR(fn, norm_weight);
    PQ2_CHECK(pq2_check_dtype(fn, "norm_dtype", norm_dtype));
    if (!(eps >= 0.0f) || eps == __builtin_inff())
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: eps=%g must be finite and >= 0", fn,
                             (double)eps);
    return PQ2_OK;
}

// The row stride `name` of a second input: at least width, a multiple of 8 (16-byte rows).
pq2_status check_ld(const char *fn, const char *name, int64_t ld, int64_t width)
{
    if (ld < width || ld % 8 != 0)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: %s=%lld must be >= width=%lld and a multiple of 8",
                             fn, name, (long long)ld, (long long)width);
    return PQ2_OK;
}

bool overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    const uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a && b && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

// api/transform.h
pq2_status pq2_api_set_rotation(const char *fn, const pq2_rotation *rot, int64_t width,
                                pq2_row_transform *t)
{
    t->log2b = 0, t->signs = nullptr;
    if (rot == nullptr) return PQ2_OK;
    const int32_t b = rot->block;
    if (b < 64 || b > 4096 || (b & (b - 1)) != 0)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: rot->block=%d is not a power of two in 64..4096", fn, (int)b);
    if (width % b != 0)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: width=%lld is not a multiple of the rotation's block %d", fn,
                             (long long)width, (int)b);
    PQ2_CHECK_ALIGN(fn, rot->signs, 4);
    while ((1 << t->log2b) < b) ++t->log2b;
    t->signs = rot->signs;
    return PQ2_OK;
}

// api/transform.h
pq2_status pq2_api_launch_transform(const char *fn, const pq2_row_transform &t, void *stream)
{
    pq2_device dev;
    PQ2_CHECK(pq2_device_get(fn, &dev));
    PQ2_CHECK(
        pq2_row_transform_launch(fn, t, pq2_pdl_ok(), dev.sms, static_cast<cudaStream_t>(stream)));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_rotate_cuda(const void *x, int32_t x_dtype, void *y,
                                              int32_t y_dtype, int64_t m, int64_t width,
                                              const pq2_rotation *rot, int32_t flags, void *stream)
{
    static const char fn[] = "pq2_rotate_cuda";
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK_PTR(fn, y);
    PQ2_CHECK_PTR(fn, rot);
    PQ2_CHECK(pq2_check_dtype(fn, "x_dtype", x_dtype));
    PQ2_CHECK(pq2_check_dtype(fn, "y_dtype", y_dtype));
    PQ2_CHECK(check_rows(fn, m, width));
    if (flags != 0 && flags != PQ2_ROTATE_INVERSE)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: flags=%d is not 0 or PQ2_ROTATE_INVERSE (1)", fn, (int)flags);
    PQ2_CHECK_ALIGN(fn, x, 16);
    PQ2_CHECK_ALIGN(fn, y, 16);
    const size_t n = (size_t)m * (size_t)width;
    if (!(x == y && x_dtype == y_dtype) &&
        overlap(x, n * pq2_dtype_bytes(x_dtype), y, n * pq2_dtype_bytes(y_dtype)))
        return pq2_set_error(
            PQ2_ERR_INVALID_ARGUMENT,
            "%s: x %p and y %p overlap; only y == x with the same dtype rotates in place", fn, x,
            y);
    pq2_row_transform t{};
    PQ2_CHECK(pq2_api_set_rotation(fn, rot, width, &t));
    t.source = PQ2_SOURCE_PLAIN, t.x = x, t.x_dtype = x_dtype, t.ld = width,
    t.inverse = flags & PQ2_ROTATE_INVERSE;
    t.y = y, t.y_dtype = y_dtype, t.m = m, t.width = width;
    return pq2_api_launch_transform(fn, t, stream);
}

extern "C" PQ2_API pq2_status pq2_norm_rotate_q8_cuda(
    const void *x, const void *residual, void *h_out, int32_t dtype, const void *norm_weight,
    int32_t norm_dtype, float eps, int64_t m, int64_t width, const pq2_rotation *rot,
    const pq2_q8 *out, void *normed, int32_t normed_dtype, void *stream)
{
    static const char fn[] = "pq2_norm_rotate_q8_cuda";
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK(check_norm(fn, norm_weight, norm_dtype, eps));
    if (normed) PQ2_CHECK(pq2_check_dtype(fn, "normed_dtype", normed_dtype));
    pq2_row_transform t;
    PQ2_CHECK(begin_producer(fn, dtype, m, width, rot, out, &t));
    PQ2_CHECK_ALIGN(fn, x, 16);
    PQ2_CHECK_ALIGN(fn, residual, 16);
    PQ2_CHECK_ALIGN(fn, h_out, 16);
    PQ2_CHECK_ALIGN(fn, norm_weight, 16);
    PQ2_CHECK_ALIGN(fn, normed, 16);
    const size_t bytes = (size_t)m * (size_t)width * pq2_dtype_bytes(dtype);
    if (overlap(h_out, bytes, x, bytes) || overlap(h_out, bytes, residual, bytes))
        return pq2_set_error(
            PQ2_ERR_INVALID_ARGUMENT,
            "%s: h_out %p overlaps x %p or residual %p (every block of a row reads x and the "
            "residual whole)",
            fn, h_out, x, residual);
    t.source = PQ2_SOURCE_NORM, t.x = x, t.residual = residual, t.h_out = h_out;
    t.norm_weight = norm_weight, t.norm_dtype = norm_dtype, t.eps = eps;
    t.normed = normed, t.normed_dtype = normed_dtype;
    return pq2_api_launch_transform(fn, t, stream);
}

extern "C" PQ2_API pq2_status pq2_swiglu_rotate_q8_cuda(const void *gate, const void *up,
                                                        int64_t ld, int32_t dtype, int64_t m,
                                                        int64_t width, const pq2_rotation *rot,
                                                        const pq2_q8 *out, void *stream)
{
    static const char fn[] = "pq2_swiglu_rotate_q8_cuda";
    PQ2_CHECK_PTR(fn, gate);
    PQ2_CHECK_PTR(fn, up);
    pq2_row_transform t;
    PQ2_CHECK(begin_producer(fn, dtype, m, width, rot, out, &t));
    PQ2_CHECK(check_ld(fn, "ld", ld, width));
    PQ2_CHECK_ALIGN(fn, gate, 16);
    PQ2_CHECK_ALIGN(fn, up, 16);
    t.source = PQ2_SOURCE_SWIGLU, t.x = gate, t.x2 = up, t.ld = ld;
    return pq2_api_launch_transform(fn, t, stream);
}

extern "C" PQ2_API pq2_status pq2_rotate_q8_cuda(const void *x, int32_t dtype, int64_t m,
                                                 int64_t width, const pq2_rotation *rot,
                                                 int32_t v_heads, int32_t k_heads,
                                                 const pq2_q8 *out, void *stream)
{
    static const char fn[] = "pq2_rotate_q8_cuda";
    PQ2_CHECK_PTR(fn, x);
    pq2_row_transform t;
    PQ2_CHECK(begin_producer(fn, dtype, m, width, rot, out, &t));
    PQ2_CHECK_ALIGN(fn, x, 16);
    if (v_heads < 0 ||
        (v_heads > 0 && (k_heads <= 0 || v_heads % k_heads != 0 || width % v_heads != 0 ||
                         (width / v_heads) % 4 != 0 || width > INT32_MAX)))
        return pq2_set_error(
            PQ2_ERR_SHAPE,
            "%s: v_heads=%d k_heads=%d width=%lld: the permutation needs v_heads a multiple of "
            "k_heads, width / v_heads a multiple of 4 and width <= 2^31 - 1 (v_heads 0: none)",
            fn, (int)v_heads, (int)k_heads, (long long)width);
    t.source = PQ2_SOURCE_PERMUTE, t.x = x, t.nv = v_heads, t.nk = k_heads;
    return pq2_api_launch_transform(fn, t, stream);
}

extern "C" PQ2_API pq2_status pq2_gated_norm_rotate_q8_cuda(
    const void *o, const void *z, int64_t ld_z, int32_t z_dtype, const void *norm_weight,
    int32_t norm_dtype, float eps, int64_t m, int64_t width, const pq2_rotation *rot,
    int32_t v_heads, int32_t k_heads, const pq2_q8 *out, void *stream)
{
    static const char fn[] = "pq2_gated_norm_rotate_q8_cuda";
    PQ2_CHECK_PTR(fn, o);
    PQ2_CHECK_PTR(fn, z);
    PQ2_CHECK(pq2_check_dtype(fn, "z_dtype", z_dtype));
    PQ2_CHECK(check_norm(fn, norm_weight, norm_dtype, eps));
    pq2_row_transform t;
    PQ2_CHECK(begin_producer(fn, z_dtype, m, width, rot, out, &t));
    const int64_t hd = v_heads > 0 ? width / v_heads : 0;
    if (v_heads <= 0 || width % v_heads != 0 || hd < 4 || hd > 128 || (hd & (hd - 1)) != 0 ||
        k_heads < 0 || (k_heads > 0 && v_heads % k_heads != 0) || width > INT32_MAX)
        return pq2_set_error(
            PQ2_ERR_SHAPE,
            "%s: v_heads=%d k_heads=%d width=%lld: need heads of width / v_heads a power of two "
            "in 4..128, v_heads a multiple of k_heads (k_heads 0: no permutation) and width <= "
            "2^31 - 1",
            fn, (int)v_heads, (int)k_heads, (long long)width);
    PQ2_CHECK(check_ld(fn, "ld_z", ld_z, width));
    PQ2_CHECK_ALIGN(fn, o, 16);
    PQ2_CHECK_ALIGN(fn, z, 16);
    PQ2_CHECK_ALIGN(fn, norm_weight, 16);
    t.source = PQ2_SOURCE_GATED, t.x = o, t.x2 = z, t.ld = ld_z;
    t.norm_weight = norm_weight, t.norm_dtype = norm_dtype, t.eps = eps;
    t.nv = v_heads, t.nk = k_heads;
    return pq2_api_launch_transform(fn, t, stream);
}
