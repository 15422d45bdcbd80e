// quantize.cuh - the Q8 activation quantiser: the per-group device code (shared by the quantiser
// kernel, quantize.cu, and the fused row-block kernels, decode_rowblock.cu, which quantise their
// activations themselves) and the launchers of the matmul entry points.
#pragma once
#include "common.cuh"

// ---- one 128-group per warp (FORMATS.md; bit-exact with pq2_quantize_q8_host) ----------------
// Lane L owns elements 4L..4L+3 of the group: element 4L+j goes to plane j at position L.

// Elements i..i+3 of x (dtype DTYPE) as floats.
template <int DTYPE>
__device__ __forceinline__ void pq2_load4(const void *x, size_t i, float (&v)[4])
{
    if constexpr (DTYPE == PQ2_DTYPE_F32) {
        float4 f = *reinterpret_cast<const float4 *>(static_cast<const float *>(x) + i);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if constexpr (DTYPE == PQ2_DTYPE_F16) {
        uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const __half *>(x) + i);
        float2 a = __half22float2(*reinterpret_cast<__half2 *>(&u.x));
        float2 b = __half22float2(*reinterpret_cast<__half2 *>(&u.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    } else {
        uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const __nv_bfloat16 *>(x) + i);
        float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.x));
        float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    }
}

// The same with the dtype known only at run time (a uniform branch).
__device__ __forceinline__ void pq2_load4_any(const void *x, int dtype, size_t i, float (&v)[4])
{
    if (dtype == PQ2_DTYPE_BF16)
        pq2_load4<PQ2_DTYPE_BF16>(x, i, v);
    else if (dtype == PQ2_DTYPE_F16)
        pq2_load4<PQ2_DTYPE_F16>(x, i, v);
    else
        pq2_load4<PQ2_DTYPE_F32>(x, i, v);
}

// The group's scale (max|x| / 127, the warp's amax) and this lane's four q values:
// q = clamp(rint(x / scale), -127, 127) with a correctly rounded division (__fdiv_rn, even under
// fast-math flags); a NaN quotient (inf or NaN input) gives 0, as the host reference does.
__device__ __forceinline__ float pq2_quantize_lane(const float (&v)[4], int (&q)[4])
{
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax * (1.0f / 127.0f);
    const float div = scale > 0.0f ? scale : 1.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float r = rintf(__fdiv_rn(v[j], div));
        q[j] = r == r ? (int)fminf(127.0f, fmaxf(-127.0f, r)) : 0;
    }
    return scale;
}

// The warp's sum of q (every lane gets it).
__device__ __forceinline__ int pq2_group_sum(const int (&q)[4])
{
    int sum = q[0] + q[1] + q[2] + q[3];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return sum;
}

// The two "B1" words of the group's bit slices (common.cuh) that lane L writes and reads, words
// (b*4 + tq)*4 + {0, 1} of PQ2_BITS_GROUP_WORDS with L = b*4 + tq (bit b = L >> 2, lane quad
// tq = L & 3), from the q of elements 4L + s (s = 0..3). Each lane first transposes its four bytes
// into eight nibbles (nibble b: bit b of q[s] at bit s) packed in one word; lane L then fetches the
// words of the eight lanes holding elements 32*tq + 16*w + 4*c + s (lane 8*tq + 4*w + c), spreads
// their nibble b to bits 2s, 2s+1 of byte c and ORs the bytes into its two words. ("B2" is
// B1 & 0xAAAAAAAA.) 8 shuffles per lane, no dependent pairs (NOTES v11e: the quantiser's latency
// is on every call's critical path).
__device__ __forceinline__ uint2 pq2_bitslice_b1(const int (&q)[4], int lane)
{
    const uint32_t packed = (uint32_t)(q[0] & 0xff) | (uint32_t)(q[1] & 0xff) << 8 |
                            (uint32_t)(q[2] & 0xff) << 16 | (uint32_t)(q[3] & 0xff) << 24;
    uint32_t nibbles = 0;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        const uint32_t m = (packed >> b) & 0x01010101u;                 // bit b of q[s] at 8s
        nibbles |= (((m * 0x01020408u) >> 24) & 0xFu) << (4 * b);      // ... at s (no carries)
    }
    const int b = lane >> 2, tq = lane & 3;
    uint32_t word[2] = {0u, 0u};
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            uint32_t n = (__shfl_sync(0xffffffffu, nibbles, 8 * tq + 4 * w + c) >> (4 * b)) & 0xFu;
            n = (n | n << 2) & 0x33u;  // bits s at 2s
            n = (n | n << 1) & 0x55u;
            word[w] |= n << (8 * c);
        }
    return make_uint2(word[0] * 3u, word[1] * 3u);  // both bits of each weight
}

// ---- launchers --------------------------------------------------------------------------------

// Quantises x[m][k] into q8/scales/sums (see pq2.h) and, when bits is not NULL, their
// bit-sliced copy (common.cuh; m * k/128 * PQ2_BITS_GROUP_WORDS words) on `stream`, and zeroes
// zero[0..n_zero) in the same launch (the matmul's arrival counters). Arguments already
// validated except dtype. pdl: launch as a programmatic dependent of the stream's previous
// kernel (Hopper).
pq2_status pq2_quantize_launch(const char *fn, const void *x, int32_t x_dtype, int64_t m,
                               int64_t k, int8_t *q8, float *scales, int32_t *sums,
                               uint32_t *bits, uint32_t *zero, int32_t n_zero, bool pdl,
                               cudaStream_t stream);

// The bit-sliced copy of q8[m][k] (plane order, as the quantiser writes it) into bits, the same
// words the quantiser writes. Plain stream order.
pq2_status pq2_bitslice_launch(const char *fn, const int8_t *q8, int64_t m, int64_t k, uint32_t *bits,
                               cudaStream_t stream);

// True when the current device (already initialised) supports programmatic dependent launch.
bool pq2_pdl_ok();
