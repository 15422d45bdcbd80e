// decode_rowblock.cu - the row-block decode family (M = 1..16): one block per row
// block of 16*RT rows, its warps splitting the row block's 128-groups, codes loaded straight
// into registers, partial sums reduced in shared memory in warp order.
//
// Why a second family (bench/NOTES.md, v7): the stream-K family (decode.cu) spends ~104
// warp-instructions per 512-byte sub-tile (cp.async ring, split-row protocol, 64-bit address
// math) with 8-24 warps per SM; at the H200's 18 bytes per SM clock the SM can issue ~60-100.
// Here a sub-tile costs one 16-byte load, 16 mask ops, 4 MMAs and the C-register arithmetic
// (~40 at M = 1), and occupancy, not a ring, hides the memory latency.
//
// Arithmetic: masked-plane MMAs as decode.cu. m > 1: the B fragment of lane (gid, tq) carries
// token min(gid, m-1): with m < 8 the surplus columns repeat the last token instead of being
// predicated off, so the hot loop has no token tests; C columns >= m are never stored; the four
// plane results are combined per unit (m <= 8: two chains of two at rt >= 2, four separate at
// rt 1) or chained from planes moved to the top bits (m > 8). m == 1: "bit slices" (unit_mma, lane_consts<1>): binary AND-POPC MMAs on the code
// bytes as loaded (no masks) against the token's eight activation bit planes (one per B column,
// two MMAs per sub-tile), the bit planes combined once per row block (reduce_store). m == 2:
// "column planes" (lane_consts<2>): the eight columns carry the four activation planes of the
// two tokens instead of copies of them, the plane MMAs chain into one accumulator without mixing,
// and the planes are combined once per row block.
//
// Work split: warp w of the block takes groups [w*G/W, (w+1)*G/W) of its row block,
// contiguous in the tile-major stream, in batches of U units (the last one shorter). How the
// weight bytes reach the warp is the `stages` of the configuration:
//   1  register batches: load a batch (16-byte loads), then compute it;
//   2  two register batches: the next batch loads while this one computes (both are issued
//      before the programmatic-dependent-launch wait);
//   3+ (sm_90) a per-warp shared-memory ring of `stages` slots of U units, each filled by two bulk
//      copies (cp.async.bulk: one instruction per slot, completion on an mbarrier), so up to
//      stages*U*RT*544 bytes per warp are in flight whatever the register budget.
// The first loads are issued before the programmatic-dependent-launch wait, so weight
// streaming overlaps the quantiser.
//
// Grids of the register kernels (template GRID, from the configuration): one block per row block
// (blocks 0, splits 0-1); a persistent grid of at most blocks * SMs blocks looping over the row
// blocks (tiles, blocks > 0); or `splits` blocks per row block, each taking a contiguous share of
// its groups, the last to arrive adding the partial sums in split order (deterministic).
#include "decode.cuh"

#include <type_traits>

namespace {

constexpr int kMaxBlocksPerSm = 32;  // a multiprocessor holds at most 32 blocks
constexpr int kMaxSplits = 16;       // blocks per row block (config splits)
constexpr int kStaticSmem = 16;      // static shared memory of a register kernel, at most (reduce_store)

// 16 bytes read once: no L1 allocation.
__device__ __forceinline__ uint4 ld_stream16(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_stream8(const uint8_t *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ld_stream4(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// ---- sm_90 bulk copies and mbarriers (the shared-memory ring) ---------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Arms the barrier for `bytes` of bulk copies and copies [src, src+bytes0) and [src1, ...).
__device__ __forceinline__ void bulk_copy2(uint64_t *bar, void *dst0, const void *src0, uint32_t bytes0,
                                           void *dst1, const void *src1, uint32_t bytes1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t b = smem_u32(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes0 + bytes1) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst0)), "l"(src0), "r"(bytes0), "r"(b) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst1)), "l"(src1), "r"(bytes1), "r"(b) : "memory");
#else
    (void)bar, (void)dst0, (void)src0, (void)bytes0, (void)dst1, (void)src1, (void)bytes1;
#endif
}

// Waits until the barrier's phase `parity` has completed (its bytes have landed).
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
#else
    (void)bar, (void)parity;
#endif
}

// Orders this thread's earlier shared-memory reads before later bulk copies into the same bytes.
__device__ __forceinline__ void fence_proxy_async()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// The weight bytes of up to U units for one lane: per sub-tile its 16 code bytes as the four
// words of its A fragment, (row gid, row gid+8) x (code bytes tq*8..+3, tq*8+4..+7) (the TILES
// order, pq2.h), and the scale word of rows gid (low half) and gid+8 (high half).
template <int RT, int U>
struct batch {
    uint4 codes[U][RT];
    uint32_t scales[U][RT];
};

// Calls load(u, r) for sub-tile r of units u in [0, n) of a batch of U (every weight source's loop).
template <int RT, int U, class F>
__device__ __forceinline__ void for_each_load(int n, F load)
{
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RT; ++r)
            if (u < n) load(u, r);
}

// Loads units [0, n) of a batch starting at unit pointer `codes` (already + lane*16) and scale
// word pointer `scales` (already + gid). Units are RT*512 code bytes and RT*8 scale words apart.
template <int RT, int U>
__device__ __forceinline__ void load_batch(batch<RT, U> &b, const uint8_t *codes, const uint32_t *scales, int n)
{
    for_each_load<RT, U>(n, [&](int u, int r) {
        b.codes[u][r] = ld_stream16(codes + (u * RT + r) * 512);
        b.scales[u][r] = ld_stream4(scales + (u * RT + r) * 8);
    });
}

// Where a lane's weight bytes come from. TILES: the units are one contiguous stream (unit u at
// u*RT*512 code bytes, u*RT*8 scale words). PLANES: per sub-tile the lane's two rows of the code
// plane (8 bytes of each per group) and of the fp16 scale plane; rows past n re-read row n-1
// (their results are never stored).
template <int LAYOUT, int RT, int U>
struct weight_src;

template <int RT, int U>
struct weight_src<PQ2_LAYOUT_TILES, RT, U> {
    const uint8_t *codes;     // + lane*16
    const uint32_t *scales;   // + gid
    // Row block rb, the warp's groups from g_begin: flat unit rb*G + g_begin.
    __device__ weight_src(const pq2_decode_problem &p, int rb, int g_begin, int lane)
        : codes(p.codes + ((size_t)rb * (size_t)(p.k >> 7) + g_begin) * (RT * 512) + lane * 16),
          scales(reinterpret_cast<const uint32_t *>(p.wscales) + ((size_t)rb * (size_t)(p.k >> 7) + g_begin) * (RT * 8) +
                 (lane >> 2))
    {
    }
    // Units [i, i+n) of the warp's range into b.
    __device__ __forceinline__ void load(batch<RT, U> &b, int i, int n) const
    {
        load_batch<RT, U>(b, codes + (size_t)i * (RT * 512), scales + i * (RT * 8), n);
    }
    // Running pointers: unit 0 becomes unit `units`.
    __device__ __forceinline__ void advance(int units) { codes += units * (RT * 512), scales += units * (RT * 8); }
};

// Coarse rows (config rt above a tiles file's: NOTES v15g): row block rb of RT sub-tiles takes
// tile rows rb*H .. rb*H + H - 1 (H = RT / LR) of an LR tile-major file, sub-tile r from tile row
// r / LR: each activation fragment then serves RT sub-tiles instead of LR. Tile rows past the
// file's last re-read the last one (their rows are past n and never stored).
template <int RT, int U, int LR>
struct coarse_src {
    static_assert(RT % LR == 0 && RT > LR, "a coarse row block takes whole tile rows");
    static constexpr int H = RT / LR;
    const uint8_t *codes[H];    // + lane*16
    const uint32_t *scales[H];  // + gid
    __device__ coarse_src(const pq2_decode_problem &p, int rb, int g_begin, int lane)
    {
        const int64_t G = p.k >> 7, tile_rows = pq2_decode_row_blocks(p.n, LR);
#pragma unroll
        for (int h = 0; h < H; ++h) {
            const size_t unit = (size_t)min((int64_t)rb * H + h, tile_rows - 1) * (size_t)G + g_begin;
            codes[h] = p.codes + unit * (LR * 512) + lane * 16;
            scales[h] = reinterpret_cast<const uint32_t *>(p.wscales) + unit * (LR * 8) + (lane >> 2);
        }
    }
    __device__ __forceinline__ void load(batch<RT, U> &b, int i, int n) const
    {
        for_each_load<RT, U>(n, [&](int u, int r) {
            b.codes[u][r] = ld_stream16(codes[r / LR] + (size_t)(i + u) * (LR * 512) + (r % LR) * 512);
            b.scales[u][r] = ld_stream4(scales[r / LR] + (i + u) * (LR * 8) + (r % LR) * 8);
        });
    }
    __device__ __forceinline__ void advance(int units)
    {
#pragma unroll
        for (int h = 0; h < H; ++h) codes[h] += units * (LR * 512), scales[h] += units * (LR * 8);
    }
};

template <int RT, int U>
struct weight_src<PQ2_LAYOUT_PLANES, RT, U> {
    const uint8_t *codes[RT][2];    // rows gid, gid+8 of sub-tile r, + g_begin*32 + tq*8
    const uint16_t *scales[RT][2];  // the same rows, + g_begin
    __device__ weight_src(const pq2_decode_problem &p, int rb, int g_begin, int lane)
    {
        const int G = (int)(p.k >> 7);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t row = min((int64_t)rb * (16 * RT) + r * 16 + (lane >> 2) + h * 8, p.n - 1);
                codes[r][h] = p.codes + row * (p.k >> 2) + g_begin * 32 + (lane & 3) * 8;
                scales[r][h] = p.wscales + row * G + g_begin;
            }
    }
    __device__ __forceinline__ void load(batch<RT, U> &b, int i, int n) const
    {
        for_each_load<RT, U>(n, [&](int u, int r) {
            const uint2 lo = ld_stream8(codes[r][0] + (unsigned)(i + u) * 32u);
            const uint2 hi = ld_stream8(codes[r][1] + (unsigned)(i + u) * 32u);
            b.codes[u][r] = make_uint4(lo.x, hi.x, lo.y, hi.y);  // fragment order
            // Scales are 2 bytes per row and group: L1-cached, the next groups' share the sector.
            b.scales[u][r] = (uint32_t)__ldg(scales[r][0] + (unsigned)(i + u)) | ((uint32_t)__ldg(scales[r][1] + (unsigned)(i + u)) << 16);
        });
    }
};

// Per-lane activation addressing: B fragments of token min(nt*8+gid, m-1) and the scales and
// sums of the tokens of this lane's C columns, min(nt*8+2tq+j, m-1): at m == 1 from the
// quantiser's arrays, at 2 <= m <= 8 from the token-constant records, at m > 8 from shared memory.
template <int NT, int NJ>
struct act_ptrs {
    const int8_t *q[NT];       // + tq*8
    const float *xs;           // m == 1: the token's scales and sums, [g]
    const int32_t *sums;
    const int4 *rec;           // 2 <= m <= 8: the token-constant records (common.cuh), [g][pair] + the lane's pair
    const uint4 *xb;           // bit slices (m == 1): the token's, + gid*4 + tq
    uint32_t tc;               // m > 8: shared address of the warp's token constants (stage_token_consts), + tq
    int g0;  // group of unit index 0 relative to the pointers (act_setup)
    // Running pointers: group 0 becomes group `units` (TOKS: the token class, act_setup).
    template <int TOKS>
    __device__ __forceinline__ void advance(int units)
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

// Token classes of the row-block kernels (template TOKS): 1 (m == 1), 2 (m == 2), 8 (m <= 8) and
// 16 (m <= 16). m == 1 uses bit slices, m == 2 column planes (unit_mma).

// Per-lane constants of the m <= 2 paths (unit_mma); nothing for m > 2.
template <int TOKS>
struct lane_consts {
    __device__ explicit lane_consts(int) {}
};

// m == 1, bit slices. Lane tq's C columns 2tq, 2tq+1 hold bit planes 2tq and 2tq+1, worth
// 4^tq * (1, 2), and for tq == 3 4^3 * (1, -2) (bit 7 of a two's complement byte weighs -128):
// f2 is the second column's factor. c_neg is -1 in the lanes holding bit plane 0 (tq == 0),
// which add -sum(q) once per unit and row, else 0.
template <>
struct lane_consts<1> {
    int c_neg, f2;
    __device__ explicit lane_consts(int lane) : c_neg((lane & 3) == 0 ? -1 : 0), f2((lane & 3) == 3 ? -2 : 2) {}
};

// m == 2, column planes: the B operands a lane keeps in registers from unit to unit. Lane
// (gid, tq) supplies B column gid, which carries activation plane gid >> 1 of token gid & 1:
// b[s] holds the lane's 8 bytes of that plane where s == gid >> 1 (own[s]; only that load
// executes) and stays 0 in the other lanes, never written. c_neg is -1 in the lanes whose C
// columns 2tq, 2tq+1 hold plane 0 (tq == 0), which add -sum(q) once per unit, row and token.
template <>
struct lane_consts<2> {
    uint2 b[4];
    bool own[4];
    int c_neg;
    __device__ explicit lane_consts(int lane) : c_neg((lane & 3) == 0 ? -1 : 0)
    {
#pragma unroll
        for (int s = 0; s < 4; ++s) b[s] = make_uint2(0u, 0u), own[s] = (lane >> 3) == s;
    }
};

// The A fragments of the four planes of a lane's 16 code bytes of one sub-tile (fragment order,
// see batch): a[s] holds {row gid, row gid+8} x {code bytes tq*8..+3, tq*8+4..+7} of plane s,
// masked in place (pq2_plane: code * 4^s) or moved to the top two bits of each byte (TOP,
// pq2_plane_top: code * 64).
template <bool TOP, int S>
__device__ __forceinline__ uint32_t plane_of(uint32_t v)
{
    if constexpr (TOP)
        return pq2_plane_top<S>(v);
    else
        return pq2_plane<S>(v);
}

template <bool TOP>
__device__ __forceinline__ void plane_fragments(const uint4 &w, uint32_t (&a)[4][4])
{
    a[0][0] = plane_of<TOP, 0>(w.x), a[0][1] = plane_of<TOP, 0>(w.y), a[0][2] = plane_of<TOP, 0>(w.z), a[0][3] = plane_of<TOP, 0>(w.w);
    a[1][0] = plane_of<TOP, 1>(w.x), a[1][1] = plane_of<TOP, 1>(w.y), a[1][2] = plane_of<TOP, 1>(w.z), a[1][3] = plane_of<TOP, 1>(w.w);
    a[2][0] = plane_of<TOP, 2>(w.x), a[2][1] = plane_of<TOP, 2>(w.y), a[2][2] = plane_of<TOP, 2>(w.z), a[2][3] = plane_of<TOP, 2>(w.w);
    a[3][0] = plane_of<TOP, 3>(w.x), a[3][1] = plane_of<TOP, 3>(w.y), a[3][2] = plane_of<TOP, 3>(w.z), a[3][3] = plane_of<TOP, 3>(w.w);
}

// d = the four plane MMAs (A fragments a[s], B fragments b[s]) chained into one accumulator
// started from c (int32, exact).
__device__ __forceinline__ void mma_planes_chained(int (&d)[4], const uint32_t (&a)[4][4], const uint2 (&b)[4],
                                                   const int (&c)[4])
{
    pq2_mma_u8s8(d, a[0], b[0].x, b[0].y, c);
    pq2_mma_u8s8(d, a[1], b[1].x, b[1].y, d);
    pq2_mma_u8s8(d, a[2], b[2].x, b[2].y, d);
    pq2_mma_u8s8(d, a[3], b[3].x, b[3].y, d);
}

// m > 8: the four plane fragments of B (q8 plane order: plane s of the group 32 bytes after plane
// s - 1) from the lane's pointer into one token's group: one address, immediate offsets.
__device__ __forceinline__ void ld_planes8(const int8_t *p, uint2 (&b)[4])
{
    asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%8];\n\t"
        "ld.global.nc.v2.u32 {%2,%3}, [%8+32];\n\t"
        "ld.global.nc.v2.u32 {%4,%5}, [%8+64];\n\t"
        "ld.global.nc.v2.u32 {%6,%7}, [%8+96];"
        : "=r"(b[0].x), "=r"(b[0].y), "=r"(b[1].x), "=r"(b[1].y), "=r"(b[2].x), "=r"(b[2].y), "=r"(b[3].x),
          "=r"(b[3].y)
        : "l"(p));
}

// m > 8: one 16-byte token-constant record (stage_token_consts) at shared address `at`: the two
// C starts and the two activation scales.
__device__ __forceinline__ void lds_token_consts(uint32_t at, int (&c)[2], float (&xs)[2])
{
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];" : "=r"(c[0]), "=r"(c[1]), "=f"(xs[0]), "=f"(xs[1]) : "r"(at));
}

// Accumulates one unit (group g; the lane's code bytes w[r] and scale words sc[r] of its RT
// sub-tiles) into acc.
template <int RT, int NT, int TOKS>
__device__ __forceinline__ void unit_mma(const uint4 (&w)[RT], const uint32_t (&sc)[RT], int g,
                                         const act_ptrs<NT, TOKS == 1 ? 1 : 2> &A, lane_consts<TOKS> &lc,
                                         float (&acc)[RT][NT][4])
{
    constexpr int NJ = TOKS == 1 ? 1 : 2;
    if constexpr (TOKS == 1) {
        // m == 1, bit slices: B column b is bit plane b of the token's q8 (common.cuh), and the
        // A operand is the lane's 16 code bytes as loaded, read as 256 bits per row: one AND-POPC
        // MMA against B1 (both bits of each code meet the activation bit) plus one against B2
        // (the high bit again) gives sum(code * bit b of q) for all eight b, exact. Lane tq
        // combines its two bit planes (f2); its float accumulators take 4^-tq of the row's
        // dot(code - 1, q), and reduce_store scales lane tq by 4^tq and adds the four lanes.
        // (m == 2 the same way needs two B operands and 60 registers instead of 56, which cost
        // gate_up a second wave of blocks; NOTES v11b.)
        const uint4 bx = __ldg(A.xb + (unsigned)g * (PQ2_BITS_GROUP_WORDS / 4));
        const int ns = __ldg(A.sums + (unsigned)g) * lc.c_neg;
        const float xs = __ldg(A.xs + (unsigned)g);
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
            const uint32_t a[4] = {w[r].x, w[r].y, w[r].z, w[r].w};  // fragment order (batch): no moves on TILES
            const int init[4] = {ns, 0, ns, 0};
            int d[4];
            pq2_bmma_and_popc(d, a, bx.x, bx.y, init);
            pq2_bmma_and_popc(d, a, bx.z, bx.w, d);
            acc[r][0][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * xs, acc[r][0][0]);
            acc[r][0][2] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * xs, acc[r][0][2]);
        }
    } else if constexpr (TOKS == 2) {
        // m == 2, column planes: the MMA's 8 columns would carry copies of the two tokens, so
        // column pair {2s, 2s+1} carries activation plane s of tokens 0 and 1 instead and the
        // four plane MMAs chain into one accumulator without mixing: C column 2tq + j of lane
        // tq ends as 4^tq * dot(plane tq of token j) (plus -sum(q) of token j in plane 0). No
        // per-unit combine: the lane's float accumulators take their plane's terms, and
        // reduce_store scales lane tq by 4^-tq and adds the four lanes once per row block.
        const uint2 *q = reinterpret_cast<const uint2 *>(A.q[0] + (unsigned)g * 128u);  // the lane's plane of group g
#pragma unroll
        for (int s = 0; s < 4; ++s)
            if (lc.own[s]) lc.b[s] = __ldg(q);
        // tokens 0 and 1: record pair 0 (-sum(q) kept in the plane-0 lanes only)
        const int4 rc = __ldg(A.rec + (unsigned)g * PQ2_TC_PAIRS);
        const int ns[2] = {rc.x & lc.c_neg, rc.y & lc.c_neg};
        const float xs[2] = {__int_as_float(rc.z), __int_as_float(rc.w)};
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
            uint32_t a[4][4];
            plane_fragments<false>(w[r], a);
            const int zero[4] = {0, 0, 0, 0};
            int d[4];
            mma_planes_chained(d, a, lc.b, zero);
#pragma unroll
            for (int j = 0; j < 4; ++j)
                acc[r][0][j] = fmaf((float)(d[j] + ns[j & 1]), (j < 2 ? wf.x : wf.y) * xs[j & 1], acc[r][0][j]);
        }
    } else {
        // Unsigned group index: one wide multiply-add per address (a signed one costs a 64-bit
        // shift and add per load).
        const unsigned ug = (unsigned)(g + A.g0);
        uint2 bq[NT][4];
        float xs[NT][NJ];
        int ns[NT][NJ];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if constexpr (NT == 2) {
                // m > 8: the token constants of this lane's two C columns (stage_token_consts):
                // C starts -64 sum(q) and activation scales / 64, in the units of the integers
                // below (64 dot(code - 1, q)).
                ld_planes8(A.q[nt] + ug * 128u, bq[nt]);
                lds_token_consts(A.tc + ((unsigned)g * (TOKS / 2) + nt * 4) * 16u, ns[nt], xs[nt]);
            } else {
#pragma unroll
                for (int s = 0; s < 4; ++s) bq[nt][s] = __ldg(reinterpret_cast<const uint2 *>(A.q[nt] + ug * 128u + s * 32));
                // The lane's token pair from its record (one 16-byte load; four loads and their
                // 64-bit address arithmetic before v15e). The integers below are 64 (m <= 8 at
                // rt 1) or 4 (m <= 8 at rt >= 2) times dot(code - 1, q). (Staging these in shared
                // memory as at m > 8 measured 1-3% slower at M = 4 and within 2% at M = 8: NOTES v14b.)
                const int4 rc = __ldg(A.rec + ug * PQ2_TC_PAIRS);
                const float f = RT == 1 ? 1.0f / 64.0f : 1.0f / 4.0f;
                xs[nt][0] = __int_as_float(rc.z) * f, xs[nt][1] = __int_as_float(rc.w) * f;
                ns[nt][0] = rc.x, ns[nt][1] = rc.y;
            }
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
            if constexpr (NT == 2) {
                // m > 8: two token blocks share each A fragment. The planes are moved to the top two
                // bits of every byte (code * 64 for all four: one shift + one mask each), so one
                // accumulator chains the four MMAs, started from -64 * sum(q), and holds
                // 64 * dot(code - 1, q) directly: 12 shifts per sub-tile instead of 3 shift-adds
                // on each of 8 live C registers.
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
            } else if constexpr (RT == 1) {
                // m <= 8 at rt 1: four independent plane MMAs from zero, combined with three
                // shift-adds per C register and -64 * sum(q) added. (The two chains below leave
                // one sub-tile per unit too little independent work: 7-25% slower on tiles rt 1
                // at M = 4 and 8, NOTES v13b.)
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
                // m <= 8 at rt >= 2: two chains of two MMAs. Planes 0 and 2 at weight 1 (the
                // codes and the codes >> 4, masked with 0x03 per byte: the >> 4 moves each byte's
                // bits 4-5 to 0-1, and what crosses in from the next byte is masked off), planes 1
                // and 3 at weight 4 (the same two words masked with 0x0C): d02 = dot0 + dot2 -
                // sum(q) (started from -sum(q)), d13 = 4 (dot1 + dot3), and 4 d02 + d13 =
                // 4 dot(code - 1, q) with one shift-add per C register instead of four: 8 fewer
                // instructions per sub-tile (NOTES v13a). The same float result as the rt 1 form
                // (both integers exact, their scales exact powers of two apart). At m > 8 this
                // form needs 8 more C registers and spills (NOTES v13c).
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
}

// Accumulates units [0, n) of batch b (groups g0, g0+1, ...) into acc.
template <int RT, int U, int NT, int TOKS>
__device__ __forceinline__ void compute_batch(const batch<RT, U> &b, int g0, int n,
                                              const act_ptrs<NT, TOKS == 1 ? 1 : 2> &A, lane_consts<TOKS> &lc,
                                              float (&acc)[RT][NT][4])
{
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (u >= n) break;
        unit_mma<RT, NT, TOKS>(b.codes[u], b.scales[u], g0 + u, A, lc, acc);
    }
}

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

// The activation pointers of a lane for the warp's groups from g_begin; units index them from 0.
// TOKS 1 (bit slices): the token's bit planes, B column gid carries bit plane gid. TOKS 2
// (column planes): B column gid carries plane gid >> 1 of token gid & 1, C columns 2tq + j
// token j. Otherwise B column gid carries token gid, C columns 2tq + j token 2tq + j (nt * 8 more
// in token block nt); tokens past m - 1 repeat m - 1.
template <int NT, int NJ, int TOKS>
__device__ __forceinline__ act_ptrs<NT, NJ> act_setup(const pq2_decode_problem &p, int G, int g_begin, int lane,
                                                      const int4 *tc)
{
    constexpr bool CP = TOKS == 2;
    const int gid = lane >> 2, tq = lane & 3;
    act_ptrs<NT, NJ> A;
    // m <= 2: the pointers start at g_begin (unsigned unit indices: one multiply-add per
    // address). Otherwise at group 0, and units add g0 = g_begin (measured: starting those at
    // g_begin makes ptxas spill or take more registers in several m > 2 instances).
    A.g0 = TOKS <= 2 ? 0 : g_begin;
    if (TOKS > 2) g_begin = 0;
    if constexpr (TOKS == 1)
        A.xb = reinterpret_cast<const uint4 *>(p.xbits + (size_t)g_begin * PQ2_BITS_GROUP_WORDS) + gid * 4 + tq;
    if constexpr (TOKS > 8) A.tc = smem_u32(tc) + tq * 16;
    if constexpr (TOKS >= 2 && TOKS <= 8) A.rec = p.records + (size_t)g_begin * PQ2_TC_PAIRS + (CP ? 0 : tq);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int b_tok = CP ? min(gid & 1, p.m - 1) : min(nt * 8 + gid, p.m - 1);
        if constexpr (TOKS != 1)
            A.q[nt] = p.q8 + (size_t)b_tok * p.k + (size_t)g_begin * 128 + (CP ? (gid >> 1) * 32 : 0) + tq * 8;
        if constexpr (TOKS == 1) {  // m == 1 (m > 1 reads the token-constant records or shared memory)
            // (token min(0, m - 1), written as before: the m = 1 instances' SASS depends on it, v15e)
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
// -64 sum(q'), xs / 64, xs' / 64} (the C starts as int bits), in the units of unit_mma's
// integers (64 dot(code - 1, q)): the same exact products as the global loads gave (powers of
// two). Lane tq of token block nt then reads record nt * 4 + tq of its unit with one 16-byte
// shared load instead of four global loads and their 64-bit address arithmetic: 469 -> 363
// instructions per two units at tiles rt 2 U 2, 114 -> 99 registers (NOTES v14b). Shared memory:
// tc_cap units per warp (pq2_rowblock_tc_cap), after the reduction buffer (or the ring).
template <int TOKS>
__device__ __forceinline__ void stage_token_consts(const pq2_decode_problem &p, int G, int g_begin, int len, int lane,
                                                   int4 *dst)
{
    constexpr int PAIRS = TOKS / 2;
    const float f = 1.0f / 64.0f;
    const int c = 64;
    for (int e = lane; e < len * PAIRS; e += 32) {
        const int u = e / PAIRS, pr = e - u * PAIRS;
        // (32-bit indices: m <= 16, and the shared-memory check keeps k / 128 below
        // kMaxSplits * 227 KB / 128 B, so m * k / 128 < 2^19)
        const unsigned g = (unsigned)(g_begin + u);
        const unsigned t0 = (unsigned)min(2 * pr, p.m - 1) * G + g, t1 = (unsigned)min(2 * pr + 1, p.m - 1) * G + g;
        dst[e] = make_int4(-__ldg(p.sums + t0) * c, -__ldg(p.sums + t1) * c, __float_as_int(__ldg(p.xs + t0) * f),
                           __float_as_int(__ldg(p.xs + t1) * f));
    }
    __syncwarp();
}

// Sums the warps' accumulators in warp order (deterministic) through `red` (shared memory,
// warps * RT * NT * 128 floats, free for this use) and stores the row block's outputs (acc is
// used up: at m <= 2 the lanes combine in it first). SPLIT:
// the block holds split `split` of p.splits of row block rb's groups: it writes its sums to
// p.partial and the last of the row block's blocks to arrive adds the splits' partials in split
// order (deterministic whichever block is last) and stores them.
template <int RT, int NT, int TOKS, bool SPLIT>
__device__ __forceinline__ void reduce_store(const pq2_decode_problem &p, float *red, int rb, int split, int warp,
                                             int warps, int lane, float (&acc)[RT][NT][4])
{
    if constexpr (TOKS <= 2) {
        // m <= 2 (unit_mma): lane tq holds 4^-tq (bit slices) or 4^tq (column planes) times its
        // share of rows gid, gid+8 (tokens 0, 1); scaled back exactly (a power of two) and summed
        // over the four lanes in a fixed order, (tq 0 + tq 1) + (tq 2 + tq 3), which lane tq == 0
        // keeps.
        const int e = (TOKS == 1 ? 1 : -1) * ((lane & 3) << 24);
        const float back = __int_as_float(0x3f800000 + e);  // 4^tq or 4^-tq, exact
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int j = 0; j < 4; j += TOKS == 1 ? 2 : 1) {
                float v = acc[r][0][j] * back;
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                acc[r][0][j] = v;
            }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (TOKS == 1 && (j & 1)) continue;
                red[(((warp * RT + r) * NT + nt) * 4 + j) * 32 + lane] = acc[r][nt][j];
            }
    __syncthreads();
    constexpr int TR = 16 * RT;
    const int outputs = TR * p.m;
    float *part = SPLIT ? p.partial + (size_t)rb * p.splits * outputs : nullptr;  // [split][tok][row]
    for (int e = threadIdx.x; e < outputs; e += blockDim.x) {
        const int tok = e / TR, row = e - tok * TR;
        const int64_t n_row = (int64_t)rb * TR + row;
        if (n_row >= p.n) continue;
        // Where C element (row, tok) lives: sub-tile r, lane (gid, tq), register j.
        const int r = row >> 4, rr = row & 15, nt = tok >> 3, c = tok & 7;
        const int src = ((r * NT + nt) * 4 + (rr >> 3) * 2 + (c & 1)) * 32 + (rr & 7) * 4 + (c >> 1);
        float v = 0.0f;
        for (int w = 0; w < warps; ++w) v += red[w * (RT * NT * 128) + src];
        if constexpr (SPLIT)
            part[(size_t)split * outputs + e] = v;
        else
            pq2_store_from_f32(p.y, (size_t)tok * p.n + n_row, p.y_dtype, v);
    }
    if constexpr (!SPLIT) return;
    // Arrival: every thread's partial is visible device-wide before thread 0 counts the block.
    __threadfence();
    __syncthreads();
    __shared__ unsigned last;
    if (threadIdx.x == 0) last = atomicAdd(p.counters + rb, 1u) == (unsigned)(p.splits - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    pq2_store_partial_sums(p, rb, TR, p.splits, [&](int i) { return part + (size_t)i * outputs; }, threadIdx.x,
                           blockDim.x);
    if (threadIdx.x == 0) p.counters[rb] = 0;  // ready for the next call (the quantiser also clears it)
}

template <int RT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[RT][NT][4])
{
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][nt][j] = 0.0f;
}

// The grid of the register kernels (template GRID): one block per row block, a persistent grid
// (config blocks > 0) or `splits` blocks per row block (config splits > 1).
enum rowblock_grid_kind { kGridRows = 0, kGridPersist = 1, kGridSplit = 2 };

// stages 1 and 2: register batches. kGridRows: one row block per block (blockIdx.x).
// kGridPersist: row blocks blockIdx.x, + gridDim.x, ... (a grid smaller than the row blocks);
// the first batch of the next row block is loaded before this one's reduction, so the warp's
// loads do not pause there.
template <int LAYOUT, int RT, int U, int TOKS, int STAGES, int GRID, int LR>
__global__ void __launch_bounds__(512) rowblock_kernel(const pq2_decode_problem p)
{
    extern __shared__ __align__(16) float red[];  // [warp][r][nt][j][lane]
    constexpr int NT = TOKS > 8 ? 2 : 1;
    constexpr int NJ = TOKS == 1 ? 1 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int G = (int)(p.k >> 7);
    // kGridSplit: block x holds split x % splits of row block x / splits, groups
    // [split*G/splits, (split+1)*G/splits), shared among its warps.
    int rb = blockIdx.x, split = 0, g0 = 0, gs = G;
    if constexpr (GRID == kGridSplit) {
        rb = blockIdx.x / p.splits, split = blockIdx.x - rb * p.splits;
        g0 = (int)((int64_t)split * G / p.splits);
        gs = (int)((int64_t)(split + 1) * G / p.splits) - g0;
    }
    const warp_split ws = split_of(gs, warp, warps);
    const int g_begin = g0 + ws.g_begin, len = ws.len;
    // LR: a tiles file's rt; below RT, coarse rows (coarse_src)
    using src_t = std::conditional_t<(LAYOUT == PQ2_LAYOUT_TILES && LR < RT), coarse_src<RT, U, LR>,
                                     weight_src<LAYOUT, RT, U>>;
    src_t src(p, rb, g_begin, lane);

    // The first batch (stages 1) or two (stages 2) are in flight before the wait.
    batch<RT, U> b0, b1;
    if (len > 0) src.load(b0, 0, min(len, U));
    if (STAGES == 2 && len > U) src.load(b1, U, min(len - U, U));
    pq2_pdl_handoff();  // the quantiser's outputs are read only after this
    int4 *tc = nullptr;
    if constexpr (TOKS > 8) {
        tc = reinterpret_cast<int4 *>(red + warps * (RT * NT * 128)) + warp * p.tc_cap * (TOKS / 2);
        stage_token_consts<TOKS>(p, G, g_begin, len, lane, tc);
    }
    const act_ptrs<NT, NJ> A = act_setup<NT, NJ, TOKS>(p, G, g_begin, lane, tc);
    lane_consts<TOKS> lc(lane);

    for (;;) {
        float acc[RT][NT][4];
        zero_acc(acc);
        if constexpr (STAGES == 1 && LAYOUT == PQ2_LAYOUT_TILES && GRID != kGridSplit &&
                      (TOKS == 1 ? U > 1 : TOKS == 8 && U == 2 && GRID == kGridRows)) {
            // m == 1, batches of 2-4 units: running pointers (src's weights and the three
            // activation streams advance one batch per iteration; src is rebuilt for a persistent
            // grid's next row block), batch 0 already loaded, each later batch loaded right after
            // the previous compute: fewer instructions, and 106 -> 85 registers at U 4. Not at
            // U 1, where ptxas then hoists the next unit's first load into this unit's compute
            // and the kernel gets slower, nor for split grids (more registers; NOTES v9f).
            // m <= 8 (token class 8) takes it at U 2 on the rows grid only: persistent grids
            // gain registers with it and U 4 spills (NOTES v13a).
            act_ptrs<NT, NJ> a = A;
            for (int i = 0;;) {
                compute_batch<RT, U, NT, TOKS>(b0, 0, min(len - i, U), a, lc, acc);
                i += U;
                if (i >= len) break;
                src.advance(U), a.template advance<TOKS>(U);
                src.load(b0, 0, min(len - i, U));
            }
        } else if constexpr (STAGES == 1 && LAYOUT == PQ2_LAYOUT_TILES && TOKS == 1 && U == 1 && RT > 1 &&
                             GRID != kGridSplit) {
            // m == 1, one unit per batch: running pointers too, but each unit's loads stay at the
            // top of its own iteration (the i > 0 test keeps ptxas from hoisting them into the
            // previous unit's compute, which v9f measured slower): 111 -> 101 instructions per
            // unit, 50 -> 56 registers. Advancing the weight pointers after the compute as well
            // saves 4 more but was 1-2% slower in an A/B (NOTES v10d). Not for m == 2, where
            // gate_up lost 7% (NOTES v10c), nor rt 1 (ptxas then spills).
            act_ptrs<NT, NJ> a = A;
            for (int i = 0; i < len; ++i) {
                if (i > 0) {
                    src.advance(1);
                    src.load(b0, 0, 1);
                }
                compute_batch<RT, U, NT, TOKS>(b0, 0, 1, a, lc, acc);
                a.template advance<TOKS>(1);
            }
        } else if constexpr (STAGES == 1) {
            for (int i = 0; i < len; i += U) {
                if (i > 0) src.load(b0, i, min(len - i, U));
                compute_batch<RT, U, NT, TOKS>(b0, i, min(len - i, U), A, lc, acc);
            }
        } else {
            // Ping-pong between two register sets (no copies): b0 holds units [i, i+U) and b1
            // [i+U, i+2U); each is refilled as soon as it has been computed.
            for (int i = 0; i < len; i += 2 * U) {
                compute_batch<RT, U, NT, TOKS>(b0, i, min(len - i, U), A, lc, acc);
                if (i + 2 * U < len) src.load(b0, i + 2 * U, min(len - i - 2 * U, U));
                if (i + U >= len) break;
                compute_batch<RT, U, NT, TOKS>(b1, i + U, min(len - i - U, U), A, lc, acc);
                if (i + 3 * U < len) src.load(b1, i + 3 * U, min(len - i - 3 * U, U));
            }
        }
        if constexpr (GRID != kGridPersist) {
            reduce_store<RT, NT, TOKS, GRID == kGridSplit>(p, red, rb, split, warp, warps, lane, acc);
            return;
        } else {
            const int next = rb + (int)gridDim.x;
            const bool more = next < (int)pq2_decode_row_blocks(p.n, RT);
            if (more) {
                src = src_t(p, next, g_begin, lane);
                if (len > 0) src.load(b0, 0, min(len, U));
                if (STAGES == 2 && len > U) src.load(b1, U, min(len - U, U));
            }
            reduce_store<RT, NT, TOKS, false>(p, red, rb, 0, warp, warps, lane, acc);
            if (!more) return;
            __syncthreads();  // every thread has read `red` before the next row block writes it
            rb = next;
        }
    }
}

// Bytes of one ring slot: U units of RT sub-tiles, 512 code bytes + 32 scale bytes each.
template <int RT, int U>
struct ring_slot {
    static constexpr int kCodes = U * RT * 512;
    static constexpr int kBytes = U * RT * 544;
};

// Slot i of a warp's sequence: units [i*U, min(len, i*U+U)) into ring slot i % stages.
template <int RT, int U>
__device__ __forceinline__ void issue_slot(uint8_t *ring, uint64_t *bars, int stages, int i, int len,
                                           const uint8_t *src_codes, const uint8_t *src_scales)
{
    using slot = ring_slot<RT, U>;
    const int n = min(U, len - i * U);
    const int s = i % stages;
    uint8_t *dst = ring + s * slot::kBytes;
    bulk_copy2(bars + s, dst, src_codes + (size_t)i * slot::kCodes, (uint32_t)n * (RT * 512),
               dst + slot::kCodes, src_scales + (size_t)i * (U * RT * 32), (uint32_t)n * (RT * 32));
}

// stages >= 3 (sm_90): per-warp shared-memory ring filled by bulk copies. Shared memory:
// [warp][slot] slots, then [warp][slot] mbarriers; the reduction reuses the slots at the end.
template <int RT, int U, int TOKS>
__global__ void __launch_bounds__(512, 1) rowblock_ring_kernel(const pq2_decode_problem p, int stages)
{
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int NT = TOKS > 8 ? 2 : 1;
    constexpr int NJ = TOKS == 1 ? 1 : 2;
    using slot = ring_slot<RT, U>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int G = (int)(p.k >> 7);
    const warp_split ws = split_of(G, warp, warps);
    const int len = ws.len, n_slots = (len + U - 1) / U;
    uint8_t *ring = smem + (size_t)warp * stages * slot::kBytes;
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + (size_t)warps * stages * slot::kBytes) + warp * stages;
    const size_t unit0 = (size_t)blockIdx.x * G + ws.g_begin;  // flat index of the warp's first unit
    const uint8_t *src_codes = p.codes + unit0 * (RT * 512);
    const uint8_t *src_scales = reinterpret_cast<const uint8_t *>(p.wscales) + unit0 * (RT * 32);

    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(bars + s);
        for (int i = 0; i < min(stages, n_slots); ++i)
            issue_slot<RT, U>(ring, bars, stages, i, len, src_codes, src_scales);
    }
    __syncwarp();
    pq2_pdl_handoff();  // the quantiser's outputs are read only after this
    int4 *tc = nullptr;
    if constexpr (TOKS > 8) {
        // after the ring and its barriers (16-byte aligned)
        const size_t at = ((size_t)warps * stages * (slot::kBytes + sizeof(uint64_t)) + 15) & ~(size_t)15;
        tc = reinterpret_cast<int4 *>(smem + at) + warp * p.tc_cap * (TOKS / 2);
        stage_token_consts<TOKS>(p, G, ws.g_begin, len, lane, tc);
    }
    const act_ptrs<NT, NJ> A = act_setup<NT, NJ, TOKS>(p, G, ws.g_begin, lane, tc);
    lane_consts<TOKS> lc(lane);
    float acc[RT][NT][4];
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
            uint4 w[RT];
            uint32_t sc[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                w[r] = *reinterpret_cast<const uint4 *>(st + (u * RT + r) * 512 + lane * 16);
                sc[r] = *reinterpret_cast<const uint32_t *>(st + slot::kCodes + (u * RT + r) * 32 + gid * 4);
            }
            unit_mma<RT, NT, TOKS>(w, sc, i * U + u, A, lc, acc);
        }
        // Refill the slot just read: every lane's reads of it are done (and ordered before the
        // bulk copy's writes) before lane 0 issues it.
        fence_proxy_async();
        __syncwarp();
        if (lane == 0 && i + stages < n_slots) issue_slot<RT, U>(ring, bars, stages, i + stages, len, src_codes, src_scales);
    }
    __syncthreads();  // every warp is done with its ring: reuse it for the reduction
    reduce_store<RT, NT, TOKS, false>(p, reinterpret_cast<float *>(smem), blockIdx.x, 0, warp, warps, lane, acc);
}

// ---- instances ------------------------------------------------------------------------------
// Register kernels: layout x RT (sub-tiles per unit; TILES: = the layout's rt) x U (units per
// batch) x TOKS (1: m == 1; 2: m == 2; 8: m <= 8; 16: m <= 16) x STAGES (1: load then compute;
// 2: next batch loads during this one). Only the combinations ptxas compiles without spills
// (tools/ptxas_report.py; batches of at most 4 sub-tiles, and tiles rt 2 U 4 stages 1 for
// m <= 8: 8 sub-tiles); tiles rt 4 serves m <= 8 (larger m goes to the stream family).
#define PQ2_T12(X, L, R, U, S) X(L, R, U, 1, S) X(L, R, U, 2, S)  // m == 1 (bit slices) and m == 2 (column planes)
#define PQ2_ROWBLOCK_ALL_TOKS(X, L, R, U) \
    PQ2_T12(X, L, R, U, 1) X(L, R, U, 8, 1) X(L, R, U, 16, 1) PQ2_T12(X, L, R, U, 2) X(L, R, U, 8, 2) X(L, R, U, 16, 2)
#define PQ2_ROWBLOCK_LEAN_16(X, L, R, U) \
    PQ2_T12(X, L, R, U, 1) X(L, R, U, 8, 1) X(L, R, U, 16, 1) PQ2_T12(X, L, R, U, 2) X(L, R, U, 8, 2)
#define PQ2_ROWBLOCK_INSTANCES(X)                                                                         \
    PQ2_ROWBLOCK_ALL_TOKS(X, PQ2_LAYOUT_TILES, 1, 1) PQ2_ROWBLOCK_ALL_TOKS(X, PQ2_LAYOUT_TILES, 1, 2)     \
    PQ2_ROWBLOCK_LEAN_16(X, PQ2_LAYOUT_TILES, 1, 4) PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 1, 1)                 \
    X(PQ2_LAYOUT_TILES, 2, 1, 8, 1) X(PQ2_LAYOUT_TILES, 2, 1, 16, 1) X(PQ2_LAYOUT_TILES, 2, 1, 1, 2)      \
    X(PQ2_LAYOUT_TILES, 2, 1, 8, 2) X(PQ2_LAYOUT_TILES, 2, 2, 1, 1) X(PQ2_LAYOUT_TILES, 2, 2, 8, 1)      \
    X(PQ2_LAYOUT_TILES, 2, 2, 16, 1) PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 2, 2) X(PQ2_LAYOUT_TILES, 2, 2, 8, 2) \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 4, 1, 1) X(PQ2_LAYOUT_TILES, 4, 1, 8, 1)                                 \
    X(PQ2_LAYOUT_TILES, 4, 1, 2, 2) X(PQ2_LAYOUT_TILES, 4, 1, 8, 2)                                       \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 4, 1) X(PQ2_LAYOUT_TILES, 2, 4, 8, 1)                                 \
    X(PQ2_LAYOUT_PLANES, 1, 1, 2, 1) X(PQ2_LAYOUT_PLANES, 1, 1, 8, 1) X(PQ2_LAYOUT_PLANES, 1, 1, 16, 1)   \
    PQ2_T12(X, PQ2_LAYOUT_PLANES, 1, 1, 2) X(PQ2_LAYOUT_PLANES, 1, 1, 8, 2)                               \
    X(PQ2_LAYOUT_PLANES, 1, 1, 16, 2) PQ2_ROWBLOCK_ALL_TOKS(X, PQ2_LAYOUT_PLANES, 1, 2)                   \
    X(PQ2_LAYOUT_PLANES, 2, 1, 8, 1) X(PQ2_LAYOUT_PLANES, 2, 1, 16, 1)                                    \
    PQ2_T12(X, PQ2_LAYOUT_PLANES, 2, 1, 2) X(PQ2_LAYOUT_PLANES, 2, 1, 8, 2)                               \
    X(PQ2_LAYOUT_PLANES, 2, 1, 16, 2) PQ2_T12(X, PQ2_LAYOUT_PLANES, 2, 2, 1)                              \
    X(PQ2_LAYOUT_PLANES, 2, 2, 8, 1) PQ2_T12(X, PQ2_LAYOUT_PLANES, 2, 2, 2)                               \
    X(PQ2_LAYOUT_PLANES, 2, 2, 8, 2)
// Left out since the column planes (spills, NOTES v10a; still with the bit slices): planes rt 1 U 1 m=1 stages 1, tiles rt 2
// U 1 m=2 stages 2; since the token-constant records (v15e) tiles rt 2 U 2 m=2 stages 1.
// The persistent register kernels (config blocks > 0): tiles, the same combinations less those
// that spill with the loop (rt 1 U 4 m=1 stages 1; rt 4 U 1 m=1 stages 1; rt 4 U 1 m<=8 stages 2;
// since the column planes also rt 1 U 2 m=1 stages 2, rt 2 U 1 m=1 stages 2 and rt 2 U 2 m=1
// stages 1; since the bit slices rt 1 U 2 m=1 stages 1; since the token constants rt 1 U 1 m>8
// stages 1; since the token-constant records rt 1 U 4 m<=8 stages 1).
#define PQ2_PERSIST_INSTANCES(X)                                                                          \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 1, 1, 1) X(PQ2_LAYOUT_TILES, 1, 1, 8, 1) PQ2_T12(X, PQ2_LAYOUT_TILES, 1, 1, 2) \
    X(PQ2_LAYOUT_TILES, 1, 1, 8, 2) X(PQ2_LAYOUT_TILES, 1, 1, 16, 2) X(PQ2_LAYOUT_TILES, 1, 2, 2, 1)      \
    X(PQ2_LAYOUT_TILES, 1, 2, 8, 1) X(PQ2_LAYOUT_TILES, 1, 2, 16, 1) X(PQ2_LAYOUT_TILES, 1, 2, 2, 2)      \
    X(PQ2_LAYOUT_TILES, 1, 2, 8, 2) X(PQ2_LAYOUT_TILES, 1, 2, 16, 2) X(PQ2_LAYOUT_TILES, 1, 4, 2, 1)      \
    X(PQ2_LAYOUT_TILES, 1, 4, 16, 1)                                                                      \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 1, 4, 2) X(PQ2_LAYOUT_TILES, 1, 4, 8, 2)                                 \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 1, 1) X(PQ2_LAYOUT_TILES, 2, 1, 8, 1)                                 \
    X(PQ2_LAYOUT_TILES, 2, 1, 16, 1) X(PQ2_LAYOUT_TILES, 2, 1, 2, 2) X(PQ2_LAYOUT_TILES, 2, 1, 8, 2)      \
    X(PQ2_LAYOUT_TILES, 2, 2, 2, 1) X(PQ2_LAYOUT_TILES, 2, 2, 8, 1) X(PQ2_LAYOUT_TILES, 2, 2, 16, 1)      \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 2, 2) X(PQ2_LAYOUT_TILES, 2, 2, 8, 2)                                 \
    X(PQ2_LAYOUT_TILES, 4, 1, 2, 1) X(PQ2_LAYOUT_TILES, 4, 1, 8, 1)                                       \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 4, 1) X(PQ2_LAYOUT_TILES, 2, 4, 8, 1)

// The ring kernels (stages >= 3): RT x U (units per slot) x TOKS, slots of at most 4 sub-tiles;
// rt 4 serves m <= 8 (spills at 16).
#define PQ2_RING_TOKS(X, R, U) X(R, U, 1) X(R, U, 2) X(R, U, 8) X(R, U, 16)
#define PQ2_RING_INSTANCES(X)                                                                             \
    PQ2_RING_TOKS(X, 1, 1) PQ2_RING_TOKS(X, 1, 2) PQ2_RING_TOKS(X, 1, 4) PQ2_RING_TOKS(X, 2, 1)           \
    PQ2_RING_TOKS(X, 2, 2) X(4, 1, 1) X(4, 1, 2) X(4, 1, 8)

// The split register kernels (config splits > 1): tiles rt 2 and planes rt 1-2 (the layouts'
// usual row blocks), the register kernels' combinations less planes rt 2 U 1 m > 8 stages 2,
// tiles rt 2 U 1 m <= 8 stages 1 and (since the bit slices) planes rt 1 U 2 m=1 stages 2 (spill).
#define PQ2_SPLIT_INSTANCES(X)                                                                            \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 1, 1) X(PQ2_LAYOUT_TILES, 2, 1, 16, 1)                                \
    PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 1, 2) X(PQ2_LAYOUT_TILES, 2, 1, 8, 2)                                 \
    PQ2_ROWBLOCK_LEAN_16(X, PQ2_LAYOUT_TILES, 2, 2) PQ2_T12(X, PQ2_LAYOUT_TILES, 2, 4, 1)                 \
    X(PQ2_LAYOUT_TILES, 2, 4, 8, 1) PQ2_ROWBLOCK_ALL_TOKS(X, PQ2_LAYOUT_PLANES, 1, 1)                     \
    PQ2_T12(X, PQ2_LAYOUT_PLANES, 1, 2, 1) X(PQ2_LAYOUT_PLANES, 1, 2, 8, 1)                               \
    X(PQ2_LAYOUT_PLANES, 1, 2, 16, 1) X(PQ2_LAYOUT_PLANES, 1, 2, 2, 2) X(PQ2_LAYOUT_PLANES, 1, 2, 8, 2)   \
    X(PQ2_LAYOUT_PLANES, 1, 2, 16, 2) X(PQ2_LAYOUT_PLANES, 2, 1, 8, 1)                                    \
    X(PQ2_LAYOUT_PLANES, 2, 1, 16, 1) PQ2_T12(X, PQ2_LAYOUT_PLANES, 2, 1, 2)                              \
    X(PQ2_LAYOUT_PLANES, 2, 1, 8, 2) PQ2_T12(X, PQ2_LAYOUT_PLANES, 2, 2, 1)                               \
    X(PQ2_LAYOUT_PLANES, 2, 2, 8, 1) PQ2_T12(X, PQ2_LAYOUT_PLANES, 2, 2, 2)                               \
    X(PQ2_LAYOUT_PLANES, 2, 2, 8, 2)

// Coarse rows (config rt 4 on tiles rt 2 files, NOTES v15g): the m <= 8 register kernels
// (entries: grid kind, RT, U, TOKS, STAGES).
#define PQ2_COARSE_INSTANCES(X) X(kGridRows, 4, 1, 8, 1) X(kGridRows, 4, 1, 8, 2) X(kGridPersist, 4, 1, 8, 1)

using rowblock_fn = void (*)(const pq2_decode_problem);

// The TOKS of an instance for m (the stream family's classes plus 2: m == 2 has column planes).
int rowblock_tokens_class(int64_t m) { return m == 2 ? 2 : pq2_decode_tokens_class(m); }
using ring_fn = void (*)(const pq2_decode_problem, int);

int grid_kind(const pq2_decode_config &cfg) { return cfg.splits > 1 ? kGridSplit : cfg.blocks > 0 ? kGridPersist : kGridRows; }

// layout_rt: TILES, the layout's rt (a multiple of rt); PLANES, unused.
rowblock_fn find_rowblock(int32_t layout, int32_t layout_rt, int32_t rt, int32_t unroll, int64_t m, int32_t stages,
                          int grid)
{
    const int toks = rowblock_tokens_class(m);
    const int lr = layout == PQ2_LAYOUT_TILES ? layout_rt : rt;
#define PQ2_MATCH_LR(GK, L, R, U, T, S, LR)                                                                       \
    if (grid == GK && layout == (L) && lr == (LR) && rt == (R) && unroll == (U) && toks == (T) && stages == (S)) \
        return rowblock_kernel<L, R, U, T, S, GK, LR>;
#define PQ2_MATCH_GRID(GK, L, R, U, T, S) PQ2_MATCH_LR(GK, L, R, U, T, S, R)
#define PQ2_MATCH(L, R, U, T, S) PQ2_MATCH_GRID(kGridRows, L, R, U, T, S)
    PQ2_ROWBLOCK_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
#define PQ2_MATCH(L, R, U, T, S) PQ2_MATCH_GRID(kGridPersist, L, R, U, T, S)
    PQ2_PERSIST_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
#define PQ2_MATCH(L, R, U, T, S) PQ2_MATCH_GRID(kGridSplit, L, R, U, T, S)
    PQ2_SPLIT_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
#define PQ2_MATCH(GK, R, U, T, S) PQ2_MATCH_LR(GK, PQ2_LAYOUT_TILES, R, U, T, S, 2)
    PQ2_COARSE_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
#undef PQ2_MATCH_GRID
#undef PQ2_MATCH_LR
    return nullptr;
}

ring_fn find_ring(int32_t rt, int32_t unroll, int64_t m)
{
    const int toks = rowblock_tokens_class(m);
#define PQ2_MATCH(R, U, T) \
    if (rt == (R) && unroll == (U) && toks == (T)) return rowblock_ring_kernel<R, U, T>;
    PQ2_RING_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
    return nullptr;
}

bool has_instance(const pq2_decode_config &cfg, int32_t layout, int32_t layout_rt, int64_t m)
{
    return cfg.stages >= 3 ? find_ring(cfg.rt, cfg.unroll, m) != nullptr
                           : find_rowblock(layout, layout_rt, cfg.rt, cfg.unroll, m, cfg.stages, grid_kind(cfg)) != nullptr;
}

}  // namespace

int64_t pq2_rowblock_tc_cap(const pq2_decode_config &cfg, int64_t m, int64_t k)
{
    if (m <= 8) return 0;
    const int64_t splits = cfg.splits > 1 ? cfg.splits : 1;
    const int64_t groups = ((k >> 7) + splits - 1) / splits;  // a block's groups, at most
    return (groups + cfg.warps - 1) / cfg.warps;
}

size_t pq2_rowblock_smem(const pq2_decode_config &cfg, int64_t m, int64_t k)
{
    const int nt = m > 8 ? 2 : 1;
    const size_t tc = (size_t)cfg.warps * pq2_rowblock_tc_cap(cfg, m, k) * 8 * 16;  // 8 records of 16 bytes per unit
    const size_t red = (size_t)cfg.warps * cfg.rt * nt * 128 * sizeof(float);
    if (cfg.stages < 3) return red + tc;
    const size_t ring = (size_t)cfg.warps * cfg.stages * (cfg.unroll * cfg.rt * 544 + sizeof(uint64_t));
    return (ring > red ? ((ring + 15) & ~(size_t)15) : red) + tc;
}

pq2_status pq2_rowblock_check_config(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                     int32_t layout_rt, int64_t m, int64_t k, int cc, int max_smem)
{
    if (layout != PQ2_LAYOUT_TILES && layout != PQ2_LAYOUT_PLANES)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: the row block family reads the planes or tiles layout", fn);
    if (layout == PQ2_LAYOUT_PLANES && cfg.stages >= 3)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: config stages=%d: the row block family's bulk-copy ring reads the tiles layout "
                             "only (planes: stages 1 or 2)", fn, (int)cfg.stages);
    PQ2_CHECK(pq2_decode_check_shape(fn, cfg, layout, layout_rt, 16, /*coarse_rows=*/true));
    if (layout == PQ2_LAYOUT_TILES && cfg.rt != layout_rt && cfg.stages >= 3)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: config rt=%d stages=%d: the bulk-copy ring reads whole tiles (rt = the layout's "
                             "%d); coarse row blocks run on the register kernels (stages 1 or 2)", fn, (int)cfg.rt,
                             (int)cfg.stages, (int)layout_rt);
    if (cfg.stages < 1 || cfg.stages > 8)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config stages=%d is not in 1..8 (row block family: 1-2 register batches, "
                             "3-8 shared-memory ring slots)", fn, (int)cfg.stages);
    if (cfg.blocks < 0 || cfg.blocks > kMaxBlocksPerSm)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config blocks=%d is not in 0..%d (row block family: 0 = one block per row "
                             "block, else blocks per multiprocessor of a persistent grid)",
                             fn, (int)cfg.blocks, kMaxBlocksPerSm);
    if (cfg.blocks != 0 && cfg.stages >= 3)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: config blocks=%d with stages=%d: the bulk-copy ring runs one block per row "
                             "block (blocks 0)", fn, (int)cfg.blocks, (int)cfg.stages);
    if (cfg.splits < 0 || cfg.splits > kMaxSplits)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config splits=%d is not in 0..%d (row block family: blocks per row block)", fn,
                             (int)cfg.splits, kMaxSplits);
    if (cfg.splits > 1 && (cfg.blocks != 0 || cfg.stages >= 3))
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: config splits=%d with blocks=%d stages=%d: split row blocks run on the register "
                             "kernels (stages 1-2) with one grid block per split (blocks 0)", fn, (int)cfg.splits,
                             (int)cfg.blocks, (int)cfg.stages);
    if (cfg.stages >= 3 && cc < 90)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: config stages=%d (bulk-copy ring) needs compute capability 9.0; this device "
                             "has %d.%d (use stages 1 or 2)", fn, (int)cfg.stages, cc / 10, cc % 10);
    // (max_smem less the split kernels' static arrival flag)
    PQ2_CHECK(pq2_decode_check_smem(fn, cfg, pq2_rowblock_smem(cfg, m, k), max_smem - kStaticSmem));
    if (!has_instance(cfg, layout, layout_rt, m))
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: no compiled row-block kernel for layout %s%s rt=%d unroll=%d stages=%d%s m=%lld", fn,
                             pq2_layout_name(layout), layout == PQ2_LAYOUT_TILES && layout_rt != cfg.rt ? " (coarse rows)" : "",
                             (int)cfg.rt, (int)cfg.unroll, (int)cfg.stages,
                             cfg.splits > 1 ? " (split row blocks)" : cfg.blocks > 0 ? " (persistent grid)" : "",
                             (long long)m);
    return PQ2_OK;
}

// Lets kernel f take all the shared memory a block may have (max_smem_optin, static included).
template <class F>
cudaError_t allow_dynamic_smem(F f, int max_smem_optin)
{
    cudaFuncAttributes a;
    const cudaError_t e = cudaFuncGetAttributes(&a, f);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem_optin - (int)a.sharedSizeBytes);
}

pq2_status pq2_rowblock_init_device(const char *fn, int max_smem_optin)
{
#define PQ2_ATTR_LR(GK, L, R, U, T, S, LR) \
    PQ2_CUDA_TRY(fn, allow_dynamic_smem(rowblock_kernel<L, R, U, T, S, GK, LR>, max_smem_optin));
#define PQ2_ATTR_GRID(GK, L, R, U, T, S) PQ2_ATTR_LR(GK, L, R, U, T, S, R)
#define PQ2_ATTR(L, R, U, T, S) PQ2_ATTR_GRID(kGridRows, L, R, U, T, S)
    PQ2_ROWBLOCK_INSTANCES(PQ2_ATTR)
#undef PQ2_ATTR
#define PQ2_ATTR(L, R, U, T, S) PQ2_ATTR_GRID(kGridPersist, L, R, U, T, S)
    PQ2_PERSIST_INSTANCES(PQ2_ATTR)
#undef PQ2_ATTR
#define PQ2_ATTR(L, R, U, T, S) PQ2_ATTR_GRID(kGridSplit, L, R, U, T, S)
    PQ2_SPLIT_INSTANCES(PQ2_ATTR)
#undef PQ2_ATTR
#define PQ2_ATTR(GK, R, U, T, S) PQ2_ATTR_LR(GK, PQ2_LAYOUT_TILES, R, U, T, S, 2)
    PQ2_COARSE_INSTANCES(PQ2_ATTR)
#undef PQ2_ATTR
#undef PQ2_ATTR_GRID
#undef PQ2_ATTR_LR
#define PQ2_ATTR(R, U, T)                                                                                       \
    PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(rowblock_ring_kernel<R, U, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem_optin)); \
    PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(rowblock_ring_kernel<R, U, T>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    PQ2_RING_INSTANCES(PQ2_ATTR)
#undef PQ2_ATTR
    return PQ2_OK;
}

int64_t pq2_rowblock_grid(const pq2_decode_config &cfg, int64_t n, int sms)
{
    const int64_t row_blocks = pq2_decode_row_blocks(n, cfg.rt);
    if (cfg.splits > 1) return row_blocks * cfg.splits;
    const int64_t persistent = (int64_t)cfg.blocks * sms;
    return cfg.blocks > 0 && persistent < row_blocks ? persistent : row_blocks;
}

pq2_status pq2_rowblock_launch(const char *fn, const pq2_decode_problem &p, const pq2_decode_config &cfg,
                               int64_t blocks, bool after_kernel, cudaStream_t stream)
{
    const int64_t row_blocks = pq2_decode_row_blocks(p.n, cfg.rt);
    if (blocks > INT32_MAX || p.k / 128 * row_blocks > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: n=%lld k=%lld: too many row blocks for one grid", fn,
                             (long long)p.n, (long long)p.k);
    pq2_decode_problem q = p;
    q.tc_cap = (int32_t)pq2_rowblock_tc_cap(cfg, p.m, p.k);
    pq2_launch l((unsigned)blocks, cfg.warps * 32, pq2_rowblock_smem(cfg, p.m, p.k), stream, after_kernel);
    if (cfg.stages >= 3)
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, find_ring(cfg.rt, cfg.unroll, p.m), q, (int)cfg.stages));
    else
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, find_rowblock(p.layout, p.layout_rt, cfg.rt, cfg.unroll, p.m, cfg.stages, grid_kind(cfg)), q));
    return pq2_launch_status(fn);
}
