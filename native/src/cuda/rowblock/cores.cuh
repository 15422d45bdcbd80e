// cores.cuh - the arithmetic of the row-block kernels: one named core per token class, each
// accumulating one unit (one 128-group of a row block: the lane's code bytes w[r] and scale words
// sc[r] of its RS sub-tiles) into the lane's fp32 accumulators acc[r][nt][j] (C element j of
// token block nt of sub-tile r).
//
// The weights are the A operand of the tensor-core MMA (16 rows x one group per sub-tile); the
// activations are B, tokens along its 8 columns. For m > 1 the B fragment of lane (gid, tq)
// carries token min(gid, m - 1): with m < 8 the surplus columns repeat the last token instead of
// being predicated off, so the hot loop has no token tests; C columns >= m are never stored.
// Every integer below is exact; the float products round as float(dot) * (d_w * d_x) would.
#pragma once

#include <cuda_fp16.h>

#include "device/codes.cuh"
#include "device/ptx.cuh"
#include "rowblock/activations.cuh"
#include "rowblock/sources.cuh"

// d = the four plane MMAs (A fragments a[s], B fragments b[s]) chained into one accumulator
// started from c (int32, exact).
__device__ __forceinline__ void mma_planes_chained(int (&d)[4], const uint32_t (&a)[4][4],
                                                   const uint2 (&b)[4], const int (&c)[4])
{
    pq2_mma_u8s8(d, a[0], b[0].x, b[0].y, c);
    pq2_mma_u8s8(d, a[1], b[1].x, b[1].y, d);
    pq2_mma_u8s8(d, a[2], b[2].x, b[2].y, d);
    pq2_mma_u8s8(d, a[3], b[3].x, b[3].y, d);
}

// m == 1, "bit slices": B column b is bit plane b of the token's q8 (device/codes.cuh), and the A
// operand is the lane's 16 code bytes as loaded, read as 256 bits per row: one AND-POPC MMA against
// B1 (both bits of each code meet the activation bit) plus one against B2 (the high bit again)
// gives sum(code * bit b of q) for all eight b, exact, with no masks. Lane tq combines its two bit
// planes (f2); its float accumulators take 4^-tq of the row's dot(code - 1, q), and reduce_store
// scales lane tq by 4^tq and adds the four lanes. (m == 2 the same way needs two B operands and
// more registers, which costs gate_up a second wave of blocks: NOTES:
// m1-bit-slices-m2-column-planes.)
template <int RS>
__device__ __forceinline__ void core_bit_slices(const uint4 (&w)[RS], const uint32_t (&sc)[RS],
                                                int g, const act_ptrs<1, 1> &A, lane_consts<1> &lc,
                                                float (&acc)[RS][1][4])
{
    const uint4 bx = __ldg(A.xb + (unsigned)g * (PQ2_BITS_GROUP_WORDS / 4));
    const int ns = __ldg(A.sums + (unsigned)g) * lc.c_neg;
    const float xs = __ldg(A.xs + (unsigned)g);
#pragma unroll
    for (int r = 0; r < RS; ++r) {
        const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
        const uint32_t a[4] = {w[r].x, w[r].y, w[r].z,
                               w[r].w};  // fragment order (batch): no moves on TILES
        const int init[4] = {ns, 0, ns, 0};
        int d[4];
        pq2_bmma_and_popc(d, a, bx.x, bx.y, init);
        pq2_bmma_and_popc(d, a, bx.z, bx.w, d);
        acc[r][0][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * xs, acc[r][0][0]);
        acc[r][0][2] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * xs, acc[r][0][2]);
    }
}

// m == 2, "column planes": the MMA's 8 columns would carry copies of the two tokens, so column
// pair {2s, 2s+1} carries activation plane s of tokens 0 and 1 instead and the four plane MMAs
// chain into one accumulator without mixing: C column 2tq + j of lane tq ends as
// 4^tq * dot(plane tq of token j) (plus -sum(q) of token j in plane 0). No per-unit combine: the
// lane's float accumulators take their plane's terms, and reduce_store scales lane tq by 4^-tq
// and adds the four lanes once per row block.
template <int RS>
__device__ __forceinline__ void core_column_planes(const uint4 (&w)[RS], const uint32_t (&sc)[RS],
                                                   int g, const act_ptrs<1, 2> &A,
                                                   lane_consts<2> &lc, float (&acc)[RS][1][4])
{
    const uint2 *q = reinterpret_cast<const uint2 *>(
        A.q[0] + (unsigned)g * 128u);  // the lane's plane of group g
#pragma unroll
    for (int s = 0; s < 4; ++s)
        if (lc.own[s]) lc.b[s] = __ldg(q);
    // tokens 0 and 1: record pair 0 (-sum(q) kept in the plane-0 lanes only)
    const int4 rc = __ldg(A.rec + (unsigned)g * PQ2_TC_PAIRS);
    const int ns[2] = {rc.x & lc.c_neg, rc.y & lc.c_neg};
    const float xs[2] = {__int_as_float(rc.z), __int_as_float(rc.w)};
#pragma unroll
    for (int r = 0; r < RS; ++r) {
        const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
        uint32_t a[4][4];
        plane_fragments<false>(w[r], a);
        const int zero[4] = {0, 0, 0, 0};
        int d[4];
        mma_planes_chained(d, a, lc.b, zero);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[r][0][j] =
                fmaf((float)(d[j] + ns[j & 1]), (j < 2 ? wf.x : wf.y) * xs[j & 1], acc[r][0][j]);
    }
}

// 3 <= m <= 8, masked planes: the four plane fragments of A (code * 4^s) against the four
// activation planes of the lane's token, the token pair's constants from one 16-byte record.
// Unsigned group index: one wide multiply-add per address (a signed one costs a 64-bit shift and
// add per load).
template <int RS>
__device__ __forceinline__ void core_tokens8(const uint4 (&w)[RS], const uint32_t (&sc)[RS], int g,
                                             const act_ptrs<1, 2> &A, float (&acc)[RS][1][4])
{
    constexpr int NT = 1, NJ = 2;
    const unsigned ug = (unsigned)(g + A.g0);
    uint2 bq[NT][4];
    float xs[NT][NJ];
    int ns[NT][NJ];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int s = 0; s < 4; ++s)
            bq[nt][s] = __ldg(reinterpret_cast<const uint2 *>(A.q[nt] + ug * 128u + s * 32));
        // The lane's token pair from its record. The integers below are 64 (rt 1) or 4 (rt >= 2)
        // times dot(code - 1, q). (Staging these in shared memory as at m > 8 does not pay at
        // m <= 8: NOTES: m9-16-top-bit-planes-staged-constants.)
        const int4 rc = __ldg(A.rec + ug * PQ2_TC_PAIRS);
        const float f = RS == 1 ? 1.0f / 64.0f : 1.0f / 4.0f;
        xs[nt][0] = __int_as_float(rc.z) * f, xs[nt][1] = __int_as_float(rc.w) * f;
        ns[nt][0] = rc.x, ns[nt][1] = rc.y;
    }
#pragma unroll
    for (int r = 0; r < RS; ++r) {
        const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
        if constexpr (RS == 1) {
            // rt 1: four independent plane MMAs from zero, combined with three shift-adds per C
            // register and -64 * sum(q) added. (The two chains below leave one sub-tile per unit
            // too little independent work: slower on tiles rt 1, NOTES:
            // m3-8-two-chains-records-coarse-rows.)
            uint32_t a[4][4];
            plane_fragments<false>(w[r], a);
            const int zero[4] = {0, 0, 0, 0};
            int d0[4], d1[4], d2[4], d3[4];
            pq2_mma_u8s8(d0, a[0], bq[0][0].x, bq[0][0].y, zero);
            pq2_mma_u8s8(d1, a[1], bq[0][1].x, bq[0][1].y, zero);
            pq2_mma_u8s8(d2, a[2], bq[0][2].x, bq[0][2].y, zero);
            pq2_mma_u8s8(d3, a[3], bq[0][3].x, bq[0][3].y, zero);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int v = ((d0[j] * 4 + d1[j]) * 4 + d2[j]) * 4 + d3[j] + ns[0][j & 1] * 64;
                const float scale = (j < 2 ? wf.x : wf.y) * xs[0][j & 1];
                acc[r][0][j] = fmaf((float)v, scale, acc[r][0][j]);
            }
        } else {
            // rt >= 2: two chains of two MMAs. Planes 0 and 2 at weight 1 (the codes and the
            // codes >> 4, masked with 0x03 per byte: the >> 4 moves each byte's bits 4-5 to 0-1,
            // and what crosses in from the next byte is masked off), planes 1 and 3 at weight 4
            // (the same two words masked with 0x0C): d02 = dot0 + dot2 - sum(q) (started from
            // -sum(q)), d13 = 4 (dot1 + dot3), and 4 d02 + d13 = 4 dot(code - 1, q) with one
            // shift-add per C register instead of four: 8 fewer instructions per sub-tile. The same
            // float result as the rt 1 form (both integers exact, their scales exact powers of two
            // apart). At m > 8 this form needs a second set of C registers and spills.
            uint32_t a0[4], a1[4], a2[4], a3[4];
            const uint32_t wv[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint32_t hi = wv[i] >> 4;
                a0[i] = wv[i] & 0x03030303u, a1[i] = wv[i] & 0x0C0C0C0Cu;
                a2[i] = hi & 0x03030303u, a3[i] = hi & 0x0C0C0C0Cu;
            }
            const int init[4] = {ns[0][0], ns[0][NJ - 1], ns[0][0], ns[0][NJ - 1]};
            const int zero[4] = {0, 0, 0, 0};
            int d02[4], d13[4];
            pq2_mma_u8s8(d02, a0, bq[0][0].x, bq[0][0].y, init);
            pq2_mma_u8s8(d13, a1, bq[0][1].x, bq[0][1].y, zero);
            pq2_mma_u8s8(d02, a2, bq[0][2].x, bq[0][2].y, d02);
            pq2_mma_u8s8(d13, a3, bq[0][3].x, bq[0][3].y, d13);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float scale = (j < 2 ? wf.x : wf.y) * xs[0][j & 1];
                acc[r][0][j] = fmaf((float)(d02[j] * 4 + d13[j]), scale, acc[r][0][j]);
            }
        }
    }
}

// 9 <= m <= 16: two token blocks share each A fragment. The planes are moved to the top two bits
// of every byte (code * 64 for all four: one shift + one mask each), so one accumulator chains the
// four MMAs, started from -64 * sum(q), and holds 64 * dot(code - 1, q) directly: 12 shifts per
// sub-tile instead of 3 shift-adds on each of 8 live C registers. The token constants of the
// lane's two C columns come from shared memory (stage_token_consts): C starts -64 sum(q) and
// activation scales / 64.
template <int RS>
__device__ __forceinline__ void core_tokens16(const uint4 (&w)[RS], const uint32_t (&sc)[RS], int g,
                                              const act_ptrs<2, 2> &A, float (&acc)[RS][2][4])
{
    constexpr int NT = 2, NJ = 2, TOKS = 16;
    const unsigned ug = (unsigned)(g + A.g0);
    uint2 bq[NT][4];
    float xs[NT][NJ];
    int ns[NT][NJ];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        ld_planes8(A.q[nt] + ug * 128u, bq[nt]);
        lds_token_consts(A.tc + ((unsigned)g * (TOKS / 2) + nt * 4) * 16u, ns[nt], xs[nt]);
    }
#pragma unroll
    for (int r = 0; r < RS; ++r) {
        const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
        uint32_t a[4][4];
        plane_fragments<true>(w[r], a);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int init[4] = {ns[nt][0], ns[nt][1], ns[nt][0], ns[nt][1]};
            int d[4];
            mma_planes_chained(d, a, bq[nt], init);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float scale = (j < 2 ? wf.x : wf.y) * xs[nt][j & 1];
                acc[r][nt][j] = fmaf((float)d[j], scale, acc[r][nt][j]);
            }
        }
    }
}

// The core of token class TOKS (problem.cuh) for one unit.
template <int RS, int NT, int TOKS>
__device__ __forceinline__ void unit_mma(const uint4 (&w)[RS], const uint32_t (&sc)[RS], int g,
                                         const act_ptrs<NT, TOKS == 1 ? 1 : 2> &A,
                                         lane_consts<TOKS> &lc, float (&acc)[RS][NT][4])
{
    if constexpr (TOKS == 1)
        core_bit_slices<RS>(w, sc, g, A, lc, acc);
    else if constexpr (TOKS == 2)
        core_column_planes<RS>(w, sc, g, A, lc, acc);
    else if constexpr (TOKS == 8)
        core_tokens8<RS>(w, sc, g, A, acc);
    else
        core_tokens16<RS>(w, sc, g, A, acc);
}

// Accumulates units [0, n) of batch b (groups g0, g0+1, ...) into acc.
template <int RS, int U, int NT, int TOKS>
__device__ __forceinline__ void compute_batch(const batch<RS, U> &b, int g0, int n,
                                              const act_ptrs<NT, TOKS == 1 ? 1 : 2> &A,
                                              lane_consts<TOKS> &lc, float (&acc)[RS][NT][4])
{
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (u >= n) break;
        unit_mma<RS, NT, TOKS>(b.codes[u], b.scales[u], g0 + u, A, lc, acc);
    }
}
