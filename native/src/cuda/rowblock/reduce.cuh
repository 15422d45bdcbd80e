// reduce.cuh - the end of a row block: the warps' accumulators summed in warp order through
// shared memory and stored, or, for a row block split over several blocks, written as partial sums
// that the last block to arrive adds in split order. Both orders are fixed, so the result bits
// never depend on timing.
#pragma once

#include "device/arrival.cuh"
#include "device/dtypes.cuh"
#include "rowblock/problem.cuh"

// The last contributor to a split row block rb (rows of tr = 16*rt): adds the partial sums of its
// `count` contributors in contributor order (deterministic whoever arrives last) and stores
// them. slot(i) points at contributor i's partials, [m][tr] fp32, written by other blocks (read
// with __ldcg, past L1). Thread t of nthreads takes outputs t, t + nthreads, ...
template <class SLOT>
__device__ __forceinline__ void pq2_store_partial_sums(const pq2_rowblock_problem &p, int64_t rb,
                                                       int tr, int count, SLOT slot, int t,
                                                       int nthreads)
{
    for (int e = t; e < p.m * tr; e += nthreads) {
        const int tok = e / tr, row = e % tr;
        const int64_t n_row = rb * tr + row;
        float v = 0.0f;
        for (int i = 0; i < count; ++i) v += __ldcg(slot(i) + e);
        if (n_row < p.n) pq2_store_from_f32(p.y, (size_t)tok * p.n + n_row, p.y_dtype, v);
    }
}

// Sums the warps' accumulators in warp order (deterministic) through `red` (shared memory,
// warps * RS * NT * 128 floats, free for this use) and stores the row block's outputs (acc is
// used up: at m <= 2 the lanes combine in it first). SPLIT:
// the block holds split `split` of p.splits of row block rb's groups: it writes its sums to
// p.partial and the last of the row block's blocks to arrive adds the splits' partials in split
// order (deterministic whichever block is last) and stores them.
template <int RS, int NT, int TOKS, bool SPLIT>
__device__ __forceinline__ void reduce_store(const pq2_rowblock_problem &p, float *red, int rb,
                                             int split, int warp, int warps, int lane,
                                             float (&acc)[RS][NT][4])
{
    if constexpr (TOKS <= 2) {
        // m <= 2 (cores.cuh): lane tq holds 4^-tq (bit slices) or 4^tq (column planes) times its
        // share of rows gid, gid+8 (tokens 0, 1); scaled back exactly (a power of two) and summed
        // over the four lanes in a fixed order, (tq 0 + tq 1) + (tq 2 + tq 3), which lane tq == 0
        // keeps.
        const int e = (TOKS == 1 ? 1 : -1) * ((lane & 3) << 24);
        const float back = __int_as_float(0x3f800000 + e);  // 4^tq or 4^-tq, exact
#pragma unroll
        for (int r = 0; r < RS; ++r)
#pragma unroll
            for (int j = 0; j < 4; j += TOKS == 1 ? 2 : 1) {
                float v = acc[r][0][j] * back;
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                acc[r][0][j] = v;
            }
    }
#pragma unroll
    for (int r = 0; r < RS; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (TOKS == 1 && (j & 1)) continue;
                red[(((warp * RS + r) * NT + nt) * 4 + j) * 32 + lane] = acc[r][nt][j];
            }
    __syncthreads();
    constexpr int TR = 16 * RS;
    const int outputs = TR * p.m;
    float *part =
        SPLIT ? p.partial + (size_t)rb * p.splits * outputs : nullptr;  // [split][tok][row]
    for (int e = threadIdx.x; e < outputs; e += blockDim.x) {
        const int tok = e / TR, row = e - tok * TR;
        const int64_t n_row = (int64_t)rb * TR + row;
        if (n_row >= p.n) continue;
        // Where C element (row, tok) lives: sub-tile r, lane (gid, tq), register j.
        const int r = row >> 4, rr = row & 15, nt = tok >> 3, c = tok & 7;
        const int src =
            ((r * NT + nt) * 4 + (rr >> 3) * 2 + (c & 1)) * 32 + (rr & 7) * 4 + (c >> 1);
        float v = 0.0f;
        for (int w = 0; w < warps; ++w) v += red[w * (RS * NT * 128) + src];
        if constexpr (SPLIT)
            part[(size_t)split * outputs + e] = v;
        else
            pq2_store_from_f32(p.y, (size_t)tok * p.n + n_row, p.y_dtype, v);
    }
    if constexpr (!SPLIT) return;
    if (!pq2_last_to_arrive(p.counters + rb, p.splits)) return;
    pq2_store_partial_sums(
        p, rb, TR, p.splits, [&](int i) { return part + (size_t)i * outputs; }, threadIdx.x,
        blockDim.x);
    if (threadIdx.x == 0)
        p.counters[rb] = 0;  // ready for the next call (the quantiser also clears it)
}

template <int RS, int NT> __device__ __forceinline__ void zero_acc(float (&acc)[RS][NT][4])
{
#pragma unroll
    for (int r = 0; r < RS; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][nt][j] = 0.0f;
}
