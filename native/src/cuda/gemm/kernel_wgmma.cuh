// kernel_wgmma.cuh - the Hopper GEMM kernel (sm_90a, wgmma): the same product and tile as
// kernel_mma.cuh, with the MMAs issued asynchronously by warpgroups fed by a producer warp.
//
// A block is two consumer warpgroups and one producer warp (288 threads). Consumer warp w
// (0..7) owns sub-tile w, so warpgroup h multiplies rows 64h..64h+63 of the block's 128 by all
// BN tokens: per group, four wgmma m64nBNk32 (one per 32-wide plane). The weights are the
// register operand A: a warp reads its sub-tile's code bytes from the staged tiles-layout block
// with two 8-byte loads per lane, picked so that the fragment lines up with the activations'
// plane order (the tiles layout serves decode and prefill alike), and expands the four planes to
// the top bits of each byte (code * 64, u8). The activations are operand B, read by the tensor
// cores from shared memory, where a TMA copy of the Q8 operand's (BN tokens x 128) box lands
// with the 128-byte swizzle (each token's group is one row of a K-major tile).
//
// Pipeline: STAGES stages, each with a "full" and an "empty" mbarrier. The producer warp waits
// for a stage to be empty, then copies a group into it: the activations by TMA, each tile's code
// bytes and scales by bulk copies (one per tile of the block), the tokens' scales and sums by
// cp.async; the stage is full when all have landed. A consumer warp waits for full, issues its
// wgmmas, waits for them, promotes, and marks the stage empty. The two warpgroups run
// independently, so one's promotion overlaps the other's wgmmas.
//
// Promotion: the int32 product 64 * dot(code, q) goes into the fp32 accumulator as
// acc += (float(d) - 64 * sum(q)) * (d_w / 64) * d_x, where float(d) is the bits of
// d + 1.5 * 2^23 and 64 * sum(q) + 1.5 * 2^23 is formed the same way, so the difference is
// exact: the result is bit-identical to kernel_mma.cuh's for the same tokens and splits.
#pragma once

#include <cuda.h>

#include "gemm/stage.cuh"

namespace pq2_gemm {

constexpr int kWgThreads = kThreads + 32;  // two consumer warpgroups and the producer warp
constexpr int kMaxStages = 6;

// Shared memory of one pipeline stage (one group); 1024-aligned for the swizzle atoms.
template <int BN> struct alignas(1024) wg_stage {
    static constexpr int kTokens = BN;
    uint8_t q8[BN * 128];
    uint8_t codes[kSubtiles][512];
    uint16_t wscales[kSubtiles][16];
    float xs[BN];
    int32_t sums[BN];
};

// Dynamic shared memory of the kernel: the stages and the slack that aligns them to 1024.
template <int BN> constexpr size_t wg_smem_bytes(int stages)
{
    return sizeof(wg_stage<BN>) * stages + 1024;
}

template <int BN>
__device__ __forceinline__ void wgmma_u8s8(int (&d)[BN / 2], const uint32_t (&a)[4], uint64_t desc,
                                           bool accumulate)
{
    if constexpr (BN == 64)
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
__device__ __forceinline__ void promote(const wg_stage<BN> &st, int sub, int lane,
                                        const int (&d)[BN / 2], float (&acc)[BN / 2])
{
    const int gid = lane >> 2, tq = lane & 3;
    // a sub-tile's 16 scales in fragment order: rows gid and gid + 8 at 2 gid, 2 gid + 1
    const uint32_t wpair = *reinterpret_cast<const uint32_t *>(&st.wscales[sub][2 * gid]);
    const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&wpair));
    const float w0 = wf.x * (1.0f / 64.0f), w1 = wf.y * (1.0f / 64.0f);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int tok = 8 * j + 2 * tq;
        const float2 xs = *reinterpret_cast<const float2 *>(&st.xs[tok]);
        const int2 su = *reinterpret_cast<const int2 *>(&st.sums[tok]);
        const float c0 = __int_as_float(su.x * 64 + 0x4B400000);
        const float c1 = __int_as_float(su.y * 64 + 0x4B400000);
        float *a = &acc[4 * j];
        const int *q = &d[4 * j];
        a[0] = fmaf(__int_as_float(q[0] + 0x4B400000) - c0, w0 * xs.x, a[0]);
        a[1] = fmaf(__int_as_float(q[1] + 0x4B400000) - c1, w0 * xs.y, a[1]);
        a[2] = fmaf(__int_as_float(q[2] + 0x4B400000) - c0, w1 * xs.x, a[2]);
        a[3] = fmaf(__int_as_float(q[3] + 0x4B400000) - c1, w1 * xs.y, a[3]);
    }
}

template <int N> __device__ __forceinline__ void pin_all(int (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) wgmma_pin(d[i]);
}

// The producer warp: every group of [g0, g1) into its stage once the consumers have emptied it.
template <int BN, int STAGES>
__device__ __forceinline__ void produce(const pq2_gemm_problem &p, const CUtensorMap *q8_map,
                                        wg_stage<BN> *stages, uint64_t *full, uint64_t *empty,
                                        int g0, int g1, int lane)
{
    const int groups = (int)(p.k >> 7);
    const int rt = p.rt, tiles_here = kSubtiles / rt;
    const int64_t tile_rows = 16 * (int64_t)rt;
    const int64_t first_tile = (int64_t)blockIdx.x * kRows / tile_rows;
    const int64_t stored_tiles = (p.n + tile_rows - 1) / tile_rows;
    const int64_t left = stored_tiles - first_tile;
    const int live = left < tiles_here ? (int)left : tiles_here;
    const uint32_t bytes = BN * 128 + (uint32_t)(live * rt) * (512 + 32);
    const int64_t tok0 = (int64_t)blockIdx.y * BN;
    for (int g = g0, i = 0; g < g1; ++g, ++i) {
        const int s = i % STAGES, round = i / STAGES;
        if (round > 0) mbar_wait(&empty[s], (uint32_t)(round - 1) & 1u);
        wg_stage<BN> &st = stages[s];
        if (lane == 0) {
            mbar_expect_tx(&full[s], bytes);
            tma_load_2d(&full[s], st.q8, q8_map, g * 128, (int)tok0);
            for (int t = 0; t < live; ++t) {
                const int64_t at = ((first_tile + t) * groups + g) * rt;
                bulk_copy(&full[s], st.codes[t * rt], p.codes + at * 512, (uint32_t)rt * 512);
                bulk_copy(&full[s], st.wscales[t * rt], p.wscales + at * 16, (uint32_t)rt * 32);
            }
        }
#pragma unroll
        for (int c = 0; c < 2 * BN / 32; ++c) {  // the tokens' scales (even) and sums (odd)
            const int e = lane + 32 * c, tok = e >> 1;
            const bool ok = tok0 + tok < p.m;
            const int64_t at = (tok0 + tok) * groups + g;
            if (e & 1)
                cp_async4(&st.sums[tok], ok ? (const void *)(p.sums + at) : p.sums, ok);
            else
                cp_async4(&st.xs[tok], ok ? (const void *)(p.xs + at) : p.xs, ok);
        }
        mbar_arrive_cp_async(&full[s]);
    }
}

// A consumer warp (sub-tile `warp` of the block): every group of [g0, g1) into acc.
template <int BN, int STAGES>
__device__ __forceinline__ void consume(wg_stage<BN> *stages, uint64_t *full, uint64_t *empty,
                                        int g0, int g1, int warp, int lane, float (&acc)[BN / 2])
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
        promote(st, warp, lane, d, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
}

template <int BN, int STAGES>
__global__ void __launch_bounds__(kWgThreads, 1)
    wgmma_kernel(const pq2_gemm_problem p, const __grid_constant__ CUtensorMap q8_map)
{
#if PQ2_WGMMA
    static_assert(STAGES <= kMaxStages, "one barrier pair per stage");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
    const uint32_t raw = smem_u32(smem_raw);
    wg_stage<BN> *stages =
        reinterpret_cast<wg_stage<BN> *>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // 32-bit group indices (k < 2^38): the loops' branches stay uniform.
    const int groups = (int)(p.k >> 7), split = (int)blockIdx.z;
    const int g0 = split * groups / p.splits, g1 = (split + 1) * groups / p.splits;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init_count(&full[s], 1 + 32);  // the producer's expect_tx + its lanes' cp.async
            mbar_init_count(&empty[s], kWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // Sub-tiles past the stored rows are never copied: zeros, so their (discarded) products are
    // defined.
    for (int i = threadIdx.x; i < STAGES * kSubtiles * 32; i += blockDim.x) {
        const int s = i / (kSubtiles * 32), sub = (i / 32) % kSubtiles, c = i % 32;
        reinterpret_cast<uint4 *>(stages[s].codes[sub])[c] = make_uint4(0, 0, 0, 0);
        if (c < 2) reinterpret_cast<uint4 *>(stages[s].wscales[sub])[c] = make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async();  // the zeros before any bulk copy into the stages
    __syncthreads();
    // The activations are the previous kernel's output (the quantiser or the caller's producer).
    pq2_pdl_handoff();

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    const bool consumer = warp < kWarps;
    if (consumer)
        consume<BN, STAGES>(stages, full, empty, g0, g1, warp, lane, acc);
    else
        produce<BN, STAGES>(p, &q8_map, stages, full, empty, g0, g1, lane);
    const int gid = lane >> 2, tq = lane & 3;
    store_tile<BN>(
        p, acc, [&](int i) { return 16 * warp + gid + 8 * ((i & 3) >> 1); },
        [&](int i) { return 8 * (i >> 2) + 2 * tq + (i & 1); }, consumer);
#else
    (void)p, (void)q8_map;
    __trap();
#endif
}

}  // namespace pq2_gemm
