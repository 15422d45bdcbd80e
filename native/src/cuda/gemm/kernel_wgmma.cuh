// kernel_wgmma.cuh - the Hopper GEMM kernel (sm_90a, wgmma): the same product and tile as
// kernel_mma.cuh, with the MMAs issued asynchronously by warpgroups fed by a producer warp.
//
// A block is two consumer warpgroups and one producer warp (288 threads); at 32 tokens three
// blocks share an SM and at 64 tokens two (launch bounds), so four or six warpgroups take turns
// on its tensor cores. Consumer warp w (0..7) owns sub-tile w, so warpgroup h multiplies rows
// 64h..64h+63 of the block's 128 by all BN tokens: per group, four wgmma m64nBNk32 (one per 32-wide
// plane). The weights are the register operand A: a warp reads its sub-tile's code bytes from the
// staged tiles-layout block with two 8-byte loads per lane, picked so that the fragment lines up
// with the activations' plane order (the tiles layout serves decode and prefill alike), and expands
// the four planes to the top bits of each byte (code * 64, u8). The activations are operand B, read
// by the tensor cores from shared memory, where a TMA copy of the Q8 operand's (BN tokens x 128)
// box lands with the 128-byte swizzle (each token's group is one row of a K-major tile).
//
// Pipeline: STAGES stages, each with a "full" and an "empty" mbarrier. The producer warp waits
// for a stage to be empty, then its first lane copies a group into it with three TMA copies
// (wg_maps: the activations; the block's code bytes and weight scales, each one box of the
// tiles layout's (sub-tile, rt, group, tile) order whatever the tile height, rows past the
// stored ones arriving as zeros). At every fourth group all its lanes also store the tokens'
// promotion constants of four groups (wg_quad: the scale and token_bias(sum), computed once
// per token for all consumer warps) into a ring of kQuads such blocks, from values
// they loaded one quad earlier. The stage is full when the copies have landed and every lane
// has arrived. A consumer warp waits for full, issues its wgmmas, waits for them, promotes, and
// marks the stage empty. The two warpgroups run independently, so one's promotion overlaps the
// other's wgmmas.
//
// Promotion (gemm/stage.cuh): the group's int32 product 64 * dot(code, q) plus the token's
// kBias - 64 * sum(q) is the bits of 1.25 * 2^23 + 64 * dot(code - 1, q); two FFMAs add it to
// the fp32 accumulator with both scales, exactly as kernel_mma.cuh does (the same bits for the
// same tokens and splits).
#pragma once

#include <cuda.h>

#include "gemm/stage.cuh"

namespace pq2_gemm {

constexpr int kWgThreads = kThreads + 32;  // two consumer warpgroups and the producer warp
constexpr int kMaxStages = 6;
// Token constants come in quads of 4 groups; a ring of 3 quads is never refilled before the
// consumers are past it (a quad is refilled 12 groups on, and the producer is at most
// kMaxStages groups ahead of the slowest consumer).
constexpr int kQuad = 4, kQuads = 3;

// The TMA maps of one call (gemm/launch.cu makes them): the Q8 values and the weights' code
// and scale regions.
struct wg_maps {
    CUtensorMap q8, codes, scales;
};

// The tokens' promotion constants of 4 groups, by group then token: {d_x, the bits of
// kBias - 64 * sum(q)}, so that a consumer lane's two adjacent tokens are one 16-byte load.
template <int BN> struct alignas(16) wg_quad {
    float2 tc[kQuad][BN];
};

// Shared memory of one pipeline stage (one group); 1024-aligned for the swizzle atoms.
template <int BN> struct alignas(1024) wg_stage {
    uint8_t q8[BN * 128];
    uint8_t codes[kSubtiles][512];
    uint16_t wscales[kSubtiles][16];
};

// Dynamic shared memory of the kernel: the stages, the token-constant ring and the slack that
// aligns the stages to 1024.
template <int BN> constexpr size_t wg_smem_bytes(int stages)
{
    return sizeof(wg_stage<BN>) * stages + sizeof(wg_quad<BN>) * kQuads + 1024;
}

template <int BN>
__device__ __forceinline__ void wgmma_u8s8(int (&d)[BN / 2], const uint32_t (&a)[4], uint64_t desc,
                                           bool accumulate)
{
    if constexpr (BN == 32)
        wgmma_u8s8_n32(d, a, desc, accumulate);
    else if constexpr (BN == 64)
        wgmma_u8s8_n64(d, a, desc, accumulate);
    else if constexpr (BN == 96)
        wgmma_u8s8_n96(d, a, desc, accumulate);
    else
        wgmma_u8s8_n128(d, a, desc, accumulate);
}

// Warp `sub`'s A fragments of the four planes. wgmma lane (gid, tq) takes K bytes tq*4..+3 and
// 16+tq*4..+3 of a plane's 32 activation bytes; in the plane order those hold the codes of tiles
// lane (gid, tq/2) (low or high half by tq's parity) and of lane (gid, 2 + tq/2).
template <int BN>
__device__ __forceinline__ void load_a(const wg_stage<BN> &st, int sub, int lane,
                                       uint32_t (&a)[4][4])
{
    const int gid = lane >> 2, tq = lane & 3;
    const uint8_t *base = st.codes[sub] + gid * 64 + (tq & 1) * 8;
    const uint2 lo = *reinterpret_cast<const uint2 *>(base + (tq >> 1) * 16);
    const uint2 hi = *reinterpret_cast<const uint2 *>(base + (2 + (tq >> 1)) * 16);
    plane_fragments<true>(make_uint4(lo.x, lo.y, hi.x, hi.y), a);
}

// acc += the group's products in d, with both scales (see the top of the file).
template <int BN>
__device__ __forceinline__ void promote(const wg_stage<BN> &st, const wg_quad<BN> &qd, int col,
                                        int sub, int lane, const int (&d)[BN / 2],
                                        float (&acc)[BN / 2])
{
    const int gid = lane >> 2, tq = lane & 3;
    row_scale w0, w1;
    make_row_scales(st.wscales[sub], gid, w0, w1);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        // {d_x, kBias - 64 sum(q)} of tokens 8j + 2tq and 8j + 2tq + 1
        const float4 t = *reinterpret_cast<const float4 *>(&qd.tc[col][8 * j + 2 * tq]);
        const int k0 = __float_as_int(t.y), k1 = __float_as_int(t.w);
        float *a = &acc[4 * j];
        const int *q = &d[4 * j];
        a[0] = promote_one(q[0] + k0, w0, t.x, a[0]);
        a[1] = promote_one(q[1] + k1, w0, t.z, a[1]);
        a[2] = promote_one(q[2] + k0, w1, t.x, a[2]);
        a[3] = promote_one(q[3] + k1, w1, t.z, a[3]);
    }
}

template <int N> __device__ __forceinline__ void pin_all(int (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) wgmma_pin(d[i]);
}

// A producer lane's share of one quad: the scales and sums of its tokens (lane, lane + 32, ...)
// for 4 groups, loaded a quad before they are stored.
template <int BN> struct wg_quad_values {
    float4 xs[BN / 32];
    int4 sums[BN / 32];
};

template <int BN>
__device__ __forceinline__ void load_quad(const pq2_gemm_problem &p, int gq, int lane,
                                          wg_quad_values<BN> &v)
{
    const int groups = (int)(p.k >> 7), tok0 = (int)blockIdx.y * BN;
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
        const int tok = tok0 + lane + 32 * i;
        v.xs[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v.sums[i] = make_int4(0, 0, 0, 0);
        if (tok < p.m) {
            const int64_t at = (int64_t)tok * groups + gq;
            v.xs[i] = __ldg(reinterpret_cast<const float4 *>(p.xs + at));
            v.sums[i] = __ldg(reinterpret_cast<const int4 *>(p.sums + at));
        }
    }
}

template <int BN>
__device__ __forceinline__ void store_quad(wg_quad<BN> &qd, int lane, const wg_quad_values<BN> &v)
{
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
        const int tok = lane + 32 * i;
        qd.tc[0][tok] = make_float2(v.xs[i].x, __int_as_float(token_bias(v.sums[i].x)));
        qd.tc[1][tok] = make_float2(v.xs[i].y, __int_as_float(token_bias(v.sums[i].y)));
        qd.tc[2][tok] = make_float2(v.xs[i].z, __int_as_float(token_bias(v.sums[i].z)));
        qd.tc[3][tok] = make_float2(v.xs[i].w, __int_as_float(token_bias(v.sums[i].w)));
    }
}

// The producer warp: every group of [g0, g1) into its stage once the consumers have emptied it,
// and at each group that starts a quad (or the first), the quad's token constants.
template <int BN, int STAGES>
__device__ __forceinline__ void produce(const pq2_gemm_problem &p, const wg_maps *maps,
                                        wg_stage<BN> *stages, wg_quad<BN> *quads, uint64_t *full,
                                        uint64_t *empty, int g0, int g1, int lane)
{
    const int tok0 = (int)blockIdx.y * BN;
    const int first_tile = (int)((int64_t)blockIdx.x * kRows / (16 * p.rt));
    wg_quad_values<BN> v;
    load_quad<BN>(p, g0 / kQuad * kQuad, lane, v);
    for (int g = g0, i = 0; g < g1; ++g, ++i) {
        const int s = i % STAGES, round = i / STAGES;
        if (round > 0) mbar_wait(&empty[s], (uint32_t)(round - 1) & 1u);
        wg_stage<BN> &st = stages[s];
        if (lane == 0) {
            mbar_expect_tx(&full[s],
                           (uint32_t)(sizeof(st.q8) + sizeof(st.codes) + sizeof(st.wscales)));
            tma_load_2d(&full[s], st.q8, &maps->q8, g * 128, tok0);
            tma_load_4d(&full[s], st.codes, &maps->codes, 0, 0, g, first_tile);
            tma_load_4d(&full[s], st.wscales, &maps->scales, 0, 0, g, first_tile);
        }
        if (g % kQuad == 0 || g == g0) {
            const int gq = g / kQuad * kQuad;
            store_quad<BN>(quads[(g / kQuad) % kQuads], lane, v);
            if (gq + kQuad < g1) load_quad<BN>(p, gq + kQuad, lane, v);
        }
        mbar_arrive(&full[s]);  // release: the constants stored above
    }
}

// A consumer warp (sub-tile `warp` of the block): every group of [g0, g1) into acc.
template <int BN, int STAGES>
__device__ __forceinline__ void consume(wg_stage<BN> *stages, const wg_quad<BN> *quads,
                                        uint64_t *full, uint64_t *empty, int g0, int g1, int warp,
                                        int lane, float (&acc)[BN / 2])
{
    int d[BN / 2];
    uint32_t a[4][4];
    for (int g = g0, i = 0; g < g1; ++g, ++i) {
        const int s = i % STAGES;
        mbar_wait(&full[s], (uint32_t)(i / STAGES) & 1u);
        const wg_stage<BN> &st = stages[s];
        load_a(st, warp, lane, a);
        const uint64_t desc = wgmma_desc_sw128(smem_u32(st.q8));
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_u8s8<BN>(d, a[k], desc + 2 * k, k > 0);
        wgmma_commit();
        wgmma_wait<0>();
        pin_all(d);
        promote(st, quads[(g / kQuad) % kQuads], g % kQuad, warp, lane, d, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
}

// Blocks per SM: three at 32 tokens (72 registers), two at 64 (96), one above.
constexpr int wg_blocks_per_sm(int bn)
{
    return bn == 32 ? 3 : bn == 64 ? 2 : 1;
}

template <int BN, int STAGES>
__global__ void __launch_bounds__(kWgThreads, wg_blocks_per_sm(BN))
    wgmma_kernel(const pq2_gemm_problem p, const __grid_constant__ wg_maps maps)
{
#if PQ2_WGMMA
    static_assert(STAGES <= kMaxStages, "one barrier pair per stage");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
    const uint32_t raw = smem_u32(smem_raw);
    wg_stage<BN> *stages =
        reinterpret_cast<wg_stage<BN> *>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    wg_quad<BN> *quads = reinterpret_cast<wg_quad<BN> *>(stages + STAGES);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // 32-bit group indices (k < 2^31, gemm.h): the loops' branches stay uniform.
    const int groups = (int)(p.k >> 7), split = (int)blockIdx.z;
    const int g0 = split * groups / p.splits, g1 = (split + 1) * groups / p.splits;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init_count(&full[s], 1 + 32);  // the producer's expect_tx + its lanes
            mbar_init_count(&empty[s], kWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();
    // The activations are the previous kernel's output (the quantiser or the caller's producer).
    pq2_pdl_handoff();

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    const bool consumer = warp < kWarps;
    if (consumer)
        consume<BN, STAGES>(stages, quads, full, empty, g0, g1, warp, lane, acc);
    else
        produce<BN, STAGES>(p, &maps, stages, quads, full, empty, g0, g1, lane);
    const int gid = lane >> 2, tq = lane & 3;
    store_tile<BN>(
        p, acc, [&](int i) { return 16 * warp + gid + 8 * ((i & 3) >> 1); },
        [&](int i) { return 8 * (i >> 2) + 2 * tq + (i & 1); }, consumer);
#else
    (void)p, (void)maps;
    __trap();
#endif
}

}  // namespace pq2_gemm
