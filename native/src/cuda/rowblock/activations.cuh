// activations.cuh - how a lane of a row-block kernel finds its activation operands: the
// pointers per token class (bit slices at m == 1, token-constant records at 2 <= m <= 8, token
// constants staged in shared memory at m > 8) and the per-lane constants of the m <= 2 cores.
#pragma once

#include "device/codes.cuh"
#include "device/ptx.cuh"
#include "rowblock/problem.cuh"

// Per-lane activation addressing: B fragments of token min(nt*8+gid, m-1) and the scales and
// sums of the tokens of this lane's C columns, min(nt*8+2tq+j, m-1): at m == 1 from the
// quantiser's arrays, at 2 <= m <= 8 from the token-constant records, at m > 8 from shared memory.
template <int NT, int NJ> struct act_ptrs {
    const int8_t *q[NT];  // + tq*8
    const float *xs;      // m == 1: the token's scales and sums, [g]
    const int32_t *sums;
    const int4 *rec;  // 2 <= m <= 8: token records (device/codes.cuh), [g][pair] + the lane's pair
    const uint4 *xb;  // bit slices (m == 1): the token's, + gid*4 + tq
    uint32_t tc;  // m > 8: shared address of the warp's token constants (stage_token_consts), + tq
    int g0;       // group of unit index 0 relative to the pointers (act_setup)
    // Running pointers: group 0 becomes group `units` (TOKS: the token class, act_setup).
    template <int TOKS> __device__ __forceinline__ void advance(int units)
    {
        if constexpr (TOKS == 1) {
            xb += units * (PQ2_BITS_GROUP_WORDS / 4), xs += units, sums += units;
        } else if constexpr (TOKS <= 8) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) q[nt] += units * 128;
            rec += units * PQ2_TC_PAIRS;
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) q[nt] += units * 128;
            tc += units * (TOKS / 2) * 16;
        }
    }
};

// Per-lane constants of the m <= 2 paths (cores.cuh); nothing for m > 2.
template <int TOKS> struct lane_consts {
    __device__ explicit lane_consts(int) {}
};

// m == 1, bit slices. Lane tq's C columns 2tq, 2tq+1 hold bit planes 2tq and 2tq+1, worth
// 4^tq * (1, 2), and for tq == 3 4^3 * (1, -2) (bit 7 of a two's complement byte weighs -128):
// f2 is the second column's factor. c_neg is -1 in the lanes holding bit plane 0 (tq == 0),
// which add -sum(q) once per unit and row, else 0.
template <> struct lane_consts<1> {
    int c_neg, f2;
    __device__ explicit lane_consts(int lane)
        : c_neg((lane & 3) == 0 ? -1 : 0), f2((lane & 3) == 3 ? -2 : 2)
    {
    }
};

// m == 2, column planes: the B operands a lane keeps in registers from unit to unit. Lane
// (gid, tq) supplies B column gid, which carries activation plane gid >> 1 of token gid & 1:
// b[s] holds the lane's 8 bytes of that plane where s == gid >> 1 (own[s]; only that load
// executes) and stays 0 in the other lanes, never written. c_neg is -1 in the lanes whose C
// columns 2tq, 2tq+1 hold plane 0 (tq == 0), which add -sum(q) once per unit, row and token.
template <> struct lane_consts<2> {
    uint2 b[4];
    bool own[4];
    int c_neg;
    __device__ explicit lane_consts(int lane) : c_neg((lane & 3) == 0 ? -1 : 0)
    {
#pragma unroll
        for (int s = 0; s < 4; ++s) b[s] = make_uint2(0u, 0u), own[s] = (lane >> 3) == s;
    }
};

// The activation pointers of a lane for the warp's groups from g_begin; units index them from 0.
// TOKS 1 (bit slices): the token's bit planes, B column gid carries bit plane gid. TOKS 2
// (column planes): B column gid carries plane gid >> 1 of token gid & 1, C columns 2tq + j
// token j. Otherwise B column gid carries token gid, C columns 2tq + j token 2tq + j (nt * 8 more
// in token block nt); tokens past m - 1 repeat m - 1.
template <int NT, int NJ, int TOKS>
__device__ __forceinline__ act_ptrs<NT, NJ> act_setup(const pq2_rowblock_problem &p, int G,
                                                      int g_begin, int lane, const int4 *tc)
{
    constexpr bool CP = TOKS == 2;
    const int gid = lane >> 2, tq = lane & 3;
    act_ptrs<NT, NJ> A;
    // m <= 2: the pointers start at g_begin (unsigned unit indices: one multiply-add per
    // address). Otherwise at group 0, and units add g0 = g_begin (starting those at g_begin
    // makes ptxas spill or take more registers in several m > 2 instances).
    A.g0 = TOKS <= 2 ? 0 : g_begin;
    if (TOKS > 2) g_begin = 0;
    if constexpr (TOKS == 1)
        A.xb = reinterpret_cast<const uint4 *>(p.xbits + (size_t)g_begin * PQ2_BITS_GROUP_WORDS) +
               gid * 4 + tq;
    if constexpr (TOKS > 8) A.tc = smem_u32(tc) + tq * 16;
    if constexpr (TOKS >= 2 && TOKS <= 8)
        A.rec = p.records + (size_t)g_begin * PQ2_TC_PAIRS + (CP ? 0 : tq);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int b_tok = CP ? min(gid & 1, p.m - 1) : min(nt * 8 + gid, p.m - 1);
        if constexpr (TOKS != 1)
            A.q[nt] = p.q8 + (size_t)b_tok * p.k + (size_t)g_begin * 128 +
                      (CP ? (gid >> 1) * 32 : 0) + tq * 8;
        if constexpr (TOKS ==
                      1) {  // m == 1 (m > 1 reads the token-constant records or shared memory)
            // (written min(0, m - 1), not 0: the m == 1 instances' SASS depends on the form)
            const int tok = min(0, p.m - 1);
            A.xs = p.xs + (size_t)tok * G + g_begin;
            A.sums = p.sums + (size_t)tok * G + g_begin;
        }
    }
    return A;
}

// m > 8: the token constants of a warp's units, staged once per block in shared memory after the
// programmatic-dependent-launch wait (the quantiser's scales and sums, [m][k/128], are read only
// here): for unit u of the warp's range (group g_begin + u) and token pair pr (tokens 2pr and
// 2pr + 1 of the warp's C columns, each min(t, m - 1)), one 16-byte record {-64 sum(q),
// -64 sum(q'), xs / 64, xs' / 64} (the C starts as int bits), in the units of core_tokens16's
// integers (64 dot(code - 1, q)): the same exact products as the global loads gave (powers of
// two). Lane tq of token block nt then reads record nt * 4 + tq of its unit with one 16-byte
// shared load instead of four global loads and their 64-bit address arithmetic (fewer
// instructions and registers: NOTES: m9-16-top-bit-planes-staged-constants). Shared memory:
// tc_cap units per warp (rowblock/launch.cu), after the reduction buffer (or the ring).
template <int TOKS>
__device__ __forceinline__ void stage_token_consts(const pq2_rowblock_problem &p, int G,
                                                   int g_begin, int len, int lane, int4 *dst)
{
    constexpr int PAIRS = TOKS / 2;
    const float f = 1.0f / 64.0f;
    const int c = 64;
    for (int e = lane; e < len * PAIRS; e += 32) {
        const int u = e / PAIRS, pr = e - u * PAIRS;
        // (32-bit indices: m <= 16, and the shared-memory check keeps k / 128 below
        // kMaxSplits * 227 KB / 128 B, so m * k / 128 < 2^19)
        const unsigned g = (unsigned)(g_begin + u);
        const unsigned t0 = (unsigned)min(2 * pr, p.m - 1) * G + g,
                       t1 = (unsigned)min(2 * pr + 1, p.m - 1) * G + g;
        dst[e] =
            make_int4(-__ldg(p.sums + t0) * c, -__ldg(p.sums + t1) * c,
                      __float_as_int(__ldg(p.xs + t0) * f), __float_as_int(__ldg(p.xs + t1) * f));
    }
    __syncwarp();
}
