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
// Grids (template SK): a tile grid, one block per (row block, token block, split); or stream-K
// (config blocks > 0): a fixed number of blocks per SM take equal shares of the tiles' groups,
// each block's share cut into segments at tile boundaries and pipelined through the same stages;
// a segment that covers a whole tile is stored, the others go as partials to the workspace and
// the last of a tile's blocks adds them in block order (streamk_end). Stream-K keeps one block
// per SM at 64 tokens and up (two at 32): its loop holds more state.
//
// Wide blocks (template WIDE, config warps 12; tile grids at 96 and 128 tokens): the producer is
// a whole warpgroup (384 threads, one block per SM). Its warps share the token constants (warp pw
// keeps tokens 32 pw .. 32 pw + 31, so the full barrier counts the expect_tx and BN lanes) and
// setmaxnreg gives the registers it does not need to the two consumer warpgroups, which then hold
// the group's constants and two accumulator sets. With PAIRS (config unroll 2, 96 tokens) a
// consumer takes two groups an iteration into two int32 accumulator sets: it issues both groups'
// wgmmas, waits for the first (wgmma_wait<1>) and promotes it while the second multiplies. Groups
// are promoted in the same order either way, so every variant gives the narrow block's bits.
//
// Promotion (gemm/stage.cuh): the group's int32 product 64 * dot(code, q) plus the token's
// kBias - 64 * sum(q) is the bits of 1.25 * 2^23 + 64 * dot(code - 1, q); two FFMAs add it to
// the fp32 accumulator with both scales, exactly as kernel_mma.cuh does (the same bits for the
// same tokens and splits).
#pragma once

#include <cuda.h>

#include "gemm/stage.cuh"

namespace pq2_gemm {

// The block's threads: two consumer warpgroups and the producer warp, or a producer warpgroup.
template <bool WIDE> constexpr int wg_threads()
{
    return kThreads + (WIDE ? 128 : 32);
}
// A wide block's registers per thread after setmaxnreg: 128 x 56 + 256 x 224 = 64512 of the SM's
// 65536, what the launch gives 384 threads (168 each).
constexpr int kWideProducerRegs = 56, kWideConsumerRegs = 224;
constexpr int kMaxStages = 6;
// Token constants come in quads of 4 groups, stored in a ring in the order the block meets them
// (a quad per 4 groups, and one at the start of each segment below). The producer is at most
// kMaxStages groups ahead of the slowest consumer, so at most kMaxStages + 1 quads are live: a
// ring of kMaxStages + 2 is never refilled before the consumers are past a quad.
constexpr int kQuad = 4, kQuads = kMaxStages + 2;

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
// lane (gid, tq/2) (low or high half by tq's parity) and of lane (gid, 2 + tq/2). at: the lane's
// first 8 bytes in the stage (a_offset); the other 8 are 32 bytes on.
template <int BN> __device__ __forceinline__ uint32_t a_offset(int sub, int lane)
{
    const int gid = lane >> 2, tq = lane & 3;
    return (uint32_t)(offsetof(wg_stage<BN>, codes) + sub * 512 + gid * 64 + (tq & 1) * 8 +
                      (tq >> 1) * 16);
}

__device__ __forceinline__ void load_a(uint32_t at, uint32_t (&a)[4][4])
{
    const uint2 lo = lds_u32x2(at), hi = lds_u32x2(at + 32);
    plane_fragments<true>(make_uint4(lo.x, lo.y, hi.x, hi.y), a);
}

// acc += the group's products in d, with both scales (see the top of the file). scales_at: the
// lane's two rows' fp16 scales in the stage (scale_offset); tc_at: its first token pair's
// constants in the group's column of the quad (the pairs of 8j + 2tq are 64 j bytes on).
template <int BN> __device__ __forceinline__ uint32_t scale_offset(int sub, int lane)
{
    return (uint32_t)(offsetof(wg_stage<BN>, wscales) + sub * 32 + (lane >> 2) * 4);
}

template <int BN>
__device__ __forceinline__ void promote(uint32_t scales_at, uint32_t tc_at, const int (&d)[BN / 2],
                                        float (&acc)[BN / 2])
{
    row_scale w0, w1;
    make_row_scales(lds_u32(scales_at), w0, w1);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        // {d_x, kBias - 64 sum(q)} of tokens 8j + 2tq and 8j + 2tq + 1
        const float4 t = lds_f32x4(tc_at + 64 * j);
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

// A producer lane's share of one quad: the scales and sums of its NT tokens (first, first + 32,
// ...) for 4 groups, loaded a quad before they are stored. The producer warp of a narrow block
// keeps tokens lane + 32 i (NT = BN / 32), warp pw of a wide block's producer warpgroup token
// 32 pw + lane (NT = 1).
template <int NT> struct wg_quad_values {
    float4 xs[NT];
    int4 sums[NT];
};

template <int NT>
__device__ __forceinline__ void load_quad(const pq2_gemm_problem &p, int tok0, int gq, int first,
                                          wg_quad_values<NT> &v)
{
    const int groups = (int)(p.k >> 7);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const int tok = tok0 + first + 32 * i;
        v.xs[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v.sums[i] = make_int4(0, 0, 0, 0);
        if (tok < p.m) {
            const int64_t at = (int64_t)tok * groups + gq;
            v.xs[i] = __ldg(reinterpret_cast<const float4 *>(p.xs + at));
            v.sums[i] = __ldg(reinterpret_cast<const int4 *>(p.sums + at));
        }
    }
}

template <int BN, int NT>
__device__ __forceinline__ void store_quad(wg_quad<BN> &qd, int first, const wg_quad_values<NT> &v)
{
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const int tok = first + 32 * i;
        qd.tc[0][tok] = make_float2(v.xs[i].x, __int_as_float(token_bias(v.sums[i].x)));
        qd.tc[1][tok] = make_float2(v.xs[i].y, __int_as_float(token_bias(v.sums[i].y)));
        qd.tc[2][tok] = make_float2(v.xs[i].z, __int_as_float(token_bias(v.sums[i].z)));
        qd.tc[3][tok] = make_float2(v.xs[i].w, __int_as_float(token_bias(v.sums[i].w)));
    }
}

// One segment of a block's work: groups [g0, g1) of the tile (row block rb, token block tb);
// `first` for the block's first segment.
struct wg_segment {
    int rb, tb, g0, g1;
    bool first;
};

// The segments of a block, in order (next() fills the next one, false after the last).
// A tile grid: one, the block's tile (blockIdx.x, .y) and its split blockIdx.z.
struct wg_tile_segments {
    wg_segment sg;
    bool done;

    __device__ explicit wg_tile_segments(const pq2_gemm_problem &p) : done(false)
    {
        const int groups = (int)(p.k >> 7), split = (int)blockIdx.z;
        sg = {(int)blockIdx.x, (int)blockIdx.y, split * groups / p.splits,
              (split + 1) * groups / p.splits, true};
    }
    __device__ bool next(const pq2_gemm_problem &, wg_segment &s)
    {
        if (done) return false;
        s = sg, done = true;
        return true;
    }
};

// Stream-K: the grid's P blocks share the U = tiles x G units (unit t * G + g: group g of tile t
// = row block t / TB, token block t % TB; U < 2^31, gemm/launch.cu) evenly, block c taking units
// [c U / P, (c + 1) U / P); its segments are those units cut at tile boundaries.
struct wg_streamk_segments {
    int u, u1;
    bool first;

    __device__ explicit wg_streamk_segments(const pq2_gemm_problem &p) : first(true)
    {
        const int64_t units = (int64_t)p.tiles * (int)(p.k >> 7);
        u = (int)sk_first_unit(blockIdx.x, units, gridDim.x);
        u1 = (int)sk_first_unit(blockIdx.x + 1, units, gridDim.x);
    }
    __device__ bool next(const pq2_gemm_problem &p, wg_segment &s)
    {
        if (u >= u1) return false;
        const int groups = (int)(p.k >> 7), t = u / groups;
        s.g0 = u - t * groups;
        s.g1 = min(groups, s.g0 + (u1 - u));
        s.rb = t / p.token_blocks, s.tb = t - s.rb * p.token_blocks;
        s.first = first;
        first = false;
        u += s.g1 - s.g0;
        return true;
    }
};

// A producer warp: every group of the block's segments into its stage once the consumers have
// emptied it (the copies issued by the lane that is `copier`), and at each group that starts a
// quad (or a segment), its tokens' share of the quad's token constants (wg_quad_values).
template <int BN, int STAGES, int NT, class Segments>
__device__ __forceinline__ void produce(const pq2_gemm_problem &p, const wg_maps *maps,
                                        wg_stage<BN> *stages, wg_quad<BN> *quads, uint64_t *full,
                                        uint64_t *empty, Segments segs, int first, bool copier)
{
    wg_quad_values<NT> v;
    wg_segment sg;
    int i = 0, r = 0;  // the block's group and quad sequence numbers
    while (segs.next(p, sg)) {
        const int tok0 = sg.tb * BN;
        const int first_tile = (int)((int64_t)sg.rb * kRows / (16 * p.rt));
        load_quad<NT>(p, tok0, sg.g0 / kQuad * kQuad, first, v);
        for (int g = sg.g0; g < sg.g1; ++g, ++i) {
            const int s = i % STAGES, round = i / STAGES;
            if (round > 0) mbar_wait(&empty[s], (uint32_t)(round - 1) & 1u);
            wg_stage<BN> &st = stages[s];
            if (copier) {
                mbar_expect_tx(&full[s],
                               (uint32_t)(sizeof(st.q8) + sizeof(st.codes) + sizeof(st.wscales)));
                tma_load_2d(&full[s], st.q8, &maps->q8, g * 128, tok0);
                tma_load_4d(&full[s], st.codes, &maps->codes, 0, 0, g, first_tile);
                tma_load_4d(&full[s], st.wscales, &maps->scales, 0, 0, g, first_tile);
            }
            if (g % kQuad == 0 || g == sg.g0) {
                const int gq = g / kQuad * kQuad;
                store_quad<BN, NT>(quads[r % kQuads], first, v);
                ++r;
                if (gq + kQuad < sg.g1) load_quad<NT>(p, tok0, gq + kQuad, first, v);
            }
            mbar_arrive(&full[s]);  // release: the constants stored above
        }
    }
}

// A consumer warp (sub-tile `warp` of the block): every group of each of the block's segments
// into acc, which starts at zero for each segment; end(segment, acc) after each.
template <int BN, int STAGES, class Segments, class End>
__device__ __forceinline__ void
consume(const pq2_gemm_problem &p, wg_stage<BN> *stages, const wg_quad<BN> *quads, uint64_t *full,
        uint64_t *empty, Segments segs, int warp, int lane, float (&acc)[BN / 2], End end)
{
    int d[BN / 2];
    uint32_t a[4][4];
    wg_segment sg;
    // The block's group i is in stage s = i % STAGES, phase (i / STAGES) & 1, and its quad in ring
    // slot (q - 1) % kQuads after q quads (as in produce()): stepped, not divided, per group. The
    // lane's shared-memory addresses are pinned (ptxas would recompute them in every group),
    // except at 64 tokens, where the tile grid's two blocks per SM leave registers for the token
    // constants' address only (pinning more spills); the stream-K kernel shares that choice.
    constexpr bool kPin = BN != 64;
    int s = 0, slot = kQuads - 1;
    uint32_t phase = 0;
    const uint32_t full0 = pin_if<kPin>(smem_u32(full)), empty0 = pin_if<kPin>(smem_u32(empty));
    const uint32_t stage0 = pin_if<kPin>(smem_u32(stages));
    const uint32_t a0 = pin_if<kPin>(stage0 + a_offset<BN>(warp, lane));
    const uint32_t scales0 = pin_if<kPin>(stage0 + scale_offset<BN>(warp, lane));
    const uint32_t tc0 = pin_if<true>(smem_u32(&quads[0].tc[0][2 * (lane & 3)]));
    constexpr uint32_t kStage = sizeof(wg_stage<BN>), kQuadBytes = sizeof(wg_quad<BN>);
    while (segs.next(p, sg)) {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[j] = 0.0f;
        for (int g = sg.g0; g < sg.g1; ++g) {
            if ((g & (kQuad - 1)) == 0 || g == sg.g0) slot = slot == kQuads - 1 ? 0 : slot + 1;
            mbar_wait_at(full0 + 8 * s, phase);
            const uint32_t so = s * kStage;
            load_a(a0 + so, a);
            const uint64_t desc = wgmma_desc_sw128(stage0 + so);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) wgmma_u8s8<BN>(d, a[k], desc + 2 * k, k > 0);
            wgmma_commit();
            wgmma_wait<0>();
            pin_all(d);
            promote<BN>(scales0 + so, tc0 + slot * kQuadBytes + (g & (kQuad - 1)) * (BN * 8), d,
                        acc);
            __syncwarp();
            if (lane == 0) mbar_arrive_at(empty0 + 8 * s);
            if (++s == STAGES) s = 0, phase ^= 1;
        }
        end(sg, acc);
    }
}

// consume() two groups an iteration (a wide block's PAIRS): groups g and g + 1 into two int32
// accumulator sets, g promoted while g + 1 multiplies; an odd last group alone. The same
// promotions in the same order as consume(), so the same bits.
template <int BN, int STAGES, class Segments, class End>
__device__ __forceinline__ void consume_pairs(const pq2_gemm_problem &p, wg_stage<BN> *stages,
                                              const wg_quad<BN> *quads, uint64_t *full,
                                              uint64_t *empty, Segments segs, int warp, int lane,
                                              float (&acc)[BN / 2], End end)
{
    int d0[BN / 2], d1[BN / 2];
    uint32_t a0f[4][4], a1f[4][4];
    wg_segment sg;
    int s = 0, slot = kQuads - 1;
    uint32_t phase = 0;
    const uint32_t full0 = pin_if<true>(smem_u32(full)), empty0 = pin_if<true>(smem_u32(empty));
    const uint32_t stage0 = pin_if<true>(smem_u32(stages));
    const uint32_t a0 = pin_if<true>(stage0 + a_offset<BN>(warp, lane));
    const uint32_t scales0 = pin_if<true>(stage0 + scale_offset<BN>(warp, lane));
    const uint32_t tc0 = pin_if<true>(smem_u32(&quads[0].tc[0][2 * (lane & 3)]));
    constexpr uint32_t kStage = sizeof(wg_stage<BN>), kQuadBytes = sizeof(wg_quad<BN>);
    const auto next_stage = [&] {
        if (++s == STAGES) s = 0, phase ^= 1;
    };
    const auto tc_at = [&](int sl, int g) {
        return tc0 + sl * kQuadBytes + (g & (kQuad - 1)) * (BN * 8);
    };
    // group g's wgmmas (in stage offset so) into d, committed; and its promotion once retired
    const auto issue = [&](int (&d)[BN / 2], uint32_t (&af)[4][4], uint32_t so) {
        load_a(a0 + so, af);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k)
            wgmma_u8s8<BN>(d, af[k], wgmma_desc_sw128(stage0 + so) + 2 * k, k > 0);
        wgmma_commit();
    };
    const auto retire = [&](int (&d)[BN / 2], uint32_t so, uint32_t tc, int stage) {
        pin_all(d);
        promote<BN>(scales0 + so, tc, d, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive_at(empty0 + 8 * stage);
    };
    while (segs.next(p, sg)) {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[j] = 0.0f;
        int g = sg.g0;
        for (; g + 1 < sg.g1; g += 2) {
            if ((g & (kQuad - 1)) == 0 || g == sg.g0) slot = slot == kQuads - 1 ? 0 : slot + 1;
            const int slot_a = slot;
            if (((g + 1) & (kQuad - 1)) == 0) slot = slot == kQuads - 1 ? 0 : slot + 1;
            const int slot_b = slot, s_a = s;
            const uint32_t so_a = s * kStage;
            mbar_wait_at(full0 + 8 * s, phase);
            next_stage();
            const int s_b = s;
            const uint32_t so_b = s * kStage;
            issue(d0, a0f, so_a);
            mbar_wait_at(full0 + 8 * s, phase);
            next_stage();
            issue(d1, a1f, so_b);
            wgmma_wait<1>();
            retire(d0, so_a, tc_at(slot_a, g), s_a);
            wgmma_wait<0>();
            retire(d1, so_b, tc_at(slot_b, g + 1), s_b);
        }
        if (g < sg.g1) {
            if ((g & (kQuad - 1)) == 0 || g == sg.g0) slot = slot == kQuads - 1 ? 0 : slot + 1;
            mbar_wait_at(full0 + 8 * s, phase);
            const uint32_t so = s * kStage;
            issue(d0, a0f, so);
            wgmma_wait<0>();
            retire(d0, so, tc_at(slot, g), s);
            next_stage();
        }
        end(sg, acc);
    }
}

// The end of a stream-K segment, in the consumer threads only (the producer warp may be in the
// next segment): a tile the block holds whole goes to y; a tile shared by blocks ca..cb (their
// ranges meet inside it) goes as partials to the workspace (two slots per block: its first and
// its last segment), and the last of them to arrive adds them in block order and stores the sum.
template <int BN, class RowOf, class TokOf>
__device__ __forceinline__ void streamk_end(const pq2_gemm_problem &p, const wg_segment &sg,
                                            const float (&acc)[BN / 2], RowOf row_of, TokOf tok_of)
{
    constexpr int kTile = kRows * BN;
    __shared__ unsigned last;
    const int groups = (int)(p.k >> 7);
    const int64_t row0 = (int64_t)sg.rb * kRows, tok0 = (int64_t)sg.tb * BN;
    if (sg.g0 == 0 && sg.g1 == groups) {  // the whole tile: no other block shares it
        store_rows<BN / 2>(p, acc, row0, tok0, row_of, tok_of);
        return;
    }
    float *mine = p.partial + ((int64_t)blockIdx.x * 2 + (sg.first ? 0 : 1)) * kTile;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) mine[tok_of(i) * kRows + row_of(i)] = acc[i];
    const int t = sg.rb * p.token_blocks + sg.tb;
    const int64_t units = (int64_t)p.tiles * groups, blocks = gridDim.x;
    const int ca = (int)sk_block_of((int64_t)t * groups, units, blocks);
    const int cb = (int)sk_block_of((int64_t)t * groups + groups - 1, units, blocks);
    __threadfence();  // this thread's partials are visible device-wide before the block counts
    named_barrier_sync(1, kThreads);
    if (threadIdx.x == 0) last = atomicAdd(p.counters + t, 1u) == (unsigned)(cb - ca);
    named_barrier_sync(1, kThreads);
    if (!last) return;
    __threadfence();
    // Block ca's segment of tile t is its first when its range starts in t; every later
    // contributor's range starts inside t.
    const int slot0 = sk_first_unit(ca, units, blocks) / groups == t ? 0 : 1;
    sum_partials<BN>(
        p, row0, tok0, cb - ca + 1,
        [&](int j) { return p.partial + ((int64_t)(ca + j) * 2 + (j == 0 ? slot0 : 0)) * kTile; },
        (int)threadIdx.x, kThreads);
    if (threadIdx.x == 0) p.counters[t] = 0;  // ready for the next call
}

// Blocks per SM (launch bounds): a tile grid three at 32 tokens, two at 64, one above; a stream-K
// grid, whose segment loop holds more state, two at 32 and one above (bounded tighter, it spills
// or runs slower). (NOTES: sm90-32-token-tile, gemm64-two-blocks-per-sm,
// no-stream-k-at-tile-occupancy)
constexpr int wg_blocks_per_sm(int bn, bool sk)
{
    return sk ? (bn == 32 ? 2 : 1) : (bn == 32 ? 3 : bn == 64 ? 2 : 1);
}

// SK: a stream-K grid (config blocks > 0), else a tile grid (row block, token block, split);
// WIDE and PAIRS (tile grids only): the wide block and its two-group consumer (top of the file).
template <int BN, int STAGES, bool SK, bool WIDE = false, bool PAIRS = false>
__global__ void __launch_bounds__(wg_threads<WIDE>(), WIDE ? 1 : wg_blocks_per_sm(BN, SK))
    wgmma_kernel(const pq2_gemm_problem p, const __grid_constant__ wg_maps maps)
{
#if PQ2_WGMMA
    static_assert(STAGES <= kMaxStages, "one barrier pair per stage");
    static_assert(!WIDE || (!SK && BN >= 96), "wide blocks: tile grids of 96 or 128 tokens");
    static_assert(!PAIRS || WIDE, "two groups an iteration need a wide block's registers");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
    const uint32_t raw = smem_u32(smem_raw);
    wg_stage<BN> *stages =
        reinterpret_cast<wg_stage<BN> *>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    wg_quad<BN> *quads = reinterpret_cast<wg_quad<BN> *>(stages + STAGES);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            // the producer's expect_tx + the lanes that store token constants
            mbar_init_count(&full[s], 1 + (WIDE ? BN : 32));
            mbar_init_count(&empty[s], kWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();
    // The activations are the previous kernel's output (the quantiser or the caller's producer).
    pq2_pdl_handoff();

    float acc[BN / 2];
    const int gid = lane >> 2, tq = lane & 3;
    const auto row_of = [&](int i) { return 16 * warp + gid + 8 * ((i & 3) >> 1); };
    const auto tok_of = [&](int i) { return 8 * (i >> 2) + 2 * tq + (i & 1); };
    const bool consumer = warp < kWarps;
    const auto no_end = [](const wg_segment &, const float (&)[BN / 2]) {};
    if constexpr (SK) {
        const wg_streamk_segments segs(p);
        if (consumer)
            consume<BN, STAGES>(p, stages, quads, full, empty, segs, warp, lane, acc,
                                [&](const wg_segment &sg, const float (&a)[BN / 2]) {
                                    streamk_end<BN>(p, sg, a, row_of, tok_of);
                                });
        else
            produce<BN, STAGES, BN / 32>(p, &maps, stages, quads, full, empty, segs, lane,
                                         lane == 0);
    } else if constexpr (WIDE) {
        // Each branch has its own epilogue: a shared one is compiled for the producer's registers.
        const wg_tile_segments segs(p);
        if (consumer) {
            setmaxnreg_inc<kWideConsumerRegs>();
            if constexpr (PAIRS)
                consume_pairs<BN, STAGES>(p, stages, quads, full, empty, segs, warp, lane, acc,
                                          no_end);
            else
                consume<BN, STAGES>(p, stages, quads, full, empty, segs, warp, lane, acc, no_end);
            store_tile<BN>(p, acc, row_of, tok_of, true);
        } else {
            setmaxnreg_dec<kWideProducerRegs>();
            if (warp - kWarps < BN / 32)
                produce<BN, STAGES, 1>(p, &maps, stages, quads, full, empty, segs,
                                       32 * (warp - kWarps) + lane, warp == kWarps && lane == 0);
            store_tile<BN>(p, acc, row_of, tok_of, false);  // a split's sum needs every thread
        }
    } else {
        // One segment; every thread, the producer warp too, joins the epilogue.
        const wg_tile_segments segs(p);
        if (consumer)
            consume<BN, STAGES>(p, stages, quads, full, empty, segs, warp, lane, acc, no_end);
        else
            produce<BN, STAGES, BN / 32>(p, &maps, stages, quads, full, empty, segs, lane,
                                         lane == 0);
        store_tile<BN>(p, acc, row_of, tok_of, consumer);
    }
#else
    (void)p, (void)maps;
    __trap();
#endif
}

}  // namespace pq2_gemm
