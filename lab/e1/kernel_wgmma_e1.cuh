// kernel_wgmma_e1.cuh - LAB prototype (issue 37, E1; not product code): the wide sm_90a GEMM
// block (gemm/kernel_wgmma.cuh, config warps 12: a producer warpgroup and two consumer
// warpgroups, setmaxnreg 56/224) with
//   PING: the two consumer warpgroups issue their wgmmas in turn, ordered by named barriers
//         (warpgroup 0 issues group g, then warpgroup 1 issues g, then warpgroup 0 issues g + 1,
//         ...), so that one warpgroup's multiplies run on the tensor cores while the other
//         promotes (the FlashAttention-3 / CUTLASS ping-pong idea, per 128-deep K group);
//   PRE:  the first PRE of a group's BN / 8 token-constant records (16 bytes each, from the quad
//         ring) and the row-scale word loaded into registers after the group's wgmmas are issued
//         and before their wait; the rest as today, inside the promotion;
//   OFFSET: a contrast to PING: warpgroup 1 waits once, for warpgroup 0's first issue, and the
//         two then run free (does a phase offset at the start suffice, or must every group's
//         order be enforced?).
// (The stage's empty arrive needs no variant: ptxas already moves it to the last shared-memory
// read, which PRE all puts before the wait.)
// Only scheduling and synchronisation change: the promotion of each output is the same chain of
// the same operations in the same group order, so every variant gives the narrow block's bits.
//
// Barriers: ids 2 (warpgroup 0's turn) and 3 (warpgroup 1's turn), 256 threads each (both
// consumer warpgroups; ids 0 and 1 are __syncthreads and the stream-K epilogue). Per segment of
// G groups: warpgroup 0 waits on 2 before each group but the first and arrives on 3 after each
// issue; warpgroup 1 waits on 3 before each group and arrives on 2 after each issue but the
// last. So barrier 2 sees G - 1 waits and G - 1 arrivals, barrier 3 G of each, and a warpgroup
// can never arrive twice on one barrier before the other has waited on it (each arrival needs
// the other's previous one). OFFSET uses barrier 3 once (one wait, one arrival). The turn wait
// sits before the A-fragment loads: between those loads and the wgmma fence it made ptxas insert
// a warpgroup arrive before every wgmma (warning C7519; NOTES e1-ping-pong-compile-only).
// Check the SASS with lab/e1/sass_e1.py (lab/e1/build.sh runs it): 4 IGMMAs to a wait.
// Each warpgroup runs its own instance of the loop (WG a template argument): no predicates in the
// loop but "first group" (warpgroup 0) and "last group" (warpgroup 1).
#pragma once

#include "gemm/kernel_wgmma.cuh"

namespace pq2_gemm {

// The E1 variants, by config unroll (warps 12): {PING, PRE (records before the wait: BN / 8 all,
// BN / 16 half, BN / 32 quarter), OFFSET}.
//   3 PING; 4 PING + PRE all; 5 PING + PRE half; 6 PING + PRE quarter; 7 PRE all (no PING);
//   8 OFFSET (no PRE).
constexpr int kE1FirstMode = 3, kE1LastMode = 8;
constexpr bool e1_ping(int mode)
{
    return mode >= 3 && mode <= 6;
}
constexpr int e1_pre(int mode, int bn)
{
    return mode == 4 || mode == 7 ? bn / 8 : mode == 5 ? bn / 16 : mode == 6 ? bn / 32 : 0;
}
constexpr bool e1_offset(int mode)
{
    return mode == 8;
}

template <int ID> __device__ __forceinline__ void e1_bar_sync()
{
    asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(2 * 128) : "memory");
}
template <int ID> __device__ __forceinline__ void e1_bar_arrive()
{
    asm volatile("bar.arrive %0, %1;" ::"n"(ID), "n"(2 * 128) : "memory");
}

// The PRE constants of one group: the lane's row-scale word and its first NP token records.
template <int NP> struct e1_pre_consts {
    uint32_t scales;
    float4 t[NP > 0 ? NP : 1];
};

template <int NP>
__device__ __forceinline__ void e1_load_pre(uint32_t scales_at, uint32_t tc_at,
                                            e1_pre_consts<NP> &c)
{
    if constexpr (NP > 0) {
        c.scales = lds_u32(scales_at);
#pragma unroll
        for (int j = 0; j < NP; ++j) c.t[j] = lds_f32x4(tc_at + 64 * j);
    }
}

// promote() of kernel_wgmma.cuh with the first NP records (and, NP > 0, the scale word) taken
// from c: the same operations on the same values in the same order.
template <int BN, int NP>
__device__ __forceinline__ void e1_promote(uint32_t scales_at, uint32_t tc_at,
                                           const e1_pre_consts<NP> &c, const int (&d)[BN / 2],
                                           float (&acc)[BN / 2])
{
    row_scale w0, w1;
    make_row_scales(NP > 0 ? c.scales : lds_u32(scales_at), w0, w1);
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

// consume() of kernel_wgmma.cuh for consumer warpgroup WG of an E1 block (the variants above).
template <int BN, int STAGES, int WG, int MODE, class Segments>
__device__ __forceinline__ void consume_e1(const pq2_gemm_problem &p, wg_stage<BN> *stages,
                                           const wg_quad<BN> *quads, uint64_t *full,
                                           uint64_t *empty, Segments segs, int warp, int lane,
                                           float (&acc)[BN / 2])
{
    constexpr bool kPing = e1_ping(MODE), kOffset = e1_offset(MODE);
    constexpr int kPre = e1_pre(MODE, BN);
    constexpr int kMine = 2 + WG, kOther = 3 - WG;  // this warpgroup's turn, the other's
    int d[BN / 2];
    uint32_t a[4][4];
    e1_pre_consts<kPre> pre;
    wg_segment sg;
    int s = 0, slot = kQuads - 1;
    uint32_t phase = 0;
    const uint32_t full0 = pin_if<true>(smem_u32(full)), empty0 = pin_if<true>(smem_u32(empty));
    const uint32_t stage0 = pin_if<true>(smem_u32(stages));
    const uint32_t a0 = pin_if<true>(stage0 + a_offset<BN>(warp, lane));
    const uint32_t scales0 = pin_if<true>(stage0 + scale_offset<BN>(warp, lane));
    const uint32_t tc0 = pin_if<true>(smem_u32(&quads[0].tc[0][2 * (lane & 3)]));
    constexpr uint32_t kStage = sizeof(wg_stage<BN>), kQuadBytes = sizeof(wg_quad<BN>);
    while (segs.next(p, sg)) {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[j] = 0.0f;
        for (int g = sg.g0; g < sg.g1; ++g) {
            if ((g & (kQuad - 1)) == 0 || g == sg.g0) slot = slot == kQuads - 1 ? 0 : slot + 1;
            mbar_wait_at(full0 + 8 * s, phase);
            if constexpr (kPing) {  // this warpgroup's turn (warpgroup 0's first: no wait)
                if (WG == 1 || g != sg.g0) e1_bar_sync<kMine>();
            }
            if constexpr (kOffset && WG == 1) {  // once: after warpgroup 0's first issue
                if (g == sg.g0) e1_bar_sync<3>();
            }
            const uint32_t so = s * kStage;
            const uint32_t tc = tc0 + slot * kQuadBytes + (g & (kQuad - 1)) * (BN * 8);
            load_a(a0 + so, a);
            const uint64_t desc = wgmma_desc_sw128(stage0 + so);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) wgmma_u8s8<BN>(d, a[k], desc + 2 * k, k > 0);
            wgmma_commit();
            if constexpr (kPing) {  // the other's turn (warpgroup 1's last: nobody waits)
                if (WG == 0 || g + 1 < sg.g1) e1_bar_arrive<kOther>();
            }
            if constexpr (kOffset && WG == 0) {
                if (g == sg.g0) e1_bar_arrive<3>();
            }
            e1_load_pre<kPre>(scales0 + so, tc, pre);
            wgmma_wait<0>();
            pin_all(d);
            e1_promote<BN, kPre>(scales0 + so, tc, pre, d, acc);
            __syncwarp();
            if (lane == 0) mbar_arrive_at(empty0 + 8 * s);
            if (++s == STAGES) s = 0, phase ^= 1;
        }
    }
}

// The wide block of wgmma_kernel (tile grids, 96 or 128 tokens) with the E1 consumers.
template <int BN, int STAGES, int MODE>
__global__ void __launch_bounds__(wg_threads<true>(), 1)
    wgmma_e1_kernel(const pq2_gemm_problem p, const __grid_constant__ wg_maps maps)
{
#if PQ2_WGMMA
    static_assert(STAGES <= kMaxStages, "one barrier pair per stage");
    static_assert(BN == 96 || BN == 128, "E1: the wide block's 96 or 128 tokens");
    static_assert(MODE >= kE1FirstMode && MODE <= kE1LastMode, "E1 modes 3..8");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
    const uint32_t raw = smem_u32(smem_raw);
    wg_stage<BN> *stages =
        reinterpret_cast<wg_stage<BN> *>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    wg_quad<BN> *quads = reinterpret_cast<wg_quad<BN> *>(stages + STAGES);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init_count(&full[s], 1 + BN);  // the expect_tx + the BN constant-storing lanes
            mbar_init_count(&empty[s], kWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();
    pq2_pdl_handoff();

    float acc[BN / 2];
    const int gid = lane >> 2, tq = lane & 3;
    const auto row_of = [&](int i) { return 16 * warp + gid + 8 * ((i & 3) >> 1); };
    const auto tok_of = [&](int i) { return 8 * (i >> 2) + 2 * tq + (i & 1); };
    const wg_tile_segments segs(p);
    // Each branch has its own epilogue (a shared one is compiled for the producer's registers),
    // and each consumer warpgroup its own loop.
    if (warp < kWarps / 2) {
        setmaxnreg_inc<kWideConsumerRegs>();
        consume_e1<BN, STAGES, 0, MODE>(p, stages, quads, full, empty, segs, warp, lane, acc);
        store_tile<BN>(p, acc, row_of, tok_of, true);
    } else if (warp < kWarps) {
        setmaxnreg_inc<kWideConsumerRegs>();
        consume_e1<BN, STAGES, 1, MODE>(p, stages, quads, full, empty, segs, warp, lane, acc);
        store_tile<BN>(p, acc, row_of, tok_of, true);
    } else {
        setmaxnreg_dec<kWideProducerRegs>();
        if (warp - kWarps < BN / 32)
            produce<BN, STAGES, 1>(p, &maps, stages, quads, full, empty, segs,
                                   32 * (warp - kWarps) + lane, warp == kWarps && lane == 0);
        store_tile<BN>(p, acc, row_of, tok_of, false);  // a split's sum needs every thread
    }
#else
    (void)p, (void)maps;
    __trap();
#endif
}

// The E1 kernel of (tokens 96 / 128, stages 4 / 6, mode 3..8), or null.
using wgmma_e1_fn = void (*)(const pq2_gemm_problem, const wg_maps);

template <int BN, int STAGES> wgmma_e1_fn e1_kernel_of_mode(int mode)
{
    switch (mode) {
    case 3: return wgmma_e1_kernel<BN, STAGES, 3>;
    case 4: return wgmma_e1_kernel<BN, STAGES, 4>;
    case 5: return wgmma_e1_kernel<BN, STAGES, 5>;
    case 6: return wgmma_e1_kernel<BN, STAGES, 6>;
    case 7: return wgmma_e1_kernel<BN, STAGES, 7>;
    case 8: return wgmma_e1_kernel<BN, STAGES, 8>;
    default: return nullptr;
    }
}

template <int BN> wgmma_e1_fn e1_kernel_of_stages(int stages, int mode)
{
    switch (stages) {
    case 4: return e1_kernel_of_mode<BN, 4>(mode);
    case 6: return e1_kernel_of_mode<BN, 6>(mode);
    default: return nullptr;
    }
}

inline wgmma_e1_fn e1_kernel(int tokens, int stages, int mode)
{
    switch (tokens) {
    case 96: return e1_kernel_of_stages<96>(stages, mode);
    case 128: return e1_kernel_of_stages<128>(stages, mode);
    default: return nullptr;
    }
}

}  // namespace pq2_gemm
