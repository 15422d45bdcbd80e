// q8_group.cuh - one warp quantises one (row, 128-group) of activations to the Q8 operand
// (FORMATS.md "Activations"), bit-exact with pq2_quantize_q8_host: the quantiser and the fused
// producers (rotate/) end with it.
#pragma once

#include "device/codes.cuh"

// rint(v[j] / div) as the spec takes it (the correctly rounded quotient, then rint), from a
// reciprocal rcp within 2^-22 of 1 / div: v * rcp is then within 5e-5 of the quotient's float
// (|quotient| <= 127 (1 + 2^-22); 2^-22 relative for rcp, 2^-24 each for the product's and the
// quotient's rounding), so both round to the same integer unless v * rcp lies within 2^-12
// (2.4e-4) of a half-integer. Where one of the four does, or is inf or NaN (a subnormal or
// infinite div, inf or NaN input), all four take the division: one branch, rarely taken, so the
// four products overlap.
__device__ __forceinline__ void rint_quotients(const float (&v)[4], float div, float rcp,
                                               float (&q)[4])
{
    bool near = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float t = __fmul_rn(v[j], rcp);
        q[j] = rintf(t);
        near |= !(fabsf(t - q[j]) < 0.499755859375f);  // 0.5 - 2^-12; NaN counts as near
    }
    if (near) {
#pragma unroll
        for (int j = 0; j < 4; ++j)  // __fdiv_rn: correctly rounded, even under fast-math flags
            q[j] = rintf(__fdiv_rn(v[j], div));
    }
}

// Lane L holds elements 4L..4L+3 of group g of row `row` (task = row * k/128 + g) in v: stores
// q8 (unless NULL; element 4L+j goes to plane j at position L, so each of the four byte stores
// of a warp writes 32 consecutive bytes), the scale and the sum, the bit slices (unless NULL)
// and the token-constant records (unless NULL; 2 <= m <= 8).
__device__ __forceinline__ void
q8_store_group(const float (&v)[4], int lane, int64_t row, int64_t g, int64_t task, int64_t m,
               int64_t k, int8_t *__restrict__ q8, float *__restrict__ scales,
               int32_t *__restrict__ sums, uint32_t *__restrict__ bits, int4 *__restrict__ records)
{
    const int64_t groups = k >> 7;
    // max|x| as the host reference takes it (NaN ignored, from 0), in one warp reduction
    // (redux.sync) instead of a shuffle tree: the bits of non-negative floats order as unsigned
    // integers; NaN patterns (above +inf) count as 0.
    uint32_t abits = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t u = __float_as_uint(fabsf(v[j]));
        abits = max(abits, u > 0x7f800000u ? 0u : u);
    }
    const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, abits));

    const float scale = amax * (1.0f / 127.0f);
    const float div = scale > 0.0f ? scale : 1.0f;
    // 1 / div within 2^-22 relative (rcp.approx, one Newton step; no special-case branch):
    // inf for a subnormal div and NaN for an infinite one, which rint_quotients sends to the
    // division.
    float rcp;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rcp) : "f"(div));
    rcp = __fmaf_rn(rcp, __fmaf_rn(-div, rcp, 1.0f), rcp);
    float q[4];
    rint_quotients(v, div, rcp, q);
    int sum = 0, qs[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        qs[j] = q[j] == q[j] ? (int)fminf(127.0f, fmaxf(-127.0f, q[j]))
                             : 0;  // NaN gives 0, as the host reference
        sum += qs[j];
    }
    sum = __reduce_add_sync(0xffffffffu, sum);  // one redux.sync, issued before the bit slices
    if (bits) bitslice_group(qs, lane, bits + (size_t)task * PQ2_BITS_GROUP_WORDS);
    if (q8) {  // NULL when only the bit slices are read (the m == 1 matmul)
        int8_t *out = q8 + (size_t)row * k + g * 128 + lane;
#pragma unroll
        for (int j = 0; j < 4; ++j) out[j * 32] = (int8_t)qs[j];
    }
    if (lane == 0) {
        scales[row * groups + g] = scale;
        sums[row * groups + g] = sum;
    }
    if (records) {
        // The token-constant records (device/codes.cuh, m <= 8): token `row` fills slot row, and
        // the last token also the slots past m - 1 (min(t, m - 1) == row). Lane s writes slot s.
        const int last = row == m - 1 ? PQ2_TC_PAIRS * 2 : (int)row + 1;
        if (lane >= row && lane < last) {
            int *rec = reinterpret_cast<int *>(records + g * PQ2_TC_PAIRS + (lane >> 1));
            rec[lane & 1] = -sum;
            rec[2 + (lane & 1)] = __float_as_int(scale);
        }
    }
}
