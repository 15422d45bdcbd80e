// quantize.cu - group-128 Q8 activation quantisation on the GPU (FORMATS.md), bit-exact with
// pq2_quantize_q8_host: scale = max|x| * (1.0f/127), q = clamp(rint(x / scale), -127, 127) with a
// correctly rounded fp32 division, plane order q8[g*128 + (i%4)*32 + i/4], int32 group sums;
// optionally also the bit-sliced copy of the q8 the m == 1 row-block kernels read (common.cuh,
// PQ2_BITS_GROUP_WORDS), here or from existing q8 (pq2_bitslice_launch).
#include "quantize.cuh"

namespace {

constexpr int kWarpsPerBlock = 8;

// One warp writes the 128 bit-sliced words of one group (common.cuh): lane L its B1 words
// (pq2_bitslice_b1) and their B2, words 4L..4L+3, with one coalesced 16-byte store.
__device__ __forceinline__ void bitslice_group(const int (&q)[4], int lane, uint32_t *__restrict__ out)
{
    const uint2 b1 = pq2_bitslice_b1(q, lane);
    *reinterpret_cast<uint4 *>(out + 4 * lane) = make_uint4(b1.x, b1.y, b1.x & 0xAAAAAAAAu, b1.y & 0xAAAAAAAAu);
}

// One warp per (row, group); lane L owns elements 4L..4L+3, so element 4L+j goes to plane j at
// position L: each of the four byte stores of a warp writes 32 consecutive bytes.
template <int DTYPE>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
quantize_q8_kernel(const void *__restrict__ x, int64_t m, int64_t k, int8_t *__restrict__ q8,
                   float *__restrict__ scales, int32_t *__restrict__ sums,
                   uint32_t *__restrict__ bits, uint32_t *__restrict__ zero, int32_t n_zero)
{
    // Programmatic dependent launch, both ways. This grid may start before the previous kernel
    // of the stream ends (it is launched as its dependent): it reads x and touches the workspace
    // only after this. The matmul that follows may start now: it streams weights and waits for
    // this grid before reading what it writes.
    pq2_pdl_handoff();
    // The matmul's arrival counters live in the same workspace: clearing them here, in the launch
    // that precedes the matmul, makes every call independent of the last one.
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_zero; i += gridDim.x * blockDim.x)
        zero[i] = 0;

    const int lane = threadIdx.x & 31;
    const int64_t groups = k >> 7;
    const int64_t task = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    if (task >= m * groups) return;
    const int64_t row = task / groups, g = task - row * groups;

    float v[4];
    pq2_load4<DTYPE>(x, (size_t)row * k + g * 128 + lane * 4, v);
    int qs[4];
    const float scale = pq2_quantize_lane(v, qs);
    int8_t *out = q8 + (size_t)row * k + g * 128 + lane;
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j * 32] = (int8_t)qs[j];
    if (bits) bitslice_group(qs, lane, bits + (size_t)task * PQ2_BITS_GROUP_WORDS);
    const int sum = pq2_group_sum(qs);
    if (lane == 0) {
        scales[row * groups + g] = scale;
        sums[row * groups + g] = sum;
    }
}

// The bit-sliced copy of existing q8 (plane order: element 4*lane + s of group g at
// q8[g*128 + s*32 + lane]), one warp per (row, group).
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
bitslice_kernel(const int8_t *__restrict__ q8, int64_t tasks, uint32_t *__restrict__ bits)
{
    const int lane = threadIdx.x & 31;
    const int64_t task = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    if (task >= tasks) return;
    const int8_t *in = q8 + task * 128 + lane;
    const int q[4] = {in[0], in[32], in[64], in[96]};
    bitslice_group(q, lane, bits + (size_t)task * PQ2_BITS_GROUP_WORDS);
}

}  // namespace

// Blocks of kWarpsPerBlock warps for one warp per (row, group) of an m x k problem.
static pq2_status group_blocks(const char *fn, int64_t m, int64_t k, unsigned *blocks)
{
    const int64_t n = (m * (k >> 7) + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (n > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: m=%lld k=%lld is too large", fn, (long long)m,
                             (long long)k);
    *blocks = (unsigned)n;
    return PQ2_OK;
}

pq2_status pq2_bitslice_launch(const char *fn, const int8_t *q8, int64_t m, int64_t k, uint32_t *bits,
                               cudaStream_t stream)
{
    unsigned blocks;
    PQ2_CHECK(group_blocks(fn, m, k, &blocks));
    bitslice_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(q8, m * (k >> 7), bits);
    return pq2_launch_status(fn);
}

pq2_status pq2_quantize_launch(const char *fn, const void *x, int32_t x_dtype, int64_t m,
                               int64_t k, int8_t *q8, float *scales, int32_t *sums,
                               uint32_t *bits, uint32_t *zero, int32_t n_zero, bool pdl,
                               cudaStream_t stream)
{
    unsigned blocks;
    PQ2_CHECK(group_blocks(fn, m, k, &blocks));
    pq2_launch l(blocks, kWarpsPerBlock * 32, 0, stream, pdl);
    switch (x_dtype) {
    case PQ2_DTYPE_F32:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, quantize_q8_kernel<PQ2_DTYPE_F32>, x, m, k, q8, scales, sums, bits, zero, n_zero));
        break;
    case PQ2_DTYPE_F16:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, quantize_q8_kernel<PQ2_DTYPE_F16>, x, m, k, q8, scales, sums, bits, zero, n_zero));
        break;
    case PQ2_DTYPE_BF16:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, quantize_q8_kernel<PQ2_DTYPE_BF16>, x, m, k, q8, scales, sums, bits, zero, n_zero));
        break;
    default:
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: x_dtype=%d is not f32 (0), f16 (1) or bf16 (2)",
                             fn, (int)x_dtype);
    }
    return pq2_launch_status(fn);
}

extern "C" PQ2_API pq2_status pq2_quantize_q8_cuda(const void *x, int32_t x_dtype, int64_t m,
                                                   int64_t k, int8_t *q8, float *scales,
                                                   int32_t *sums, void *stream)
{
    static const char fn[] = "pq2_quantize_q8_cuda";
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK_PTR(fn, q8);
    PQ2_CHECK_PTR(fn, scales);
    PQ2_CHECK_PTR(fn, sums);
    if (m <= 0 || k <= 0 || k % 128 != 0)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: m=%lld k=%lld: need m > 0 and k a positive multiple of 128",
                             fn, (long long)m, (long long)k);
    PQ2_CHECK_ALIGN(fn, x, 16);
    PQ2_CHECK_ALIGN(fn, scales, 4);
    PQ2_CHECK_ALIGN(fn, sums, 4);
    PQ2_CHECK(pq2_cuda_init());
    return pq2_quantize_launch(fn, x, x_dtype, m, k, q8, scales, sums, nullptr, nullptr, 0, pq2_pdl_ok(),
                               static_cast<cudaStream_t>(stream));
}
