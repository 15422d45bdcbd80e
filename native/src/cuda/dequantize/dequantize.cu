// dequantize.cu - the dense copy of a PQ2_0 matrix (dequantize.h). A lane reads 16 consecutive
// elements of a row: one 4-byte word of a block's codes (qs[b..b+3], b a multiple of 4:
// contiguous in every layout, and word-aligned, the data being 16-byte aligned, except in raw
// blocks of 34 bytes) and the block's scale. A warp's 32 words are its 512 consecutive elements;
// each lane then takes, by shuffle, the word and scale of the elements it stores, so that every
// store of the warp is 16 bytes a lane over 512 contiguous bytes (two stores for f16 and bf16,
// four for f32). A block of 128 threads covers 2048 elements of one row (grid x: rows, y:
// 2048-element chunks).
#include <cuda_fp16.h>

#include "dequantize/dequantize.h"
#include "device/dtypes.cuh"
#include "device/launch.cuh"

namespace {

constexpr int kThreads = 128, kPerThread = 16;

template <int DT>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const pq2_view w, void *out)
{
    // elements a lane writes per 16-byte store
    constexpr int kPer = DT == PQ2_DTYPE_F32 ? 4 : 8;
    const int lane = threadIdx.x & 31;
    const int64_t row = blockIdx.x;
    const int64_t j = (int64_t)blockIdx.y * kThreads + threadIdx.x;  // elements 16j..16j+15
    uint32_t codes = 0;
    float d = 0.0f;
    if (j * kPerThread < w.k) {
        const int64_t g = j >> 3;
        const uint8_t *c = w.data + pq2_code_offset(&w, row, g, (int)(j & 7) * 4);
        codes = w.layout == PQ2_LAYOUT_RAW ? (uint32_t)c[0] | (uint32_t)c[1] << 8 |
                                                 (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24
                                           : *reinterpret_cast<const uint32_t *>(c);
        d = __half2float(__ushort_as_half(
            *reinterpret_cast<const uint16_t *>(w.data + pq2_scale_offset(&w, row, g))));
    }
    const int64_t first = (j - lane) * kPerThread;  // the warp's first element
#pragma unroll
    for (int q = 0; q < kPerThread / kPer; ++q) {
        // elements e..e+kPer-1 of the warp's 512 (k is a multiple of 128: all in the row or none)
        const int e = (q * 32 + lane) * kPer;
        const uint32_t c = __shfl_sync(0xffffffffu, codes, e / kPerThread);
        const float ds = __shfl_sync(0xffffffffu, d, e / kPerThread);
        if (first + e >= w.k) continue;
        float v[kPer];
#pragma unroll
        for (int i = 0; i < kPer; ++i)
            v[i] = (float)((int)((c >> (2 * (e % kPerThread + i))) & 3u) - 1) * ds;
        const int64_t at = row * w.k + first + e;
        if constexpr (DT == PQ2_DTYPE_F32) {
            pq2_store4(out, DT, at, v);
        } else {
            __stwb(reinterpret_cast<uint4 *>(static_cast<uint16_t *>(out) + at),
                   make_uint4(pq2_pack2(DT, v[0], v[1]), pq2_pack2(DT, v[2], v[3]),
                              pq2_pack2(DT, v[4], v[5]), pq2_pack2(DT, v[6], v[7])));
        }
    }
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
