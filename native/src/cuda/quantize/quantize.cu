// quantize.cu - group-128 Q8 activation quantisation on the GPU (FORMATS.md), bit-exact with
// pq2_quantize_q8_host: scale = max|x| * (1.0f/127), q = clamp(rint(x / scale), -127, 127) with a
// correctly rounded fp32 division, plane order q8[g*128 + (i%4)*32 + i/4], int32 group sums;
// optionally also the operands the row-block kernels read from the workspace (device/codes.cuh):
// the bit-sliced q8 (m == 1) or the token-constant records (2 <= m <= 8), here or from existing q8,
// scales and sums (the small kernels at the end).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/codes.cuh"
#include "device/dtypes.cuh"
#include "device/launch.cuh"
#include "device/ptx.cuh"
#include "quantize/q8_group.cuh"
#include "quantize/quantize.h"

namespace {

// Warps per block: at most kMaxWarps; one while m <= kOneWarpMaxM (decode batches). There the
// quantiser's blocks start while the previous matmul's blocks still hold most of each SM, and a
// one-warp block finds room where an 8-warp block waits: the decode pass is fastest with one warp
// per block (NOTES: shorter-quantiser). Larger m keep 8-warp blocks (fewer blocks to schedule;
// not measured).
constexpr int kMaxWarps = 8;
constexpr int64_t kOneWarpMaxM = 16;

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

// Decode batches (m <= kOneWarpMaxM) and any call that wants bit slices or records: one warp per
// (row, group); lane L owns elements 4L..4L+3, so element 4L+j goes to plane j at position L:
// each of the four byte stores of a warp writes 32 consecutive bytes. q8 may be NULL (bit slices
// only).
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
    pq2_load4<DTYPE>(xp, v);
    q8_store_group(v, lane, row, g, task, m, k, q8, scales, sums, bits, records);
}

// The quantiser above m = kOneWarpMaxM (no bit slices or records there): the tasks are the
// flat array's 128-element chunks in order (task t is x[128 t, 128 t + 128), its Q8 group
// q8[128 t, ...), its scale and sum at t), so a warp takes G consecutive tasks with no row or
// group arithmetic, their loads issued together (flat_tasks_per_warp picks G).
template <int DTYPE, int G>
__global__ void __launch_bounds__(kMaxWarps * 32)
    quantize_q8_flat_kernel(const void *__restrict__ x, int64_t m, int64_t k,
                            int8_t *__restrict__ q8, float *__restrict__ scales,
                            int32_t *__restrict__ sums, uint32_t *__restrict__ zero, int32_t n_zero)
{
    constexpr int64_t kTaskBytes = 128 * (DTYPE == PQ2_DTYPE_F32 ? 4 : 2);
    const int lane = threadIdx.x & 31;
    const int64_t tasks = m * (k >> 7);
    const int64_t task0 = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * G;
    const char *xp = static_cast<const char *>(x) + task0 * kTaskBytes + lane * (kTaskBytes / 32);
#pragma unroll
    for (int i = 0; i < G; ++i)  // into L2 before the wait, as quantize_q8_kernel
        if (task0 + i < tasks) asm volatile("prefetch.global.L2 [%0];" ::"l"(xp + i * kTaskBytes));
    start_before_matmul(zero, n_zero);
    float v[G][4];
#pragma unroll
    for (int i = 0; i < G; ++i)
        if (task0 + i < tasks) pq2_load4<DTYPE>(xp + i * kTaskBytes, v[i]);
#pragma unroll
    for (int i = 0; i < G; ++i) {
        const int64_t t = task0 + i;
        if (t >= tasks) return;
        // row 0, group t: the flat offsets 128 t and t (bits and records are not written)
        q8_store_group(v[i], lane, 0, t, t, m, k, q8, scales, sums, nullptr, nullptr);
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

// The token-constant records (device/codes.cuh) of existing scales and sums [m][groups], one thread
// per record; clears the matmul's arrival counters as the quantiser does.
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

// Warps an SM holds at once (2048 threads, the most it takes), while each quantiser thread stays
// within its share of the register file.
constexpr int64_t kResidentWarpsPerSm = 64;

// Tasks per warp of the flat kernel, or 0 for the row kernel (m <= kOneWarpMaxM, or bit slices or
// records wanted). Two once the tasks fill more than one wave of resident warps: a warp's second
// task shares its setup and overlaps its first one's loads; below that, one per warp keeps more
// warps on fewer tasks (NOTES: flat-quantiser).
static int flat_tasks_per_warp(int64_t m, int64_t k, const int8_t *q8, const uint32_t *bits,
                               const int4 *records, int sms)
{
    if (m <= kOneWarpMaxM || !q8 || bits || records) return 0;
    return m * (k >> 7) > sms * kResidentWarpsPerSm ? 2 : 1;
}

// The quantiser of x's dtype: the flat kernel with per_warp tasks per warp, or the row kernel.
template <int DTYPE>
static cudaError_t launch_quantize(const pq2_launch &l, int per_warp, const void *x, int64_t m,
                                   int64_t k, int8_t *q8, float *scales, int32_t *sums,
                                   uint32_t *bits, int4 *records, uint32_t *zero, int32_t n_zero)
{
    if (per_warp == 2)
        return cudaLaunchKernelEx(&l.cfg, quantize_q8_flat_kernel<DTYPE, 2>, x, m, k, q8, scales,
                                  sums, zero, n_zero);
    if (per_warp == 1)
        return cudaLaunchKernelEx(&l.cfg, quantize_q8_flat_kernel<DTYPE, 1>, x, m, k, q8, scales,
                                  sums, zero, n_zero);
    return cudaLaunchKernelEx(&l.cfg, quantize_q8_kernel<DTYPE>, x, m, k, q8, scales, sums, bits,
                              records, zero, n_zero);
}

pq2_status pq2_quantize_launch(const char *fn, const void *x, int32_t x_dtype, int64_t m, int64_t k,
                               int8_t *q8, float *scales, int32_t *sums, uint32_t *bits,
                               int4 *records, uint32_t *zero, int32_t n_zero, bool pdl, int sms,
                               cudaStream_t stream)
{
    unsigned blocks, warps;
    PQ2_CHECK(group_blocks(fn, m, k, &blocks, &warps));
    const int per_warp = flat_tasks_per_warp(m, k, q8, bits, records, sms);
    if (per_warp > 1) blocks = (blocks + per_warp - 1) / per_warp;
    pq2_launch l(blocks, warps * 32, 0, stream, pdl);
    switch (x_dtype) {
    case PQ2_DTYPE_F32:
        PQ2_CUDA_TRY(fn, launch_quantize<PQ2_DTYPE_F32>(l, per_warp, x, m, k, q8, scales, sums,
                                                        bits, records, zero, n_zero));
        break;
    case PQ2_DTYPE_F16:
        PQ2_CUDA_TRY(fn, launch_quantize<PQ2_DTYPE_F16>(l, per_warp, x, m, k, q8, scales, sums,
                                                        bits, records, zero, n_zero));
        break;
    case PQ2_DTYPE_BF16:
        PQ2_CUDA_TRY(fn, launch_quantize<PQ2_DTYPE_BF16>(l, per_warp, x, m, k, q8, scales, sums,
                                                         bits, records, zero, n_zero));
        break;
    default: return pq2_check_dtype(fn, "x_dtype", x_dtype);
    }
    return pq2_launch_status(fn);
}
