// kernel_mma.cuh - the portable GEMM kernel (sm_80+, mma.sync): y[m][n] = x[m][k] . W^T on the
// tiles layout for any m.
//
// A block computes 128 weight rows (8 sub-tiles of 16) x BM tokens over its share of the
// 128-groups (all of them, or one split's). Per group, a cp.async pipeline of STAGES stages
// brings the group's code bytes (8 x 512, in the tiles layout's lane order), weight scales,
// activations (BM x 128 q8, rows padded to 144 bytes so that the eight rows a B fragment load
// touches fall in different banks), activation scales and sums into shared memory. 8 warps, 4
// along the rows x 2 along the tokens: a warp owns 2 sub-tiles x BM/2 tokens.
//
// Arithmetic per group (cores.cuh's m > 8 core, unrolled over tokens): the four code planes
// moved to the top bits of each byte (code * 64) are the u8 A fragments of four m16n8k32 MMAs
// against the four activation planes (s8 B), chained into one int32 accumulator started from
// -64 * sum(q): it ends as 64 * dot(code - 1, q), exact (|.| < 2^22). The group's product is then
// promoted into the fp32 accumulator with both scales: acc += float(d) * (d_w * d_x / 64); the
// conversion adds 1.5 * 2^23 to the integer's bits and subtracts it as a float (exact below
// 2^22: two full-rate instructions instead of the quarter-rate I2F).
#pragma once

#include "gemm/stage.cuh"

namespace pq2_gemm {

constexpr int kXRow = 144;  // bytes per token row of the staged activations (128 + 16 padding)

// Shared memory of one pipeline stage (one group).
template <int BM> struct stage {
    static constexpr int kTokens = BM;
    uint8_t codes[kSubtiles][512];
    uint16_t wscales[kSubtiles][16];
    uint8_t q8[BM][kXRow];
    float xs[BM];
    int32_t sums[BM];
    __device__ __forceinline__ uint8_t *q8_chunk(int row, int c) { return &q8[row][c * 16]; }
};

template <int BM> constexpr size_t smem_bytes(int stages)
{
    return sizeof(stage<BM>) * stages;
}

// The warp's share of one group: 2 sub-tiles x NT8 token octets into acc.
template <int BM>
__device__ __forceinline__ void compute_group(const stage<BM> &st, int wr, int wc, int lane,
                                              float (&acc)[2][BM / 16][4])
{
    constexpr int NT8 = BM / 16;  // token octets of a warp (BM / 2 tokens)
    const int gid = lane >> 2, tq = lane & 3;
    uint4 codes[2];
    float2 wsc[2];  // rows gid (x) and gid + 8 (y) of each sub-tile
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        codes[r] = *reinterpret_cast<const uint4 *>(&st.codes[2 * wr + r][lane * 16]);
        const uint32_t w = *reinterpret_cast<const uint32_t *>(&st.wscales[2 * wr + r][2 * gid]);
        wsc[r] = __half22float2(*reinterpret_cast<const __half2 *>(&w));
    }
    int init[NT8]
            [4];  // the chain's start: -64 sum(q) of the lane's two tokens, rows gid and gid + 8
    float dxs[NT8][2];
#pragma unroll
    for (int j = 0; j < NT8; ++j) {
        const int tok = wc * (BM / 2) + j * 8 + 2 * tq;  // this lane's two C columns
        init[j][0] = init[j][2] = -64 * st.sums[tok],
        init[j][1] = init[j][3] = -64 * st.sums[tok + 1];
        dxs[j][0] = st.xs[tok] * (1.0f / 64.0f), dxs[j][1] = st.xs[tok + 1] * (1.0f / 64.0f);
    }
    int d[2][NT8][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        uint32_t a[2][4];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint32_t w[4] = {codes[r].x, codes[r].y, codes[r].z, codes[r].w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                switch (s) {
                case 0: a[r][i] = pq2_plane_top<0>(w[i]); break;
                case 1: a[r][i] = pq2_plane_top<1>(w[i]); break;
                case 2: a[r][i] = pq2_plane_top<2>(w[i]); break;
                default: a[r][i] = pq2_plane_top<3>(w[i]); break;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT8; ++j) {
            const uint2 b = *reinterpret_cast<const uint2 *>(
                &st.q8[wc * (BM / 2) + j * 8 + gid][s * 32 + tq * 8]);
#pragma unroll
            for (int r = 0; r < 2; ++r)
                pq2_mma_u8s8(d[r][j], a[r], b.x, b.y, s == 0 ? init[j] : d[r][j]);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < NT8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float scale = (c < 2 ? wsc[r].x : wsc[r].y) * dxs[j][c & 1];
                acc[r][j][c] = fmaf(small_int_to_float(d[r][j][c]), scale, acc[r][j][c]);
            }
}

// Where C element c of sub-tile r, octet j of a lane lives: (row in the block, token in the block).
__device__ __forceinline__ int c_row(int wr, int r, int c, int lane)
{
    return 32 * wr + 16 * r + (lane >> 2) + (c >= 2 ? 8 : 0);
}
template <int BM> __device__ __forceinline__ int c_tok(int wc, int j, int c, int lane)
{
    return wc * (BM / 2) + j * 8 + 2 * (lane & 3) + (c & 1);
}

template <int BM, int STAGES>
__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(const pq2_gemm_problem p)
{
    extern __shared__ __align__(16) uint8_t smem[];
    stage<BM> *stages = reinterpret_cast<stage<BM> *>(smem);
    constexpr int NT8 = BM / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wr = warp & 3, wc = warp >> 2;
    const int64_t rb = blockIdx.x, tb = blockIdx.y;
    const int split = blockIdx.z;
    const int64_t groups = p.k >> 7;
    const int64_t g0 = split * groups / p.splits, g1 = (split + 1) * groups / p.splits;
    // The activations are the previous kernel's output (the quantiser or the caller's producer).
    pq2_pdl_handoff();

    group_loader<stage<BM>> loader(p, rb, tb, g0);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (g0 + s < g1) loader.issue(stages[s], p);
        cp_async_commit();
    }
    float acc[2][NT8][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < NT8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][j][c] = 0.0f;
    int cur = 0, fill = STAGES - 1;  // the stage computed next, the stage loaded next
    for (int64_t g = g0; g < g1; ++g) {
        cp_async_wait<STAGES - 2>();  // group g has landed (for this thread's copies)
        __syncthreads();              // ... for every thread's, and stage `fill` is free again
        if (g + STAGES - 1 < g1) loader.issue(stages[fill], p);
        cp_async_commit();
        compute_group<BM>(stages[cur], wr, wc, lane, acc);
        cur = cur + 1 == STAGES ? 0 : cur + 1;
        fill = fill + 1 == STAGES ? 0 : fill + 1;
    }
    cp_async_wait<0>();
    const float (&flat)[2 * NT8 * 4] = reinterpret_cast<const float (&)[2 * NT8 * 4]>(acc);
    store_tile<BM>(
        p, flat, [&](int i) { return c_row(wr, i / (4 * NT8), i % 4, lane); },
        [&](int i) { return c_tok<BM>(wc, (i / 4) % NT8, i % 4, lane); });
}

}  // namespace pq2_gemm
