// stage.cuh - what both GEMM kernels (kernel_mma.cuh, kernel_wgmma.cuh) share: a block's tile
// (128 weight rows = 8 sub-tiles of 16, x `tokens` tokens, 8 computing warps), the exact
// promotion of a group's integer product, and the epilogue (direct stores, or split partials added
// in split order by the last block of a tile).
#pragma once

#include <cuda_fp16.h>

#include "device/arrival.cuh"
#include "device/codes.cuh"
#include "device/dtypes.cuh"
#include "device/ptx.cuh"
#include "gemm/gemm.h"

namespace pq2_gemm {

constexpr int kRows = 128, kSubtiles = 8, kWarps = 8, kThreads = kWarps * 32;

// Promotion. A group's integer product is 64 * dot(code - 1, q), |.| < 2^21 (|q| <= 127, 128
// weights, code - 1 in -1..2, u8 operand code * 64). Each family lets it arrive as the bits of
// kBias + 64 * dot, with kBias the bits of 1.25 * 2^23 (its accumulator chain starts at, or its
// wgmma result is added to, kBias - 64 * sum(q)): that float is exactly 1.25 * 2^23 + 64 * dot,
// an integer in [2^23, 1.5 * 2^23). Then one FFMA with the row's scale over 64 and
// -1.25 * 2^23 * scale / 64 (exact: 3 bits times the fp16 scale's 11) gives dot * d_w rounded
// once, and a second FFMA adds it times the token's scale d_x:
//   acc += round(dot * d_w) * d_x
constexpr int kBias = 0x4B200000;
constexpr float kBiasF = 10485760.0f;  // 1.25 * 2^23

// A token's start of a group's chain: kBias - 64 * sum(q) (sum: the group's Q8 sum).
__device__ __forceinline__ int token_bias(int sum)
{
    return kBias - 64 * sum;
}

// A row's promotion constants: its scale over 64 and the bias term of the first FFMA.
struct row_scale {
    float w64, c;
};

__device__ __forceinline__ row_scale make_row_scale(float dw)
{
    const float w64 = dw * (1.0f / 64.0f);
    return {w64, -kBiasF * w64};
}

// The promotion constants of a lane's two rows of a sub-tile, gid (first) and gid + 8 (second),
// from their two fp16 scales as one word: the sub-tile's 16 scales are in fragment order, so
// those rows' are at 2 gid and 2 gid + 1.
__device__ __forceinline__ void make_row_scales(uint32_t pair, row_scale &lo, row_scale &hi)
{
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&pair));
    lo = make_row_scale(f.x), hi = make_row_scale(f.y);
}

// acc + round(dot * d_w) * d_x, from the biased bits v = kBias + 64 * dot.
__device__ __forceinline__ float promote_one(int v, row_scale w, float dx, float acc)
{
    return fmaf(fmaf(__int_as_float(v), w.w64, w.c), dx, acc);
}

// N accumulators of the tile at (row0, tok0) to y: element i is (row_of(i), tok_of(i)).
template <int N, class RowOf, class TokOf>
__device__ __forceinline__ void store_rows(const pq2_gemm_problem &p, const float (&acc)[N],
                                           int64_t row0, int64_t tok0, RowOf row_of, TokOf tok_of)
{
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int64_t row = row0 + row_of(i), tok = tok0 + tok_of(i);
        if (row < p.n && tok < p.m)
            pq2_store_from_f32(p.y, (size_t)(tok * p.n + row), p.y_dtype, acc[i]);
    }
}

// The tile at (row0, tok0) as the sum of `count` partial tiles (slot(j): kRows x BM floats,
// [token][row], written by other blocks: read past L1), added in slot order, to y. Thread t of
// `threads` takes four outputs of one token per step (16-byte loads), four slots' loads in
// flight: the sum waits on few L2 round trips.
template <int BM, class Slot>
__device__ __forceinline__ void sum_partials(const pq2_gemm_problem &p, int64_t row0, int64_t tok0,
                                             int count, Slot slot, int t, int threads)
{
    constexpr int kTile = kRows * BM;
    static_assert(kRows % 4 == 0, "four outputs of one token");
    for (int e = t; e < kTile / 4; e += threads) {
        const int64_t row = row0 + (4 * e) % kRows, tok = tok0 + (4 * e) / kRows;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int j = 0; j < count; ++j) {
            const float4 x = __ldcg(reinterpret_cast<const float4 *>(slot(j)) + e);
            v.x += x.x, v.y += x.y, v.z += x.z, v.w += x.w;
        }
        if (tok >= p.m) continue;
        const float out[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (row + i < p.n)
                pq2_store_from_f32(p.y, (size_t)(tok * p.n + row + i), p.y_dtype, out[i]);
    }
}

// The block's N accumulators to y: element i is (row_of(i), tok_of(i)) of the block's tile
// (blockIdx.x, blockIdx.y). Split groups: this block's partial sums go to the workspace; the last
// block of the tile to arrive adds them in split order (deterministic whichever block is last)
// and stores them. Every thread of the block calls it; those without accumulators (a producer
// warp) pass has_acc false.
template <int BM, int N, class RowOf, class TokOf>
__device__ __forceinline__ void store_tile(const pq2_gemm_problem &p, const float (&acc)[N],
                                           RowOf row_of, TokOf tok_of, bool has_acc = true)
{
    const int64_t row0 = (int64_t)blockIdx.x * kRows, tok0 = (int64_t)blockIdx.y * BM;
    if (p.splits == 1) {
        if (has_acc) store_rows<N>(p, acc, row0, tok0, row_of, tok_of);
        return;
    }
    const int64_t tile = (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
    constexpr int kTile = kRows * BM;
    float *mine = p.partial + (tile * p.splits + blockIdx.z) * kTile;
    if (has_acc)
#pragma unroll
        for (int i = 0; i < N; ++i) mine[tok_of(i) * kRows + row_of(i)] = acc[i];
    if (!pq2_last_to_arrive(p.counters + tile, p.splits)) return;
    const float *all = p.partial + tile * p.splits * kTile;
    sum_partials<BM>(
        p, row0, tok0, p.splits, [&](int j) { return all + j * kTile; }, (int)threadIdx.x,
        (int)blockDim.x);
    if (threadIdx.x == 0) p.counters[tile] = 0;  // ready for the next call
}

// Stream-K: the first of the units [0, units) that block c of `blocks` takes (c U / P), and the
// block that takes unit u (the largest c whose first unit is at most u).
__device__ __forceinline__ int64_t sk_first_unit(int64_t c, int64_t units, int64_t blocks)
{
    return c * units / blocks;
}
__device__ __forceinline__ int64_t sk_block_of(int64_t u, int64_t units, int64_t blocks)
{
    return ((u + 1) * blocks + units - 1) / units - 1;
}

}  // namespace pq2_gemm
