// kernels.cuh - the row-block kernel templates (family overview: ARCHITECTURE.md). One block per
// row block of RS 16-row sub-tiles (or per split of one, or a persistent grid looping over them);
// its warps split the row block's 128-groups, load the codes straight into registers (stages 1-2)
// or through a per-warp shared-memory ring filled by bulk copies (stages >= 3, sm_90), and sum
// their partials in shared memory in warp order. The first weight loads are issued before the
// programmatic-dependent-launch wait, so weight streaming overlaps the kernel before.
//
// Template parameters of an instance (instances.inc lists the compiled ones):
//   LAYOUT  PQ2_LAYOUT_TILES or PQ2_LAYOUT_PLANES
//   RS      16-row sub-tiles per row block (config row_subtiles: 1, 2, 4)
//   U       units (128-groups) per register batch or ring slot (config unroll)
//   TOKS    token class (problem.cuh): 1, 2, 8, 16
//   STAGES  1 (load a batch, then compute it) or 2 (the next batch loads during the compute)
//   GRID    PQ2_GRID_ROWS, PQ2_GRID_PERSIST (config blocks > 0) or PQ2_GRID_SPLIT (config splits >
//   1) LR      TILES: the file's tile height rt (RS above it: coarse rows, below: fine rows)
#pragma once

#include "rowblock/cores.cuh"
#include "rowblock/reduce.cuh"

// This warp's share of each row block: groups [g_begin, g_begin + len).
struct warp_split {
    int g_begin, len;
};

__device__ __forceinline__ warp_split split_of(int G, int warp, int warps)
{
    warp_split w;
    w.g_begin = (int)((int64_t)warp * G / warps);
    w.len = (int)((int64_t)(warp + 1) * G / warps) - w.g_begin;
    return w;
}

// The grid of the register kernels (template GRID): one block per row block, a persistent grid
// (config blocks > 0) or `splits` blocks per row block (config splits > 1).
// (PQ2_GRID_RING names the bulk-copy ring kernel, which runs one block per row block.)
enum pq2_rowblock_grid {
    PQ2_GRID_ROWS = 0,
    PQ2_GRID_PERSIST = 1,
    PQ2_GRID_SPLIT = 2,
    PQ2_GRID_RING = 3
};

// stages 1 and 2: register batches. PQ2_GRID_ROWS: one row block per block (blockIdx.x).
// PQ2_GRID_PERSIST: row blocks blockIdx.x, + gridDim.x, ... (a grid smaller than the row blocks);
// the first batch of the next row block is loaded before this one's reduction, so the warp's
// loads do not pause there.
template <int LAYOUT, int RS, int U, int TOKS, int STAGES, int GRID, int LR>
__global__ void __launch_bounds__(512) rowblock_kernel(const pq2_rowblock_problem p)
{
    extern __shared__ __align__(16) float red[];  // [warp][r][nt][j][lane]
    constexpr int NT = TOKS > 8 ? 2 : 1;
    constexpr int NJ = TOKS == 1 ? 1 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int G = (int)(p.k >> 7);
    // PQ2_GRID_SPLIT: block x holds split x % splits of row block x / splits, groups
    // [split*G/splits, (split+1)*G/splits), shared among its warps.
    int rb = blockIdx.x, split = 0, g0 = 0, gs = G;
    if constexpr (GRID == PQ2_GRID_SPLIT) {
        rb = blockIdx.x / p.splits, split = blockIdx.x - rb * p.splits;
        g0 = (int)((int64_t)split * G / p.splits);
        gs = (int)((int64_t)(split + 1) * G / p.splits) - g0;
    }
    const warp_split ws = split_of(gs, warp, warps);
    const int g_begin = g0 + ws.g_begin, len = ws.len;
    using src_t = weight_source_t<LAYOUT, RS, U, LR>;
    src_t src(p, rb, g_begin, lane);

    // The first batch (stages 1) or two (stages 2) are in flight before the wait.
    batch<RS, U> b0, b1;
    if (len > 0) src.load(b0, 0, min(len, U));
    if (STAGES == 2 && len > U) src.load(b1, U, min(len - U, U));
    pq2_pdl_handoff();  // the quantiser's outputs are read only after this
    int4 *tc = nullptr;
    if constexpr (TOKS > 8) {
        tc = reinterpret_cast<int4 *>(red + warps * (RS * NT * 128)) + warp * p.tc_cap * (TOKS / 2);
        stage_token_consts<TOKS>(p, G, g_begin, len, lane, tc);
    }
    const act_ptrs<NT, NJ> A = act_setup<NT, NJ, TOKS>(p, G, g_begin, lane, tc);
    lane_consts<TOKS> lc(lane);

    for (;;) {
        float acc[RS][NT][4];
        zero_acc(acc);
        if constexpr (STAGES == 1 && LAYOUT == PQ2_LAYOUT_TILES && GRID != PQ2_GRID_SPLIT &&
                      (TOKS == 1 ? U > 1 : TOKS == 8 && U == 2 && GRID == PQ2_GRID_ROWS)) {
            // m == 1, batches of 2-4 units: running pointers (src's weights and the three
            // activation streams advance one batch per iteration; src is rebuilt for a persistent
            // grid's next row block), batch 0 already loaded, each later batch loaded right after
            // the previous compute: fewer instructions and registers. Not at U 1, where ptxas
            // then hoists the next unit's first load into this unit's compute and the kernel gets
            // slower (NOTES: m1-loads-at-iteration-top), nor for split grids (more registers).
            // m <= 8 (token class 8) takes it at U 2 on the rows grid only: persistent grids
            // gain registers with it and U 4 spills.
            act_ptrs<NT, NJ> a = A;
            for (int i = 0;;) {
                compute_batch<RS, U, NT, TOKS>(b0, 0, min(len - i, U), a, lc, acc);
                i += U;
                if (i >= len) break;
                src.advance(U), a.template advance<TOKS>(U);
                src.load(b0, 0, min(len - i, U));
            }
        } else if constexpr (STAGES == 1 && LAYOUT == PQ2_LAYOUT_TILES && TOKS == 1 && U == 1 &&
                             RS > 1 && GRID != PQ2_GRID_SPLIT) {
            // m == 1, one unit per batch: running pointers too (fewer instructions per unit, a
            // few more registers), but each unit's loads stay at the top of its own iteration:
            // the i > 0 test keeps ptxas from hoisting them into the previous unit's compute,
            // which is slower (NOTES: m1-loads-at-iteration-top). Advancing the weight pointers
            // after the compute as well saves instructions but was slower (NOTES:
            // rowblock-levers-rejected), and so was this loop at m == 2 (measured:
            // tools/bench/NOTES.md); not for rt 1 either (ptxas then spills).
            act_ptrs<NT, NJ> a = A;
            for (int i = 0; i < len; ++i) {
                if (i > 0) {
                    src.advance(1);
                    src.load(b0, 0, 1);
                }
                compute_batch<RS, U, NT, TOKS>(b0, 0, 1, a, lc, acc);
                a.template advance<TOKS>(1);
            }
        } else if constexpr (STAGES == 1) {
            for (int i = 0; i < len; i += U) {
                if (i > 0) src.load(b0, i, min(len - i, U));
                compute_batch<RS, U, NT, TOKS>(b0, i, min(len - i, U), A, lc, acc);
            }
        } else {
            // Ping-pong between two register sets (no copies): b0 holds units [i, i+U) and b1
            // [i+U, i+2U); each is refilled as soon as it has been computed.
            for (int i = 0; i < len; i += 2 * U) {
                compute_batch<RS, U, NT, TOKS>(b0, i, min(len - i, U), A, lc, acc);
                if (i + 2 * U < len) src.load(b0, i + 2 * U, min(len - i - 2 * U, U));
                if (i + U >= len) break;
                compute_batch<RS, U, NT, TOKS>(b1, i + U, min(len - i - U, U), A, lc, acc);
                if (i + 3 * U < len) src.load(b1, i + 3 * U, min(len - i - 3 * U, U));
            }
        }
        if constexpr (GRID != PQ2_GRID_PERSIST) {
            reduce_store<RS, NT, TOKS, GRID == PQ2_GRID_SPLIT>(p, red, rb, split, warp, warps, lane,
                                                               acc);
            return;
        } else {
            const int next = rb + (int)gridDim.x;
            const bool more = next < (int)pq2_rowblock_row_blocks(p.n, RS);
            if (more) {
                src = src_t(p, next, g_begin, lane);
                if (len > 0) src.load(b0, 0, min(len, U));
                if (STAGES == 2 && len > U) src.load(b1, U, min(len - U, U));
            }
            reduce_store<RS, NT, TOKS, false>(p, red, rb, 0, warp, warps, lane, acc);
            if (!more) return;
            __syncthreads();  // every thread has read `red` before the next row block writes it
            rb = next;
        }
    }
}

// Bytes of one ring slot: U units of RS sub-tiles, 512 code bytes + 32 scale bytes each.
template <int RS, int U> struct ring_slot {
    static constexpr int kCodes = U * RS * 512;
    static constexpr int kBytes = U * RS * 544;
};

// Slot i of a warp's sequence: units [i*U, min(len, i*U+U)) into ring slot i % stages.
template <int RS, int U>
__device__ __forceinline__ void issue_slot(uint8_t *ring, uint64_t *bars, int stages, int i,
                                           int len, const uint8_t *src_codes,
                                           const uint8_t *src_scales)
{
    using slot = ring_slot<RS, U>;
    const int n = min(U, len - i * U);
    const int s = i % stages;
    uint8_t *dst = ring + s * slot::kBytes;
    bulk_copy2(bars + s, dst, src_codes + (size_t)i * slot::kCodes, (uint32_t)n * (RS * 512),
               dst + slot::kCodes, src_scales + (size_t)i * (U * RS * 32), (uint32_t)n * (RS * 32));
}

// stages >= 3 (sm_90): per-warp shared-memory ring filled by bulk copies. Shared memory:
// [warp][slot] slots, then [warp][slot] mbarriers; the reduction reuses the slots at the end.
template <int RS, int U, int TOKS>
__global__ void __launch_bounds__(512, 1)
    rowblock_ring_kernel(const pq2_rowblock_problem p, int stages)
{
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int NT = TOKS > 8 ? 2 : 1;
    constexpr int NJ = TOKS == 1 ? 1 : 2;
    using slot = ring_slot<RS, U>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int G = (int)(p.k >> 7);
    const warp_split ws = split_of(G, warp, warps);
    const int len = ws.len, n_slots = (len + U - 1) / U;
    uint8_t *ring = smem + (size_t)warp * stages * slot::kBytes;
    uint64_t *bars =
        reinterpret_cast<uint64_t *>(smem + (size_t)warps * stages * slot::kBytes) + warp * stages;
    const size_t unit0 =
        (size_t)blockIdx.x * G + ws.g_begin;  // flat index of the warp's first unit
    const uint8_t *src_codes = p.codes + unit0 * (RS * 512);
    const uint8_t *src_scales = reinterpret_cast<const uint8_t *>(p.wscales) + unit0 * (RS * 32);

    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(bars + s);
        for (int i = 0; i < min(stages, n_slots); ++i)
            issue_slot<RS, U>(ring, bars, stages, i, len, src_codes, src_scales);
    }
    __syncwarp();
    pq2_pdl_handoff();  // the quantiser's outputs are read only after this
    int4 *tc = nullptr;
    if constexpr (TOKS > 8) {
        // after the ring and its barriers (16-byte aligned)
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
    for (int i = 0; i < n_slots; ++i) {
        const int s = i % stages;
        mbar_wait(bars + s, (uint32_t)(i / stages) & 1u);
        const uint8_t *st = ring + s * slot::kBytes;
        const int n = min(U, len - i * U);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (u >= n) break;
            uint4 w[RS];
            uint32_t sc[RS];
#pragma unroll
            for (int r = 0; r < RS; ++r) {
                w[r] = *reinterpret_cast<const uint4 *>(st + (u * RS + r) * 512 + lane * 16);
                sc[r] = *reinterpret_cast<const uint32_t *>(st + slot::kCodes + (u * RS + r) * 32 +
                                                            gid * 4);
            }
            unit_mma<RS, NT, TOKS>(w, sc, i * U + u, A, lc, acc);
        }
        // Refill the slot just read: every lane's reads of it are done (and ordered before the
        // bulk copy's writes) before lane 0 issues it.
        fence_proxy_async();
        __syncwarp();
        if (lane == 0 && i + stages < n_slots)
            issue_slot<RS, U>(ring, bars, stages, i + stages, len, src_codes, src_scales);
    }
    __syncthreads();  // every warp is done with its ring: reuse it for the reduction
    reduce_store<RS, NT, TOKS, false>(p, reinterpret_cast<float *>(smem), blockIdx.x, 0, warp,
                                      warps, lane, acc);
}
