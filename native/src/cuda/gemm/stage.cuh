// stage.cuh - what both GEMM kernels (kernel_mma.cuh, kernel_wgmma.cuh) share: a block's tile
// (128 weight rows = 8 sub-tiles of 16, x `tokens` tokens, 8 warps), the copies of one 128-group
// into a shared-memory pipeline stage, the exact small-integer conversion, and the epilogue
// (direct stores, or split partials added in split order by the last block of a tile).
#pragma once

#include <cuda_fp16.h>

#include "codes.cuh"
#include "dtypes.cuh"
#include "gemm/gemm.h"
#include "ptx.cuh"

namespace pq2_gemm {

constexpr int kRows = 128, kSubtiles = 8, kWarps = 8, kThreads = kWarps * 32;

// The copies of one group into a stage, every thread taking a share: its source pointers are
// computed once and advance one group per issue (the address arithmetic stays out of the loop).
// A Stage has codes[8][512] (the tiles layout's lane order), wscales[8][16], xs[], sums[] and
// q8_chunk(token row, 16-byte chunk): where that chunk of the token's 128 activations goes.
template <class Stage> struct group_loader {
    static constexpr int BM = Stage::kTokens;
    static constexpr int kQ8Chunks = BM * 8 / kThreads;  // 16-byte chunks of activations per thread
    const uint8_t *codes;     // this thread's 16 code bytes (sub-tile t / 32, chunk t % 32)
    const uint16_t *wscales;  // threads < 16: 8 scales of sub-tile t / 2
    const int8_t *q8;         // chunk 0 of this thread's activations; chunk i is i * 32 tokens on
    const void *tok_const;    // threads < 2 BM: a token's scale (even t) or sum (odd t)
    int64_t code_step, scale_step, q8_chunk_stride;
    bool code_ok, scale_ok, tok_ok, q8_ok[kQ8Chunks > 0 ? kQ8Chunks : 1];

    __device__ group_loader(const pq2_gemm_problem &p, int64_t rb, int64_t tb, int64_t g0)
    {
        const int t = threadIdx.x;
        const int64_t groups = p.k >> 7;
        const int64_t tile_rows = 16 * (int64_t)p.rt;
        const int64_t padded = (p.n + tile_rows - 1) / tile_rows * tile_rows;  // rows stored
        code_step = (int64_t)p.rt * 512, scale_step = (int64_t)p.rt * 16;
        {
            const int sub = t >> 5, chunk = t & 31;
            const int64_t row = rb * kRows + 16 * sub, tile = row / tile_rows,
                          r = (row % tile_rows) / 16;
            code_ok = row < padded;
            codes = p.codes + (((tile * groups + g0) * p.rt + r) * 512 + chunk * 16);
        }
        {
            const int sub = (t >> 1) & (kSubtiles - 1), half = t & 1;
            const int64_t row = rb * kRows + 16 * sub, tile = row / tile_rows,
                          r = (row % tile_rows) / 16;
            scale_ok = t < 2 * kSubtiles && row < padded;
            wscales = p.wscales + (((tile * groups + g0) * p.rt + r) * 16 + half * 8);
        }
        const int64_t tok = tb * BM + (t >> 3);
        q8 = p.q8 + (tok * p.k + g0 * 128 + (t & 7) * 16);
        q8_chunk_stride = (kThreads / 8) * p.k;
#pragma unroll
        for (int i = 0; i < kQ8Chunks; ++i) q8_ok[i] = tok + i * (kThreads / 8) < p.m;
        const int64_t ct = tb * BM + (t >> 1);
        tok_ok = t < 2 * BM && ct < p.m;
        tok_const = (t & 1) ? (const void *)(p.sums + ct * groups + g0)
                            : (const void *)(p.xs + ct * groups + g0);
    }

    // The next group's copies into st (tokens past m and rows past the stored ones read as 0);
    // where !live (past the block's last group) the copies are zero fills that read nothing
    // and the pointers still advance. No branch: the warps stay convergent.
    __device__ __forceinline__ void issue(Stage &st, const pq2_gemm_problem &p, bool live = true)
    {
        const int t = threadIdx.x;
        const bool c_ok = live && code_ok, s_ok = live && scale_ok, x_ok = live && tok_ok;
        cp_async16(&st.codes[t >> 5][(t & 31) * 16], c_ok ? codes : p.codes, c_ok);
        // threads >= 16 (>= 2 BM) address stage bytes that exist but do not copy
        cp_async16_if(t < 2 * kSubtiles, &st.wscales[(t >> 1) & (kSubtiles - 1)][(t & 1) * 8],
                      s_ok ? wscales : p.wscales, s_ok);
#pragma unroll
        for (int i = 0; i < kQ8Chunks; ++i) {
            const bool q_ok = live && q8_ok[i];
            cp_async16(st.q8_chunk((t >> 3) + i * (kThreads / 8), t & 7),
                       q_ok ? q8 + i * q8_chunk_stride : p.q8, q_ok);
        }
        const int ct = (t >> 1) % BM;
        cp_async4_if(t < 2 * BM, (t & 1) ? (void *)&st.sums[ct] : (void *)&st.xs[ct],
                     x_ok ? tok_const : (const void *)p.xs, x_ok);
        codes += code_step, wscales += scale_step, q8 += 128;
        tok_const = static_cast<const uint32_t *>(tok_const) + 1;
    }
};

// float(d) for |d| < 2^22: the bits of 1.5 * 2^23 + d as a float, less 1.5 * 2^23.
__device__ __forceinline__ float small_int_to_float(int d)
{
    return __int_as_float(d + 0x4B400000) - 12582912.0f;
}

// The block's N accumulators to y: element i is (row_of(i), tok_of(i)) of the block's tile.
// Split groups: this block's partial sums go to the workspace; the last block of the tile to
// arrive adds them in split order (deterministic whichever block is last) and stores them.
// Every thread of the block calls it; those without accumulators (a producer warp) pass
// has_acc false.
template <int BM, int N, class RowOf, class TokOf>
__device__ __forceinline__ void store_tile(const pq2_gemm_problem &p, const float (&acc)[N],
                                           RowOf row_of, TokOf tok_of, bool has_acc = true)
{
    const int64_t row0 = (int64_t)blockIdx.x * kRows, tok0 = (int64_t)blockIdx.y * BM;
    if (p.splits == 1) {
        if (!has_acc) return;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int64_t row = row0 + row_of(i), tok = tok0 + tok_of(i);
            if (row < p.n && tok < p.m)
                pq2_store_from_f32(p.y, (size_t)(tok * p.n + row), p.y_dtype, acc[i]);
        }
        return;
    }
    const int64_t tile = (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
    constexpr int kTile = kRows * BM;
    float *mine = p.partial + (tile * p.splits + blockIdx.z) * kTile;
    if (has_acc)
#pragma unroll
        for (int i = 0; i < N; ++i) mine[tok_of(i) * kRows + row_of(i)] = acc[i];
    __threadfence();
    __syncthreads();
    __shared__ unsigned last;
    if (threadIdx.x == 0) last = atomicAdd(p.counters + tile, 1u) == (unsigned)(p.splits - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float *all = p.partial + tile * p.splits * kTile;
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
        const int64_t row = row0 + e % kRows, tok = tok0 + e / kRows;
        float v = 0.0f;
        for (int s = 0; s < p.splits; ++s) v += __ldcg(all + s * kTile + e);
        if (row < p.n && tok < p.m)
            pq2_store_from_f32(p.y, (size_t)(tok * p.n + row), p.y_dtype, v);
    }
    if (threadIdx.x == 0) p.counters[tile] = 0;  // ready for the next call
}

}  // namespace pq2_gemm
