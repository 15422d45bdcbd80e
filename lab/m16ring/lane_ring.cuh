// LAB (issue 35, batch 16): the row-block ring kernel with the copies made by every lane
// (cp.async, no mbarriers, no lane-0 issue): each lane copies its own 16 code bytes of every
// sub-tile of a slot (the bytes it reads back) and lanes 0-7 the slot's 8 scale words per
// sub-tile; a slot is waited for with cp.async.wait_group and a __syncwarp (the scale words
// cross lanes). Same slot layout, shared-memory size, warp split, core and reduction as
// rowblock_ring_kernel, so the same bits. lab/m16ring/build.sh (LANE=1) swaps it in for the ring.
#pragma once

#include "rowblock/kernels.cuh"

// Units [i*U, min(len, i*U+U)) of the warp's sequence into ring slot `slot_at`, this lane's
// part of it.
template <int RS, int U>
__device__ __forceinline__ void lane_fill(uint8_t *slot_at, int i, int len,
                                          const uint8_t *src_codes, const uint8_t *src_scales,
                                          int lane)
{
    using slot = ring_slot<RS, U>;
    const int n = min(U, len - i * U);
    const uint8_t *c = src_codes + (size_t)i * slot::kCodes;
    const uint8_t *s = src_scales + (size_t)i * (U * RS * 32);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RS; ++r) {
            if (u >= n) continue;
            const int e = u * RS + r;
            cp_async16(slot_at + e * 512 + lane * 16, c + e * 512 + lane * 16, true);
            if (lane < 8)
                cp_async4(slot_at + slot::kCodes + e * 32 + lane * 4, s + e * 32 + lane * 4, true);
        }
}

// The kernel's body at ring depth S (a compile-time constant: cp.async.wait_group takes an
// immediate, and the slots step without a modulo).
template <int RS, int U, int TOKS, int S>
__device__ __forceinline__ void lane_ring_body(const pq2_rowblock_problem &p, uint8_t *smem,
                                               int stages)
{
    constexpr int NT = TOKS > 8 ? 2 : 1;
    constexpr int NJ = TOKS == 1 ? 1 : 2;
    using slot = ring_slot<RS, U>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int G = (int)(p.k >> 7);
    const warp_split ws = split_of(G, warp, warps);
    const int len = ws.len, n_slots = (len + U - 1) / U;
    uint8_t *ring = smem + (size_t)warp * stages * slot::kBytes;  // S <= stages slots used
    const size_t unit0 = (size_t)blockIdx.x * G + ws.g_begin;
    const uint8_t *src_codes = p.codes + unit0 * (RS * 512);
    const uint8_t *src_scales = reinterpret_cast<const uint8_t *>(p.wscales) + unit0 * (RS * 32);

    // S - 1 slots in flight before the wait (one copy group each, empty past the end)
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        if (i < n_slots)
            lane_fill<RS, U>(ring + i * slot::kBytes, i, len, src_codes, src_scales, lane);
        cp_async_commit();
    }
    pq2_pdl_handoff();  // the quantiser's outputs are read only after this
    int4 *tc = nullptr;
    if constexpr (TOKS > 8) {
        // where rowblock_ring_kernel puts them (its barriers' room stays unused)
        const size_t at =
            ((size_t)warps * stages * (slot::kBytes + sizeof(uint64_t)) + 15) & ~(size_t)15;
        tc = reinterpret_cast<int4 *>(smem + at) + warp * p.tc_cap * (TOKS / 2);
        stage_token_consts<TOKS>(p, G, ws.g_begin, len, lane, tc);
    }
    const act_ptrs<NT, NJ> A = act_setup<NT, NJ, TOKS>(p, G, ws.g_begin, lane, tc);
    lane_consts<TOKS> lc(lane);
    float acc[RS][NT][4];
    zero_acc(acc);

    const int gid = lane >> 2;
    uint8_t *rd = ring, *wr = ring + (S - 1) * slot::kBytes;  // slots i % S and (i + S - 1) % S
    uint8_t *const end = ring + S * slot::kBytes;
    for (int i = 0; i < n_slots; ++i) {
        // the slot refilled now was read in iteration i - 1: every lane's reads of it are done
        // (their values were consumed there) before lanes 0-7 overwrite its scale words
        __syncwarp();
        if (i + S - 1 < n_slots)
            lane_fill<RS, U>(wr, i + S - 1, len, src_codes, src_scales, lane);
        cp_async_commit();
        cp_async_wait<S - 1>();
        __syncwarp();  // lanes 0-7's scale words of slot i, visible to the warp
        const int n = min(U, len - i * U);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (u >= n) break;
            uint4 w[RS];
            uint32_t sc[RS];
#pragma unroll
            for (int r = 0; r < RS; ++r) {
                w[r] = *reinterpret_cast<const uint4 *>(rd + (u * RS + r) * 512 + lane * 16);
                sc[r] = *reinterpret_cast<const uint32_t *>(rd + slot::kCodes +
                                                            (u * RS + r) * 32 + gid * 4);
            }
            unit_mma<RS, NT, TOKS>(w, sc, i * U + u, A, lc, acc);
        }
        rd += slot::kBytes, wr += slot::kBytes;
        if (rd == end) rd = ring;
        if (wr == end) wr = ring;
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with its ring: reuse it for the reduction
    reduce_store<RS, NT, TOKS, false>(p, reinterpret_cast<float *>(smem), blockIdx.x, 0, warp,
                                      warps, lane, acc);
}

// The launcher's ring signature; depths 3-6 compiled (deeper rings take 6 of their slots).
template <int RS, int U, int TOKS>
__global__ void __maxnreg__(96) rowblock_lane_ring_kernel(const pq2_rowblock_problem p, int stages)
{
    extern __shared__ __align__(128) uint8_t smem[];
    switch (stages) {
    case 3: lane_ring_body<RS, U, TOKS, 3>(p, smem, stages); break;
    case 4: lane_ring_body<RS, U, TOKS, 4>(p, smem, stages); break;
    case 5: lane_ring_body<RS, U, TOKS, 5>(p, smem, stages); break;
    default: lane_ring_body<RS, U, TOKS, 6>(p, smem, stages); break;
    }
}
