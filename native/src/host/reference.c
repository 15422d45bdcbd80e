/*
 * reference.c - host reference arithmetic: dequantisation, group-128 Q8 activations and the
 * Q8 x PQ2_0 matmul that the GPU kernels are checked against.
 *
 * fp32 operation order (every operation rounds to fp32, round to nearest even; no FMA: build
 * with -ffp-contract=off, never -ffast-math; subnormals are kept, not flushed):
 *
 *   quantise one group x[0..127] of a row:
 *     amax  = max over i of fabsf(x[i])           exact; a NaN never wins the comparison
 *     scale = amax * (1.0f / 127.0f)              one multiply by the fp32 constant 0x3c010204
 *     div   = scale > 0 ? scale : 1.0f            (scale can underflow to 0 for amax < ~1.8e-43)
 *     q[i]  = clamp(rintf(x[i] / div), -127, 127) correctly rounded division, ties to even;
 *                                                  NaN -> 0 (so +-inf makes the whole group 0)
 *     sum   = sum of q[i]                          int32, exact
 *
 *   y[m][n], acc starting at +0.0f, for g = 0, 1, ..., K/128 - 1 in order:
 *     idot = sum over i of code[i] * q[i] - sum   int32, exact (|idot| <= 32512 < 2^24)
 *     dwx  = f16_to_f32(d_w[n][g]) * scale[m][g]  rounded
 *     t    = (float)idot * dwx                    the conversion is exact; the product rounded
 *     acc  = acc + t                              rounded
 *   y[m][n] = acc
 */
#include <inttypes.h>
#include <math.h>

#include "common/view.h"

/* Quantises one 128-group of x into q (plane order), *scale and *sum (op order: file comment). */
static void quantize_group(const float *x, int8_t *q, float *scale, int32_t *sum)
{
    float amax = 0.0f;
    for (int i = 0; i < PQ2_BLOCK_WEIGHTS; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    float s = amax * (1.0f / 127.0f);
    float div = s > 0.0f ? s : 1.0f;
    int32_t total = 0;
    for (int i = 0; i < PQ2_BLOCK_WEIGHTS; i++) {
        float r = rintf(x[i] / div);
        int v;
        if (r >= 127.0f)
            v = 127;
        else if (r <= -127.0f)
            v = -127;
        else if (isnan(r))
            v = 0;
        else
            v = (int)r;
        q[pq2_q8_plane_index(i)] = (int8_t)v;
        total += v;
    }
    *scale = s;
    *sum = total;
}

/* Checks m > 0 and that m x k floats fit in memory; k was checked by the caller. */
static pq2_status check_rows(const char *fn, const char *name, int64_t m, int64_t cols)
{
    uint64_t bytes;
    if (m <= 0) return pq2_set_error(PQ2_ERR_SHAPE, "%s: %s=%" PRId64 " must be > 0", fn, name, m);
    if (!pq2_mul_size((uint64_t)m, (uint64_t)cols, &bytes) || !pq2_mul_size(bytes, 4, &bytes))
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: %s=%" PRId64 " x %" PRId64 " floats are too large",
                             fn, name, m, cols);
    return PQ2_OK;
}

PQ2_API pq2_status pq2_dequantize_host(const pq2_weights *w, float *out, size_t out_bytes)
{
    static const char fn[] = "pq2_dequantize_host";
    pq2_view v;
    PQ2_CHECK(pq2_view_of_weights(&v, fn, "", w));
    PQ2_CHECK_PTR(fn, out);
    PQ2_CHECK_ALIGN(fn, out, PQ2_ALIGNOF(float));
    PQ2_CHECK(check_rows(fn, "n", v.n, v.k));
    size_t need = (size_t)v.n * (size_t)v.k * sizeof(float);
    if (out_bytes != need)
        return pq2_set_error(
            PQ2_ERR_SHAPE, "%s: out_bytes %zu != %zu needed for n=%" PRId64 " k=%" PRId64 " floats",
            fn, out_bytes, need, v.n, v.k);

    pq2_block blk;
    for (int64_t row = 0; row < v.n; row++) {
        for (int64_t g = 0; g < v.groups; g++) {
            pq2_view_read_block(&v, row, g, &blk);
            float d = pq2_f16_to_f32(blk.d);
            float *o = out + (size_t)row * (size_t)v.k + (size_t)g * PQ2_BLOCK_WEIGHTS;
            for (int j = 0; j < PQ2_BLOCK_WEIGHTS; j++)
                o[j] = (float)((int)pq2_get_code(blk.qs, j) - 1) * d;
        }
    }
    return pq2_ok();
}

PQ2_API pq2_status pq2_quantize_q8_host(const float *x, size_t x_bytes, int64_t m, int64_t k,
                                        int8_t *q8, size_t q8_bytes, float *scales,
                                        size_t scales_bytes, int32_t *sums, size_t sums_bytes)
{
    static const char fn[] = "pq2_quantize_q8_host";
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK_PTR(fn, q8);
    PQ2_CHECK_PTR(fn, scales);
    PQ2_CHECK_PTR(fn, sums);
    PQ2_CHECK_ALIGN(fn, x, PQ2_ALIGNOF(float));
    PQ2_CHECK_ALIGN(fn, scales, PQ2_ALIGNOF(float));
    PQ2_CHECK_ALIGN(fn, sums, PQ2_ALIGNOF(int32_t));
    if (k <= 0 || k % PQ2_BLOCK_WEIGHTS != 0)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: k=%" PRId64 " is not a positive multiple of 128",
                             fn, k);
    PQ2_CHECK(check_rows(fn, "m", m, k));
    const int64_t groups = m * (k / PQ2_BLOCK_WEIGHTS); /* rows are contiguous: groups run on */
    PQ2_CHECK(pq2_check_buffer(fn, "x", x_bytes, (uint64_t)(m * k), sizeof(float)));
    PQ2_CHECK(pq2_check_buffer(fn, "q8", q8_bytes, (uint64_t)(m * k), 1));
    PQ2_CHECK(pq2_check_buffer(fn, "scales", scales_bytes, (uint64_t)groups, sizeof(float)));
    PQ2_CHECK(pq2_check_buffer(fn, "sums", sums_bytes, (uint64_t)groups, sizeof(int32_t)));

    for (int64_t gi = 0; gi < groups; gi++)
        quantize_group(x + (size_t)gi * PQ2_BLOCK_WEIGHTS, q8 + (size_t)gi * PQ2_BLOCK_WEIGHTS,
                       scales + gi, sums + gi);
    return pq2_ok();
}

/* Groups of one activation row quantised at a time: a fixed stack buffer instead of an
 * allocation; acc carries over between chunks through y, so the op order is unchanged. */
#define PQ2_MATMUL_CHUNK_GROUPS 64

PQ2_API pq2_status pq2_matmul_host(const pq2_weights *w, const float *x, size_t x_bytes, int64_t m,
                                   float *y, size_t y_bytes)
{
    static const char fn[] = "pq2_matmul_host";
    pq2_view v;
    PQ2_CHECK(pq2_view_of_weights(&v, fn, "", w));
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK_PTR(fn, y);
    PQ2_CHECK_ALIGN(fn, x, PQ2_ALIGNOF(float));
    PQ2_CHECK_ALIGN(fn, y, PQ2_ALIGNOF(float));
    PQ2_CHECK(check_rows(fn, "m", m, v.k));
    PQ2_CHECK(check_rows(fn, "m", m, v.n));
    PQ2_CHECK(pq2_check_buffer(fn, "x", x_bytes, (uint64_t)(m * v.k), sizeof(float)));
    PQ2_CHECK(pq2_check_buffer(fn, "y", y_bytes, (uint64_t)(m * v.n), sizeof(float)));

    int8_t q8[PQ2_MATMUL_CHUNK_GROUPS * PQ2_BLOCK_WEIGHTS];
    float sx[PQ2_MATMUL_CHUNK_GROUPS];
    int32_t sums[PQ2_MATMUL_CHUNK_GROUPS];
    pq2_block blk;
    for (int64_t mi = 0; mi < m; mi++) {
        const float *xrow = x + (size_t)mi * (size_t)v.k;
        float *yrow = y + (size_t)mi * (size_t)v.n;
        for (int64_t g0 = 0; g0 < v.groups; g0 += PQ2_MATMUL_CHUNK_GROUPS) {
            int64_t count =
                v.groups - g0 < PQ2_MATMUL_CHUNK_GROUPS ? v.groups - g0 : PQ2_MATMUL_CHUNK_GROUPS;
            for (int64_t c = 0; c < count; c++)
                quantize_group(xrow + (size_t)(g0 + c) * PQ2_BLOCK_WEIGHTS,
                               q8 + c * PQ2_BLOCK_WEIGHTS, &sx[c], &sums[c]);
            for (int64_t row = 0; row < v.n; row++) {
                float acc = g0 == 0 ? 0.0f : yrow[row];
                for (int64_t c = 0; c < count; c++) {
                    pq2_view_read_block(&v, row, g0 + c, &blk);
                    const int8_t *q = q8 + c * PQ2_BLOCK_WEIGHTS;
                    int32_t idot = 0;
                    for (int i = 0; i < PQ2_BLOCK_WEIGHTS; i++)
                        idot += (int32_t)pq2_get_code(blk.qs, i) * q[pq2_q8_plane_index(i)];
                    idot -= sums[c]; /* dot(code - 1, q) = dot(code, q) - sum(q) */
                    float dwx = pq2_f16_to_f32(blk.d) * sx[c];
                    float t = (float)idot * dwx;
                    acc = acc + t;
                }
                yrow[row] = acc;
            }
        }
    }
    return pq2_ok();
}
