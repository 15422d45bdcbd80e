// quantize.cu - group-128 Q8 activation quantisation on the GPU (FORMATS.md), bit-exact with
// pq2_quantize_q8_host: scale = max|x| * (1.0f/127), q = clamp(rint(x / scale), -127, 127) with a
// correctly rounded fp32 division, plane order q8[g*128 + (i%4)*32 + i/4], int32 group sums;
// optionally also the operands the row-block kernels read from the workspace (codes.cuh): the
// bit-sliced q8 (m == 1) or the token-constant records (2 <= m <= 8), here or from existing
// q8, scales and sums (the small kernels at the end).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "codes.cuh"
#include "launch.cuh"
#include "ptx.cuh"
#include "quantize/quantize.h"

namespace {

// Warps (one per (row, group)) per block: at most kMaxWarps; one while m <= kOneWarpMaxM (decode
// batches). There the quantiser's blocks start while the previous matmul's blocks still hold most
// of each SM, and a one-warp block finds room where an 8-warp block waits: the M = 1 pass measured
// 2.309 ms with 1 warp per block, 2.32-2.33 with 2 and 4, 2.34 with 8. Larger m
// keep 8-warp blocks (fewer blocks to schedule; not measured).
constexpr int kMaxWarps = 8;
constexpr int64_t kOneWarpMaxM = 16;

// The four x values at p (element i of the lane's row), as floats.
template <int DTYPE> __device__ __forceinline__ void load4(const void *p, float (&v)[4])
{
    if constexpr (DTYPE == PQ2_DTYPE_F32) {
        float4 f = *static_cast<const float4 *>(p);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if constexpr (DTYPE == PQ2_DTYPE_F16) {
        uint2 u = *static_cast<const uint2 *>(p);
        float2 a = __half22float2(*reinterpret_cast<__half2 *>(&u.x));
        float2 b = __half22float2(*reinterpret_cast<__half2 *>(&u.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    } else {
        uint2 u = *static_cast<const uint2 *>(p);
        float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.x));
        float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    }
}

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

// The start of both kernels that precede a matmul. Programmatic dependent launch, both ways:
// such a grid may start before the previous kernel of the stream ends (it is launched as its
// dependent), so it reads its input and touches the workspace only after the handoff (the
// quantiser prefetches x into L2 before it, which reads nothing into the kernel); the matmul
// that follows may start now (it streams weights and waits for this grid before reading what it
// writes). Then the matmul's arrival counters, which live in the same workspace, are cleared: in
// the launch that precedes the matmul, so every call is independent of the last one.
__device__ __forceinline__ void start_before_matmul(uint32_t *__restrict__ zero, int32_t n_zero)
{
    pq2_pdl_handoff();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_zero; i += gridDim.x * blockDim.x)
        zero[i] = 0;
}

// One warp per (row, group); lane L owns elements 4L..4L+3, so element 4L+j goes to plane j at
// position L: each of the four byte stores of a warp writes 32 consecutive bytes. q8 may be NULL
// (bit slices only).
template <int DTYPE>
__global__ void __launch_bounds__(kMaxWarps * 32)
    quantize_q8_kernel(const void *__restrict__ x, int64_t m, int64_t k, int8_t *__restrict__ q8,
                       float *__restrict__ scales, int32_t *__restrict__ sums,
                       uint32_t *__restrict__ bits, int4 *__restrict__ records,
                       uint32_t *__restrict__ zero, int32_t n_zero)
{
    const int lane = threadIdx.x & 31;
    const int64_t groups = k >> 7;
    const int64_t task = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int64_t row = task / groups, g = task - row * groups;
    const void *xp = static_cast<const char *>(x) +
                     ((size_t)row * k + g * 128 + lane * 4) * (DTYPE == PQ2_DTYPE_F32 ? 4 : 2);
    // The warp's 128 x values into L2 before the wait: the wait ends when the previous kernel
    // completes, and x loaded only then costs a DRAM round trip on every call's critical path
    // if it is not already in L2. L2 is where device memory is coherent, so a line fetched here
    // and then written by the previous kernel holds the new bytes; nothing is read into
    // registers or L1 before the handoff.
    if (task < m * groups) asm volatile("prefetch.global.L2 [%0];" ::"l"(xp));
    start_before_matmul(zero, n_zero);  // x is read only after this
    if (task >= m * groups) return;

    float v[4];
    load4<DTYPE>(xp, v);
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
        // The token-constant records (codes.cuh, m <= 8): token `row` fills slot row, and the
        // last token also the slots past m - 1 (min(t, m - 1) == row). Lane s writes slot s.
        const int last = row == m - 1 ? PQ2_TC_PAIRS * 2 : (int)row + 1;
        if (lane >= row && lane < last) {
            int *rec = reinterpret_cast<int *>(records + g * PQ2_TC_PAIRS + (lane >> 1));
            rec[lane & 1] = -sum;
            rec[2 + (lane & 1)] = __float_as_int(scale);
        }
    }
}

// The bit-sliced copy of existing q8 (plane order: element 4*lane + s of group g at
// q8[g*128 + s*32 + lane]), one warp per (row, group); clears the matmul's arrival counters as
// the quantiser does.
__global__ void __launch_bounds__(kMaxWarps * 32)
    bitslice_kernel(const int8_t *__restrict__ q8, int64_t tasks, uint32_t *__restrict__ bits,
                    uint32_t *__restrict__ zero, int32_t n_zero)
{
    start_before_matmul(zero, n_zero);  // q8 (the caller's) is read only after this
    const int lane = threadIdx.x & 31;
    const int64_t task = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (task >= tasks) return;
    const int8_t *in = q8 + task * 128 + lane;
    const int q[4] = {in[0], in[32], in[64], in[96]};
    bitslice_group(q, lane, bits + (size_t)task * PQ2_BITS_GROUP_WORDS);
}

// The token-constant records (codes.cuh) of existing scales and sums [m][groups], one thread per
// record; clears the matmul's arrival counters as the quantiser does.
__global__ void __launch_bounds__(256)
    token_records_kernel(const float *__restrict__ scales, const int32_t *__restrict__ sums,
                         int32_t m, int64_t groups, int4 *__restrict__ records,
                         uint32_t *__restrict__ zero, int32_t n_zero)
{
    start_before_matmul(zero, n_zero);  // scales and sums (the caller's) are read only after this
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= groups * PQ2_TC_PAIRS) return;
    const int64_t g = e / PQ2_TC_PAIRS;
    const int pair = (int)(e - g * PQ2_TC_PAIRS);
    const int64_t t0 = min(2 * pair, m - 1) * groups + g,
                  t1 = min(2 * pair + 1, m - 1) * groups + g;
    records[e] =
        make_int4(-sums[t0], -sums[t1], __float_as_int(scales[t0]), __float_as_int(scales[t1]));
}

}  // namespace

// The warps per block and blocks for one warp per (row, group) of an m x k problem.
static pq2_status group_blocks(const char *fn, int64_t m, int64_t k, unsigned *blocks,
                               unsigned *warps)
{
    *warps = m <= kOneWarpMaxM ? 1 : kMaxWarps;
    const int64_t n = (m * (k >> 7) + *warps - 1) / *warps;
    if (n > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: m=%lld k=%lld is too large", fn, (long long)m,
                             (long long)k);
    *blocks = (unsigned)n;
    return PQ2_OK;
}

pq2_status pq2_bitslice_launch(const char *fn, const int8_t *q8, int64_t m, int64_t k,
                               uint32_t *bits, uint32_t *zero, int32_t n_zero, bool pdl,
                               cudaStream_t stream)
{
    unsigned blocks, warps;
    PQ2_CHECK(group_blocks(fn, m, k, &blocks, &warps));
    pq2_launch l(blocks, warps * 32, 0, stream, pdl);
    PQ2_CUDA_TRY(fn,
                 cudaLaunchKernelEx(&l.cfg, bitslice_kernel, q8, m * (k >> 7), bits, zero, n_zero));
    return pq2_launch_status(fn);
}

pq2_status pq2_token_records_launch(const char *fn, const float *scales, const int32_t *sums,
                                    int64_t m, int64_t k, int4 *records, uint32_t *zero,
                                    int32_t n_zero, bool pdl, cudaStream_t stream)
{
    const int64_t blocks = ((k >> 7) * PQ2_TC_PAIRS + 255) / 256;  // one thread per record
    if (blocks > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: k=%lld is too large", fn, (long long)k);
    pq2_launch l((unsigned)blocks, 256, 0, stream, pdl);
    PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, token_records_kernel, scales, sums, (int32_t)m,
                                        k >> 7, records, zero, n_zero));
    return pq2_launch_status(fn);
}

pq2_status pq2_quantize_launch(const char *fn, const void *x, int32_t x_dtype, int64_t m, int64_t k,
                               int8_t *q8, float *scales, int32_t *sums, uint32_t *bits,
                               int4 *records, uint32_t *zero, int32_t n_zero, bool pdl,
                               cudaStream_t stream)
{
    unsigned blocks, warps;
    PQ2_CHECK(group_blocks(fn, m, k, &blocks, &warps));
    pq2_launch l(blocks, warps * 32, 0, stream, pdl);
    switch (x_dtype) {
    case PQ2_DTYPE_F32:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, quantize_q8_kernel<PQ2_DTYPE_F32>, x, m, k, q8,
                                            scales, sums, bits, records, zero, n_zero));
        break;
    case PQ2_DTYPE_F16:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, quantize_q8_kernel<PQ2_DTYPE_F16>, x, m, k, q8,
                                            scales, sums, bits, records, zero, n_zero));
        break;
    case PQ2_DTYPE_BF16:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, quantize_q8_kernel<PQ2_DTYPE_BF16>, x, m, k, q8,
                                            scales, sums, bits, records, zero, n_zero));
        break;
    default:
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: x_dtype=%d is not f32 (0), f16 (1) or bf16 (2)", fn,
                             (int)x_dtype);
    }
    return pq2_launch_status(fn);
}
