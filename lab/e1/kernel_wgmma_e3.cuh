// kernel_wgmma_e3.cuh - LAB prototype (issue 37, E3; not product code): the sm_90a GEMM block
// (gemm/kernel_wgmma.cuh) with its consumer loop trimmed of bookkeeping, on the narrow block
// (config warps 8: two consumer warpgroups and a producer warp) and on the wide block (warps 12:
// a producer warpgroup, setmaxnreg 56/224); tile grids of 96 or 128 tokens (lab/e1/e3_kernels.cu
// instantiates 128), 4 or 6 stages.
//
// What every form changes against consume():
//   - ONE OFFSET: everything a consumer reads of a group lives in the group's stage: the stage
//     holds, besides wg_stage's bytes, the group's token-constant column (BN {d_x, bias} pairs,
//     stored by the producer when it fills the stage, from the quad it loaded a quad earlier)
//     and the stage's full and empty barriers. So the barrier, the A fragments, the row scales,
//     the token constants and the descriptor are all a pinned base (per lane or per warp) plus
//     the one stepped stage offset `so` plus an immediate: no quad ring, slot or (g & 3)
//     arithmetic, no per-address multiply. (A stage is 1 KB larger at 128 tokens, 22528 bytes,
//     and the 32 KB ring is gone: 136 KB at 6 stages against 162.)
//   - the descriptor's low word is a pinned base plus so / 16 (no mask, shift and or per group):
//     stage0 + so < 2^18 keeps it inside the 14-bit field;
//   - the empty arrive's lane test is a pinned word (one ISETP, no S2R of %tid per group);
//   - the narrow block branches to its consumers on a vote (__all_sync), which ptxas knows to be
//     warp-uniform: it then keeps the stage offset in a uniform register and addresses shared
//     memory as [lane base + UR + immediate] (4 adds a group fewer than with `if (consumer)`);
//   - MAGIC: the promotion's magic number is 1.25 * 2^17 instead of 1.25 * 2^23 (the token bias
//     kBias17 - 64 sum(q), made by this kernel's producer), so the biased product reads as
//     1.25 * 2^17 + dot and the first FFMA takes d_w itself with c = -1.25 * 2^17 * d_w: the row
//     constants are 2 HADD2.F32 + 2 FMUL instead of 2 + 4. Bits: F17 * d_w equals
//     (1.25 * 2^23 + 64 dot) * (d_w / 64) exactly, and c is the same float either way
//     (-kBiasF * (d_w / 64) = -1.25 * 2^17 * d_w, both products exact: at most 13 significant
//     bits), so the first FFMA rounds the same exact value once, for every d_w including 0, -0,
//     inf and NaN; |64 dot| < 2^21 keeps kBias17 + 64 dot inside the binade [2^17, 2^18) as it
//     kept kBias + 64 dot inside [2^23, 2^24).
// Forms (config unroll: E3 modes 9..16; e3_form_of):
//   U2:      two groups a loop iteration (STAGES even: stages 2j and 2j + 1 of one round, one
//            parity), the stage offset, phase and loop counter stepped once per two groups; an
//            odd last group alone after the loop. In the narrow block only the form with a full
//            wait before each group and a release after each does not spill: without the second
//            wait (a block boundary) ptxas overlaps the second group's A loads and expansion with
//            the first group's promotion and spills 44-60 bytes of the 168 registers. (A branch
//            between the two groups stops that too, but then ptxas builds the descriptors in
//            vector registers, two R2UR per wgmma: 284 a group.)
//   PAIRFULL: ONE full wait per two groups (the producer arms a pair's full barrier once for
//            both groups' bytes and its lanes arrive once, after both groups' constants);
//   PAIRREL: one empty barrier per two stages: a consumer releases once per two groups (the
//            producer waits once for both stages);
//   ALL:     every lane arrives on the empty barrier (count 32 per consumer warp): no lane
//            test, no __syncwarp;
//   PING, PRE (wide only): E1's ping-pong order (kernel_wgmma_e1.cuh) with the turn barriers
//            arrived once before and synced once after the loop instead of first/last-group
//            predicates (warpgroup 1 arrives on 2 before its first group, warpgroup 0 syncs on 2
//            after its last: every arrival meets one sync), and E1's PRE records loaded between
//            the issue and the wait.
// Every form promotes each output with the same chain of the same operations in the same group
// order as the narrow block: the same bits.
#pragma once

#include "gemm/kernel_wgmma.cuh"

namespace pq2_gemm {

constexpr int kE3FirstMode = 9, kE3LastMode = 16;
struct e3_form {
    bool u2, pairfull, pairrel, all, magic, ping;
    int pre_div;  // PRE: BN / pre_div token records before the wait (0: none)
};
// Narrow and wide blocks:
//   9  U1 (one group an iteration);
//   10 U1 + ALL;
//   11 U1 + ALL without MAGIC (the product's row constants: what MAGIC saves);
//   12 U2 with a full wait per group (the only U2 form that does not spill in the narrow block);
// the wide block only (they spill 44-60 bytes in the narrow block's 168 registers):
//   13 U2 + PAIRFULL;
//   14 U2 + PAIRFULL + PAIRREL + ALL;
//   15 U2 + PAIRFULL + PAIRREL + ALL + PING + PRE quarter;
//   16 U1 + ALL + PING + PRE half.
// All but 11 with MAGIC.
#ifndef E3_TEST
#define E3_TEST 0x11
#endif
constexpr e3_form e3_form_of(int mode)
{
    switch (mode) {
    case 10: return {false, false, false, true, true, false, 0};
    case 11: return {false, false, false, true, false, false, 0};
    case 12: return {true, false, false, false, true, false, 0};
    case 13: return {true, true, false, false, true, false, 0};
    case 14: return {true, true, true, true, true, false, 0};
    case 15: return {true, true, true, true, true, true, 32};  // PRE half spills 16 bytes here
    case 16: return {false, false, false, true, true, true, 16};
    case 99:  // compile-only experiments: bits u2, pairfull, pairrel, all, magic
        return {(E3_TEST & 1) != 0, (E3_TEST & 2) != 0, (E3_TEST & 4) != 0, (E3_TEST & 8) != 0,
                (E3_TEST & 16) != 0, false, 0};
    default: return {false, false, false, false, true, false, 0};  // 9
    }
}
constexpr bool e3_wide_only(int mode)
{
    return mode >= 13;
}

constexpr int kBias17 = 0x48200000;  // the bits of 1.25 * 2^17
constexpr float kBias17F = 163840.0f;

template <bool MAGIC> __device__ __forceinline__ int e3_token_bias(int sum)
{
    return (MAGIC ? kBias17 : kBias) - 64 * sum;
}

// A stage: wg_stage's bytes, then the group's token constants and the stage's two barriers.
template <int BN> struct alignas(1024) e3_stage {
    uint8_t q8[BN * 128];
    uint8_t codes[kSubtiles][512];
    uint16_t wscales[kSubtiles][16];
    float2 tc[BN];  // {d_x, bias} of token t (the consumer lane's pair: one 16-byte load)
    uint64_t full, empty;
};
static_assert(offsetof(e3_stage<128>, codes) == offsetof(wg_stage<128>, codes) &&
                  offsetof(e3_stage<128>, wscales) == offsetof(wg_stage<128>, wscales) &&
                  offsetof(e3_stage<96>, codes) == offsetof(wg_stage<96>, codes) &&
                  offsetof(e3_stage<96>, wscales) == offsetof(wg_stage<96>, wscales),
              "a_offset / scale_offset hold");

template <int BN> constexpr size_t e3_smem_bytes(int stages)
{
    return sizeof(e3_stage<BN>) * stages + 1024;
}

// ---- small PTX helpers ------------------------------------------------------------------------

// E1's named-barrier helpers (kernel_wgmma_e1.cuh is not included: its kernel table would
// compile again in this translation unit).
template <int ID> __device__ __forceinline__ void e3_bar_sync()
{
    asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(2 * 128) : "memory");
}
template <int ID> __device__ __forceinline__ void e3_bar_arrive()
{
    asm volatile("bar.arrive %0, %1;" ::"n"(ID), "n"(2 * 128) : "memory");
}

// The PRE constants of one group: the lane's row-scale word and its first NP token records.
template <int NP> struct e3_pre_consts {
    uint32_t scales;
    float4 t[NP > 0 ? NP : 1];
};
template <int NP>
__device__ __forceinline__ void e3_load_pre(uint32_t scales_at, uint32_t tc_at,
                                            e3_pre_consts<NP> &c)
{
    if constexpr (NP > 0) {
        c.scales = lds_u32(scales_at);
#pragma unroll
        for (int j = 0; j < NP; ++j) c.t[j] = lds_f32x4(tc_at + 64 * j);
    }
}

// promote() with the first NP records (and, NP > 0, the scale word) from c, and MAGIC's row
// constants {d_w, -1.25 * 2^17 * d_w} (else make_row_scales': {d_w / 64, -kBiasF * d_w / 64}).
template <int BN, int NP, bool MAGIC>
__device__ __forceinline__ void e3_promote(uint32_t scales_at, uint32_t tc_at,
                                           const e3_pre_consts<NP> &c, const int (&d)[BN / 2],
                                           float (&acc)[BN / 2])
{
    const uint32_t word = NP > 0 ? c.scales : lds_u32(scales_at);
    row_scale w0, w1;
    if constexpr (MAGIC) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&word));
        w0 = {f.x, f.x * -kBias17F}, w1 = {f.y, f.y * -kBias17F};
    } else {
        make_row_scales(word, w0, w1);
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const float4 t = j < NP ? c.t[j < NP ? j : 0] : lds_f32x4(tc_at + 64 * j);
        const int k0 = __float_as_int(t.y), k1 = __float_as_int(t.w);
        float *a = &acc[4 * j];
        const int *q = &d[4 * j];
        a[0] = promote_one(q[0] + k0, w0, t.x, a[0]);
        a[1] = promote_one(q[1] + k1, w0, t.z, a[1]);
        a[2] = promote_one(q[2] + k0, w1, t.x, a[2]);
        a[3] = promote_one(q[3] + k1, w1, t.z, a[3]);
    }
}

// ---- producer ---------------------------------------------------------------------------------

__device__ __forceinline__ float e3_pick(const float4 &v, int j)
{
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
__device__ __forceinline__ int e3_pick(const int4 &v, int j)
{
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// The producer (a narrow block's warp: NT = BN / 32 tokens a lane, lane + 32 i; a wide block's
// warp pw of the producer warpgroup: NT = 1, token 32 pw + lane): every group of the block's
// segment into its stage, with the group's token-constant column, from quads loaded a quad
// ahead (two quads in registers: the one being stored and the next).
template <int BN, int STAGES, int NT, int MODE>
__device__ __forceinline__ void produce_e3(const pq2_gemm_problem &p, const wg_maps *maps,
                                           e3_stage<BN> *stages, const wg_segment &sg, int first,
                                           bool copier)
{
    constexpr e3_form F = e3_form_of(MODE);
    constexpr uint32_t kBytes = sizeof(stages[0].q8) + sizeof(stages[0].codes) +
                                sizeof(stages[0].wscales);
    wg_quad_values<NT> cur, nxt;
    const int tok0 = sg.tb * BN;
    const int first_tile = (int)((int64_t)sg.rb * kRows / (16 * p.rt));
    const int gq0 = sg.g0 / kQuad * kQuad;
    load_quad<NT>(p, tok0, gq0, first, cur);
    if (gq0 + kQuad < sg.g1) load_quad<NT>(p, tok0, gq0 + kQuad, first, nxt);
    int s = 0, round = 0;
    for (int g = sg.g0; g < sg.g1; ++g) {
        if (g % kQuad == 0 && g != sg.g0) {
            cur = nxt;
            if (g + kQuad < sg.g1) load_quad<NT>(p, tok0, g + kQuad, first, nxt);
        }
        const int bf = F.pairfull ? s & ~1 : s, be = F.pairrel ? s & ~1 : s;  // barriers' stages
        if (be == s && round > 0) mbar_wait(&stages[be].empty, (uint32_t)(round - 1) & 1u);
        e3_stage<BN> &st = stages[s];
        if (copier) {
            if (bf == s)
                mbar_expect_tx(&stages[bf].full,
                               F.pairfull && g + 1 < sg.g1 ? 2 * kBytes : kBytes);
            tma_load_2d(&stages[bf].full, st.q8, &maps->q8, g * 128, tok0);
            tma_load_4d(&stages[bf].full, st.codes, &maps->codes, 0, 0, g, first_tile);
            tma_load_4d(&stages[bf].full, st.wscales, &maps->scales, 0, 0, g, first_tile);
        }
        const int j = g & (kQuad - 1);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const int bias = e3_token_bias<F.magic>(e3_pick(cur.sums[i], j));
            st.tc[first + 32 * i] = make_float2(e3_pick(cur.xs[i], j), __int_as_float(bias));
        }
        // release: the constants stored above (a pair's lanes once, after its last group)
        if (!F.pairfull || (s & 1) == 1 || g + 1 == sg.g1) mbar_arrive(&stages[bf].full);
        if (++s == STAGES) s = 0, ++round;
    }
}

// ---- consumer ---------------------------------------------------------------------------------

// A consumer warp of warpgroup WG (-1: no ping-pong) over the block's one segment.
template <int BN, int STAGES, int MODE, int WG>
__device__ __forceinline__ void consume_e3(e3_stage<BN> *stages, const wg_segment &sg, int warp,
                                           int lane, float (&acc)[BN / 2])
{
    constexpr bool kU2 = e3_form_of(MODE).u2, kPairFull = e3_form_of(MODE).pairfull;
    constexpr bool kPairRel = e3_form_of(MODE).pairrel;
    constexpr bool kAll = e3_form_of(MODE).all, kMagic = e3_form_of(MODE).magic;
    constexpr bool kPing = e3_form_of(MODE).ping;
    constexpr int kPre = e3_form_of(MODE).pre_div ? BN / e3_form_of(MODE).pre_div : 0;
    static_assert(STAGES % 2 == 0, "two stages of one round an iteration");
    static_assert(!kPing || WG >= 0, "ping-pong: a warpgroup's own loop");
    constexpr int kMine = 2 + (WG > 0 ? 1 : 0), kOther = 3 - (WG > 0 ? 1 : 0);
    constexpr uint32_t kStage = sizeof(e3_stage<BN>), kRound = STAGES * kStage;
    constexpr uint32_t kFull = offsetof(e3_stage<BN>, full), kEmpty = offsetof(e3_stage<BN>, empty);
    constexpr uint64_t kDescHi = (uint64_t)((1024 >> 4) | (1u << 30)) << 32;  // wgmma_desc_sw128
    const uint32_t stage0 = pin_if<true>(smem_u32(stages));
    const uint32_t a0 = pin_if<true>(stage0 + a_offset<BN>(warp, lane));
    const uint32_t sc0 = pin_if<true>(stage0 + scale_offset<BN>(warp, lane));
    const uint32_t tc0 =
        pin_if<true>(stage0 + (uint32_t)offsetof(e3_stage<BN>, tc) + 16 * (lane & 3));
    // wgmma_desc_sw128(stage0)'s low word; + so / 16 is the stage's
    const uint32_t dlo0 = pin_if<true>(((stage0 & 0x3FFFF) >> 4) | (1u << 16));
    const uint32_t leader = pin_if<true>(lane == 0 ? 1u : 0u);

    int d[BN / 2];
    uint32_t a[4][4];
    e3_pre_consts<kPre> pre;
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) acc[j] = 0.0f;
    uint32_t so = 0, phase = 0;

    const auto release = [&](uint32_t bso) {
        if constexpr (kAll) {
            mbar_arrive_at(stage0 + bso + kEmpty);
        } else {
            __syncwarp();
            if (leader) mbar_arrive_at(stage0 + bso + kEmpty);
        }
    };
    // One group in the stage at offset gso = so + h * kStage (h: the group's half of a pair;
    // desc0: the descriptor of the stage at so); wait: for its full barrier (at gso) first; rel:
    // arrive on its empty barrier after (PAIRREL: the pair's, at so).
    const auto group = [&](uint32_t h, uint64_t desc0, bool wait, bool rel) {
        const uint32_t gso = so + h * kStage;
        if (wait) mbar_wait_at(stage0 + gso + kFull, phase);
        if constexpr (kPing) e3_bar_sync<kMine>();
        load_a(a0 + gso, a);
        const uint64_t desc = desc0 + h * (kStage >> 4);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_u8s8<BN>(d, a[k], desc + 2 * k, k > 0);
        wgmma_commit();
        if constexpr (kPing) e3_bar_arrive<kOther>();
        e3_load_pre<kPre>(sc0 + gso, tc0 + gso, pre);
        wgmma_wait<0>();
        pin_all(d);
        e3_promote<BN, kPre, kMagic>(sc0 + gso, tc0 + gso, pre, d, acc);
        if (rel) release(kPairRel ? so : gso);
    };
    if constexpr (kPing && WG == 1) e3_bar_arrive<kOther>();  // warpgroup 0's first turn
    int n = sg.g1 - sg.g0;
    if constexpr (kU2) {
        for (; n >= 2; n -= 2) {
            const uint64_t desc = kDescHi | (dlo0 + (so >> 4));
            group(0, desc, true, !kPairRel);
            group(1, desc, !kPairFull, true);
            so += 2 * kStage;
            if (so == kRound) so = 0, phase ^= 1;
        }
        if (n > 0) group(0, kDescHi | (dlo0 + (so >> 4)), true, true);
    } else {
        for (; n > 0; --n) {
            group(0, kDescHi | (dlo0 + (so >> 4)), true, true);
            so += kStage;
            if (so == kRound) so = 0, phase ^= 1;
        }
    }
    if constexpr (kPing && WG == 0) e3_bar_sync<kMine>();  // warpgroup 1's last arrival
}

// ---- kernel -----------------------------------------------------------------------------------

// The E3 block: WIDE (warps 12, a producer warpgroup) or narrow (warps 8, a producer warp).
template <int BN, int STAGES, bool WIDE, int MODE>
__global__ void __launch_bounds__(wg_threads<WIDE>(), 1)
    wgmma_e3_kernel(const pq2_gemm_problem p, const __grid_constant__ wg_maps maps)
{
#if PQ2_WGMMA
    constexpr e3_form F = e3_form_of(MODE);
    static_assert(BN == 96 || BN == 128, "E3: 96 or 128 tokens");
    static_assert(STAGES == 4 || STAGES == 6, "E3: an even number of stages");
    static_assert(!F.ping || WIDE, "ping-pong: the wide block's per-warpgroup loops");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    e3_stage<BN> *stages =
        reinterpret_cast<e3_stage<BN> *>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            // the producer's expect_tx + the lanes that store token constants
            if (!F.pairfull || s % 2 == 0) mbar_init_count(&stages[s].full, 1 + (WIDE ? BN : 32));
            if (!F.pairrel || s % 2 == 0)
                mbar_init_count(&stages[s].empty, F.all ? 32 * kWarps : kWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();
    pq2_pdl_handoff();

    float acc[BN / 2];
    const int gid = lane >> 2, tq = lane & 3;
    const auto row_of = [&](int i) { return 16 * warp + gid + 8 * ((i & 3) >> 1); };
    const auto tok_of = [&](int i) { return 8 * (i >> 2) + 2 * tq + (i & 1); };
    const wg_segment sg = wg_tile_segments(p).sg;
    if constexpr (WIDE) {
        // each branch its own epilogue (a shared one is compiled for the producer's registers);
        // without ping-pong one consumer branch for both warpgroups (one copy of the loop)
        const auto producer = [&] {
            setmaxnreg_dec<kWideProducerRegs>();
            if (warp - kWarps < BN / 32)
                produce_e3<BN, STAGES, 1, MODE>(p, &maps, stages, sg, 32 * (warp - kWarps) + lane,
                                                warp == kWarps && lane == 0);
            store_tile<BN>(p, acc, row_of, tok_of, false);  // a split's sum needs every thread
        };
        if constexpr (!F.ping) {
            if (warp < kWarps) {
                setmaxnreg_inc<kWideConsumerRegs>();
                consume_e3<BN, STAGES, MODE, -1>(stages, sg, warp, lane, acc);
                store_tile<BN>(p, acc, row_of, tok_of, true);
            } else {
                producer();
            }
        } else {
            if (warp < kWarps / 2) {
                setmaxnreg_inc<kWideConsumerRegs>();
                consume_e3<BN, STAGES, MODE, 0>(stages, sg, warp, lane, acc);
                store_tile<BN>(p, acc, row_of, tok_of, true);
            } else if (warp < kWarps) {
                setmaxnreg_inc<kWideConsumerRegs>();
                consume_e3<BN, STAGES, MODE, 1>(stages, sg, warp, lane, acc);
                store_tile<BN>(p, acc, row_of, tok_of, true);
            } else {
                producer();
            }
        }
    } else {
        const bool consumer = warp < kWarps;
        // a vote, so that ptxas sees a warp-uniform branch: then it keeps the stage offset in a
        // uniform register and addresses shared memory as [lane base + UR + immediate] (with
        // `if (consumer)` it kept the offset in a vector register and added it to each lane
        // base: 4 more instructions a group)
        if (__all_sync(0xffffffffu, consumer))
            consume_e3<BN, STAGES, MODE, -1>(stages, sg, warp, lane, acc);
        else
            produce_e3<BN, STAGES, BN / 32, MODE>(p, &maps, stages, sg, lane, lane == 0);
        store_tile<BN>(p, acc, row_of, tok_of, consumer);
    }
#else
    (void)p, (void)maps;
    __trap();
#endif
}

// ---- the kernel table -------------------------------------------------------------------------

// The E3 kernel of (tokens 96 / 128, stages 4 / 6, wide or narrow, mode 9..15), or null (the
// ping-pong modes on the narrow block).
using wgmma_e3_fn = void (*)(const pq2_gemm_problem, const wg_maps);

template <int BN, int STAGES, bool WIDE> wgmma_e3_fn e3_kernel_of_mode(int mode)
{
    switch (mode) {
    case 9: return wgmma_e3_kernel<BN, STAGES, WIDE, 9>;
    case 10: return wgmma_e3_kernel<BN, STAGES, WIDE, 10>;
    case 11: return wgmma_e3_kernel<BN, STAGES, WIDE, 11>;
    case 12: return wgmma_e3_kernel<BN, STAGES, WIDE, 12>;
    default: break;
    }
    if constexpr (WIDE) switch (mode) {
        case 13: return wgmma_e3_kernel<BN, STAGES, WIDE, 13>;
        case 14: return wgmma_e3_kernel<BN, STAGES, WIDE, 14>;
        case 15: return wgmma_e3_kernel<BN, STAGES, WIDE, 15>;
        case 16: return wgmma_e3_kernel<BN, STAGES, WIDE, 16>;
        default: break;
        }
    return nullptr;
}

template <int BN, bool WIDE> wgmma_e3_fn e3_kernel_of_stages(int stages, int mode)
{
    switch (stages) {
    case 4: return e3_kernel_of_mode<BN, 4, WIDE>(mode);
    case 6: return e3_kernel_of_mode<BN, 6, WIDE>(mode);
    default: return nullptr;
    }
}

// lab/e1/e3_kernels.cu (two translation units: the narrow and the wide kernels)
wgmma_e3_fn e3_kernel_narrow(int tokens, int stages, int mode);
wgmma_e3_fn e3_kernel_wide(int tokens, int stages, int mode);
inline wgmma_e3_fn e3_kernel(int tokens, int stages, bool wide, int mode)
{
    return wide ? e3_kernel_wide(tokens, stages, mode) : e3_kernel_narrow(tokens, stages, mode);
}

}  // namespace pq2_gemm
