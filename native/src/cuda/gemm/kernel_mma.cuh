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
// kBias - 64 * sum(q): it ends as the bits of the float 1.25 * 2^23 + 64 * dot(code - 1, q),
// exact, which promote_one (gemm/stage.cuh) adds to the fp32 accumulator with both scales in two
// FFMAs. At 64 tokens two blocks share an SM (launch bounds: the registers of two blocks of
// kThreads; NOTES: portable64-launch-bounds).
#pragma once

#include "gemm/stage.cuh"

namespace pq2_gemm {

constexpr int kXRow = 144;  // bytes per token row of the staged activations (128 + 16 padding)

// Shared memory of one pipeline stage (one group).
template <int BM> struct stage {
    uint8_t codes[kSubtiles][512];
    uint16_t wscales[kSubtiles][16];
    uint8_t q8[BM][kXRow];
    float xs[BM];
    int32_t sums[BM];
};

template <int BM> constexpr size_t smem_bytes(int stages)
{
    return sizeof(stage<BM>) * stages;
}

// The copies of one group into a stage, every thread taking a share: its source pointers are
// computed once and advance one group per issue (the address arithmetic stays out of the loop).
template <int BM> struct group_loader {
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

    // The next group's copies into st.
    __device__ __forceinline__ void issue(stage<BM> &st, const pq2_gemm_problem &p)
    {
        const int t = threadIdx.x;
        cp_async16(&st.codes[t >> 5][(t & 31) * 16], code_ok ? codes : p.codes, code_ok);
        if (t < 2 * kSubtiles)
            cp_async16(&st.wscales[t >> 1][(t & 1) * 8], scale_ok ? wscales : p.wscales, scale_ok);
#pragma unroll
        for (int i = 0; i < kQ8Chunks; ++i)
            cp_async16(&st.q8[(t >> 3) + i * (kThreads / 8)][(t & 7) * 16],
                       q8_ok[i] ? q8 + i * q8_chunk_stride : p.q8, q8_ok[i]);
        if (t < 2 * BM) {
            void *dst = (t & 1) ? (void *)&st.sums[t >> 1] : (void *)&st.xs[t >> 1];
            cp_async4(dst, tok_ok ? tok_const : (const void *)p.xs, tok_ok);
        }
        codes += code_step, wscales += scale_step, q8 += 128;
        tok_const = static_cast<const uint32_t *>(tok_const) + 1;
    }
};

// The warp's share of one group: 2 sub-tiles x NT8 token octets into acc.
template <int BM>
__device__ __forceinline__ void compute_group(const stage<BM> &st, int wr, int wc, int lane,
                                              float (&acc)[2][BM / 16][4])
{
    constexpr int NT8 = BM / 16;  // token octets of a warp (BM / 2 tokens)
    const int gid = lane >> 2, tq = lane & 3;
    uint4 codes[2];
    row_scale wsc[2][2];  // rows gid and gid + 8 of each sub-tile
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        codes[r] = *reinterpret_cast<const uint4 *>(&st.codes[2 * wr + r][lane * 16]);
        make_row_scales(*reinterpret_cast<const uint32_t *>(&st.wscales[2 * wr + r][2 * gid]),
                        wsc[r][0], wsc[r][1]);
    }
    // the chain's start: kBias - 64 sum(q) of the lane's two tokens, rows gid and gid + 8
    int init[NT8][4];
    float dxs[NT8][2];
#pragma unroll
    for (int j = 0; j < NT8; ++j) {
        const int tok = wc * (BM / 2) + j * 8 + 2 * tq;  // this lane's two C columns
        init[j][0] = init[j][2] = token_bias(st.sums[tok]),
        init[j][1] = init[j][3] = token_bias(st.sums[tok + 1]);
        dxs[j][0] = st.xs[tok], dxs[j][1] = st.xs[tok + 1];
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
            for (int c = 0; c < 4; ++c)
                acc[r][j][c] = promote_one(d[r][j][c], wsc[r][c >> 1], dxs[j][c & 1], acc[r][j][c]);
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
__global__ void __launch_bounds__(kThreads, BM == 64 ? 2 : 1) gemm_kernel(const pq2_gemm_problem p)
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

    group_loader<BM> loader(p, rb, tb, g0);
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
