// dequantize.cu - the dense copy of a PQ2_0 matrix (dequantize.h). A thread writes 16
// consecutive elements of a row from one 4-byte word of a block's codes (qs[b..b+3], b a
// multiple of 4: contiguous in every layout, and word-aligned, the data being 16-byte aligned,
// except in raw blocks of 34 bytes) and the block's scale. A block of 128 threads covers 2048
// elements of one row (grid x: rows, y: 2048-element chunks), so a warp stores 512 consecutive
// elements of a row.
#include <cuda_fp16.h>

#include "dequantize/dequantize.h"
#include "dtypes.cuh"
#include "launch.cuh"

namespace {

constexpr int kThreads = 128, kPerThread = 16;

template <int DT>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const pq2_view w, void *out)
{
    const int64_t row = blockIdx.x;
    const int64_t j = (int64_t)blockIdx.y * kThreads + threadIdx.x;  // the thread's 16 elements
    if (j * kPerThread >= w.k) return;
    const int64_t g = j >> 3;
    const int b = (int)(j & 7) * 4;
    const uint8_t *c = w.data + pq2_code_offset(&w, row, g, b);
    const uint32_t codes =
        w.layout == PQ2_LAYOUT_RAW
            ? (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24
            : *reinterpret_cast<const uint32_t *>(c);
    const float d = __half2float(__ushort_as_half(
        *reinterpret_cast<const uint16_t *>(w.data + pq2_scale_offset(&w, row, g))));
    float v[kPerThread / 4][4];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
        v[i / 4][i % 4] = (float)((int)((codes >> (2 * i)) & 3u) - 1) * d;
    const int64_t at = row * w.k + j * kPerThread;
#pragma unroll
    for (int q = 0; q < kPerThread / 4; ++q) pq2_store4(out, DT, at + 4 * q, v[q]);
}

}  // namespace

pq2_status pq2_dequantize_launch(const char *fn, const pq2_view &w, void *out, int32_t out_dtype,
                                 cudaStream_t stream)
{
    const int64_t chunks = (w.k + kThreads * kPerThread - 1) / (kThreads * kPerThread);
    if (w.n > INT32_MAX || chunks > 65535)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: n=%lld k=%lld: one grid holds n <= 2^31 - 1 and k <= 65535 * %d",
                             fn, (long long)w.n, (long long)w.k, kThreads * kPerThread);
    const dim3 grid((unsigned)w.n, (unsigned)chunks);
    pq2_launch l(grid, kThreads, 0, stream, false);
    switch (out_dtype) {
    case PQ2_DTYPE_F16:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, dequantize_kernel<PQ2_DTYPE_F16>, w, out));
        break;
    case PQ2_DTYPE_BF16:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, dequantize_kernel<PQ2_DTYPE_BF16>, w, out));
        break;
    default:
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, dequantize_kernel<PQ2_DTYPE_F32>, w, out));
        break;
    }
    return pq2_launch_status(fn);
}
