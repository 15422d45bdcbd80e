// decode.cu - the small-batch (M = 1..16) PQ2 matmul: y[m][n] = x[m][k] . W^T, weights streamed
// once from HBM straight into int8 tensor-core fragments (masked-plane MMA).
//
// Arithmetic. Weights are the A operand of mma.m16n8k32 (u8): 16 rows x 32 code bytes of one
// 128-group; a lane's 16 bytes are rows gid and gid+8, code bytes tq*8..tq*8+7 (TILES: one
// contiguous 16-byte piece; PLANES: two 8-byte pieces). Masking them with the four plane masks
// (pq2_plane) gives four A fragments holding code * 4^s; activation plane s (Q8 plane order: 8
// contiguous bytes per lane) is the matching B fragment, tokens as the 8 MMA columns. Per group:
//     R_s = MMA of plane s = 4^s * dot(code_s, q_s), plane 0 started from -sum(q),
//     P   = ((R_0 * 4 + R_1) * 4 + R_2) * 4 + R_3 = 64 * dot(code - 1, q)   (exact in int32),
//     acc += float(P) * (d_w * d_x / 64)                                    (fp32)
// which rounds exactly as float(P / 64) * (d_w * d_x) would: scaling by 2^-6 commutes with
// rounding.
//
// Streaming. Work is a sequence of units (row block of 16*RT rows, 128-group) in the order the
// TILES layout stores them, cut into chunks of U units (U divides K/128, so a chunk never
// straddles two row blocks). Every warp takes an equal contiguous range of chunks ("stream-K"),
// so all warps finish together whatever the shape. A warp streams its range through a private
// shared-memory ring of STAGES chunks (cp.async; each lane copies exactly the code bytes it later
// reads, and the warp's shared scale words need only a __syncwarp), keeping (STAGES-1) chunks in
// flight without spending registers on them. A row block covered by one warp is stored directly; one split between warps
// is finished by the last of them to arrive (a counter per row block), which sums the partial
// results in warp order: the bits never depend on timing.
#include "decode.cuh"

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    // .cg: straight to L2 -> shared, no L1 allocation for bytes used once.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async8(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
// The "memory" clobbers keep the compiler from moving shared-memory reads of a ring slot across
// the copies into it and the waits for them.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Waits until at most n copy groups are pending (n is the ring depth minus 2, 0..6).
__device__ __forceinline__ void cp_async_wait_dyn(int n)
{
    switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
    }
}

struct stream_plan {
    int32_t units;        // row blocks * groups (< 2^31: checked at launch)
    int32_t chunks;       // units / unroll (unroll divides groups: chunks never straddle rows)
    int32_t total_warps;  // grid * warps per block (<= chunks)
    int32_t groups, stages, unroll;
};

// Position in the unit sequence: flat unit index, its row block and group.
struct cursor {
    int32_t u, rb, g;
};

__device__ __forceinline__ void advance(cursor &c, int n, int groups)
{
    c.u += n;
    c.g += n;
    if (c.g == groups) c.g = 0, ++c.rb;
}

// First unit of warp w's range (ranges are whole chunks) and the warp owning unit u.
__device__ __forceinline__ int32_t range_begin(int32_t w, const stream_plan &sp)
{
    return (int32_t)((int64_t)w * sp.chunks / sp.total_warps) * sp.unroll;
}
__device__ __forceinline__ int32_t owner_of(int32_t u, const stream_plan &sp)
{
    return (int32_t)((((int64_t)(u / sp.unroll) + 1) * sp.total_warps - 1) / sp.chunks);
}

// Per-warp ring of STAGES chunks of U units. Codes: [stage][u][r][lane] 16 B (the lane's own
// fragment bytes). Scales, TILES: [stage][u][r] 32 B (the unit's 16 fp16 in lane-pair order,
// copied with 16-byte copies and shared by the warp); PLANES: [stage][u][r][lane][2] 4 B (the
// aligned words holding the lane's two row scales).
template <int LAYOUT, int RT, int U>
struct ring {
    static constexpr int kCodeBytes = U * RT * 32 * 16;
    static constexpr int kScaleBytes = LAYOUT == PQ2_LAYOUT_TILES ? U * RT * 32 : U * RT * 32 * 8;
    static constexpr int kStageBytes = kCodeBytes + kScaleBytes;
    uint8_t *base;  // this warp's ring
    __device__ uint8_t *stage_ptr(int stage) const { return base + stage * kStageBytes; }
};

// Per-lane constants of the activation side: where this lane's B fragments, d_x and sums of
// group 0 are, and which of them exist (tokens < m).
template <int NT>
struct act_lane {
    const int8_t *q[NT];   // q8 of token nt*8+gid, + tq*8
    const float *xs[NT];   // scales of token nt*8+2tq (+groups for the next token)
    const int32_t *sums[NT];
    bool has_b[NT];
    bool live[NT][2];
};

// Issues the copies of chunk (c, n <= U units) into ring stage `stage`.
template <int LAYOUT, int RT, int U>
__device__ __forceinline__ void issue_chunk(const ring<LAYOUT, RT, U> &R, int stage, const cursor &c,
                                            int n, const pq2_decode_problem &p, int groups, int lane)
{
    uint8_t *dst = R.stage_ptr(stage);
    if constexpr (LAYOUT == PQ2_LAYOUT_TILES) {
        // Unit u = rb*G + g is stored at u*RT*512 (codes) and u*RT*32 (scales): the warp's units
        // are one contiguous stream.
        const uint8_t *src = p.codes + (size_t)c.u * (RT * 512) + lane * 16;
#pragma unroll
        for (int i = 0; i < U * RT; ++i)
            if (i < n * RT) cp_async16(dst + (i * 32 + lane) * 16, src + i * 512);
        if (lane < n * RT * 2)
            cp_async16(dst + R.kCodeBytes + lane * 16,
                       reinterpret_cast<const uint8_t *>(p.wscales) + (size_t)c.u * (RT * 32) + lane * 16);
    } else {
        const int gid = lane >> 2, tq = lane & 3;
        const size_t stride = (size_t)(p.k >> 2);
        const uint16_t *scale_end = p.wscales + p.n * groups;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            // Rows past n (last row block) re-read row n-1; their results are never stored.
            const int64_t row = (int64_t)c.rb * (16 * RT) + r * 16 + gid;
            const int64_t rows[2] = {row < p.n ? row : p.n - 1, row + 8 < p.n ? row + 8 : p.n - 1};
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u >= n) continue;
                const int g = c.g + u;
                uint8_t *cd = dst + ((u * RT + r) * 32 + lane) * 16;
                cp_async8(cd, p.codes + rows[0] * stride + g * 32 + tq * 8);
                cp_async8(cd + 8, p.codes + rows[1] * stride + g * 32 + tq * 8);
                // A row's fp16 scale is only 2-byte aligned: copy the aligned word holding it and
                // pick the half when reading. The word can pass the end of the buffer only for
                // the very last scale; that one is loaded and stored synchronously.
                uint32_t *sdst = reinterpret_cast<uint32_t *>(dst + R.kCodeBytes) + ((u * RT + r) * 32 + lane) * 2;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint16_t *sp = p.wscales + rows[h] * groups + g;
                    const uint32_t *word = reinterpret_cast<const uint32_t *>((uintptr_t)sp & ~(uintptr_t)3);
                    if ((const void *)(word + 1) <= (const void *)scale_end)
                        cp_async4(sdst + h, word);
                    else
                        sdst[h] = (uint32_t)__ldg(sp);
                }
            }
        }
    }
}

// Accumulates chunk (c, n <= U units) from ring stage `stage` into acc. TOKS: 1 (m == 1: only
// C column 0 is live), 8 or 16 tokens; NT = token blocks of 8.
template <int LAYOUT, int RT, int NT, int U, int TOKS>
__device__ __forceinline__ void compute_chunk(const ring<LAYOUT, RT, U> &R, int stage, const cursor &c,
                                              int n, const pq2_decode_problem &p, const act_lane<NT> &A,
                                              int groups, int lane, float (&acc)[RT][NT][4])
{
    const int gid = lane >> 2;
    // Activations of the chunk's groups, loaded together for latency overlap: plane s of token
    // nt*8+gid (B fragment: 8 contiguous bytes at tq*8), and d_x/64, -sum(q) of the tokens of this
    // lane's C columns, nt*8+2tq+{0,1}.
    uint2 b[U][NT][4];
    float xs[U][NT][2];
    int nsum[U][NT][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int g = c.g + u;
        const bool ok = u < n;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int8_t *qp = A.q[nt] + g * 128;
#pragma unroll
            for (int s = 0; s < 4; ++s)
                b[u][nt][s] = ok && A.has_b[nt] ? __ldg(reinterpret_cast<const uint2 *>(qp + s * 32)) : make_uint2(0, 0);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const bool live = ok && A.live[nt][j];
                xs[u][nt][j] = live ? __ldg(A.xs[nt] + j * groups + g) * (1.0f / 64.0f) : 0.0f;
                nsum[u][nt][j] = live ? -__ldg(A.sums[nt] + j * groups + g) : 0;
            }
        }
    }
    const uint8_t *st = R.stage_ptr(stage);
    if constexpr (LAYOUT == PQ2_LAYOUT_TILES) __syncwarp();  // scale bytes copied by other lanes
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (u >= n) break;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const uint4 w = *reinterpret_cast<const uint4 *>(st + ((u * RT + r) * 32 + lane) * 16);
            float w_lo, w_hi;
            if constexpr (LAYOUT == PQ2_LAYOUT_TILES) {
                // rows gid (low half) and gid+8 (high half)
                const uint32_t sw = reinterpret_cast<const uint32_t *>(st + R.kCodeBytes)[(u * RT + r) * 8 + gid];
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&sw));
                w_lo = f.x, w_hi = f.y;
            } else {
                const uint32_t *sw = reinterpret_cast<const uint32_t *>(st + R.kCodeBytes) + ((u * RT + r) * 32 + lane) * 2;
                const int64_t row = (int64_t)c.rb * (16 * RT) + r * 16 + gid;
                const int64_t r0 = row < p.n ? row : p.n - 1;
                const int64_t r1 = row + 8 < p.n ? row + 8 : p.n - 1;
                const int g = c.g + u;
                // the half of the aligned word holding the scale: its fp16 index parity
                w_lo = __half2float(__ushort_as_half((unsigned short)(sw[0] >> (16 * ((r0 * groups + g) & 1)))));
                w_hi = __half2float(__ushort_as_half((unsigned short)(sw[1] >> (16 * ((r1 * groups + g) & 1)))));
            }
            // A fragment registers: {row gid, row gid+8} x {code bytes tq*8..+3, tq*8+4..+7}: the
            // order TILES stores (pq2.h); PLANES stages row gid's 8 bytes, then row gid+8's.
            const uint4 f = LAYOUT == PQ2_LAYOUT_TILES ? w : make_uint4(w.x, w.z, w.y, w.w);
            const uint32_t a0[4] = {pq2_plane<0>(f.x), pq2_plane<0>(f.y), pq2_plane<0>(f.z), pq2_plane<0>(f.w)};
            const uint32_t a1[4] = {pq2_plane<1>(f.x), pq2_plane<1>(f.y), pq2_plane<1>(f.z), pq2_plane<1>(f.w)};
            const uint32_t a2[4] = {pq2_plane<2>(f.x), pq2_plane<2>(f.y), pq2_plane<2>(f.z), pq2_plane<2>(f.w)};
            const uint32_t a3[4] = {pq2_plane<3>(f.x), pq2_plane<3>(f.y), pq2_plane<3>(f.z), pq2_plane<3>(f.w)};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int zero[4] = {0, 0, 0, 0};
                // Plane 0 starts from -sum(q): the code-minus-one offset costs nothing extra.
                const int init[4] = {nsum[u][nt][0], nsum[u][nt][1], nsum[u][nt][0], nsum[u][nt][1]};
                int d0[4], d1[4], d2[4], d3[4];
                pq2_mma_u8s8(d0, a0, b[u][nt][0].x, b[u][nt][0].y, init);
                pq2_mma_u8s8(d1, a1, b[u][nt][1].x, b[u][nt][1].y, zero);
                pq2_mma_u8s8(d2, a2, b[u][nt][2].x, b[u][nt][2].y, zero);
                pq2_mma_u8s8(d3, a3, b[u][nt][3].x, b[u][nt][3].y, zero);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (TOKS == 1 && (j & 1)) continue;  // column 1 of the lane pair: no token
                    const int v = ((d0[j] * 4 + d1[j]) * 4 + d2[j]) * 4 + d3[j];
                    const float scale = (j < 2 ? w_lo : w_hi) * xs[u][nt][j & 1];
                    acc[r][nt][j] = fmaf((float)v, scale, acc[r][nt][j]);
                }
            }
        }
    }
}

// C element j of token block nt, sub-tile r of lane `lane`: its row (in the row block) and token.
__device__ __forceinline__ int c_row(int r, int j, int lane) { return r * 16 + (lane >> 2) + (j >= 2 ? 8 : 0); }
__device__ __forceinline__ int c_tok(int nt, int j, int lane) { return nt * 8 + 2 * (lane & 3) + (j & 1); }

// Ends the accumulation of row block rb over units [seg_begin, seg_end) of warp w: a row block
// the segment covers whole is stored; otherwise the partial sums go to the warp's slot (its
// first segment: 2w, its last: 2w+1; m x 16*RT fp32 each) and the function returns true.
template <int RT, int NT>
__device__ __forceinline__ bool end_segment(const pq2_decode_problem &p, const stream_plan &sp,
                                            int32_t w, int32_t u_begin, int32_t rb,
                                            int32_t seg_begin, int32_t seg_end,
                                            const float (&acc)[RT][NT][4], int lane)
{
    constexpr int TR = 16 * RT;
    const int32_t tile_begin = rb * sp.groups, tile_end = tile_begin + sp.groups;
    const bool whole = seg_begin == tile_begin && seg_end == tile_end;
    float *mine = p.partial + (size_t)(seg_begin == u_begin ? 2 * w : 2 * w + 1) * p.m * TR;
    const int64_t row0 = (int64_t)rb * TR;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int64_t row = row0 + c_row(r, j, lane);
                const int tok = c_tok(nt, j, lane);
                if (tok >= p.m) continue;
                if (!whole) mine[(size_t)tok * TR + c_row(r, j, lane)] = acc[r][nt][j];
                else if (row < p.n) pq2_store_from_f32(p.y, (size_t)tok * p.n + row, p.y_dtype, acc[r][nt][j]);
            }
    return !whole;
}

// Counts warp w's arrival at split row block rb (its partial already written and fenced); the
// last of the row block's warps to arrive sums their partials in warp order and stores them.
template <int RT>
__device__ __forceinline__ void arrive_split(const pq2_decode_problem &p, const stream_plan &sp,
                                             int32_t rb, int lane)
{
    constexpr int TR = 16 * RT;
    const int32_t tile_begin = rb * sp.groups, tile_end = tile_begin + sp.groups;
    const int32_t w_first = owner_of(tile_begin, sp), w_last = owner_of(tile_end - 1, sp);
    unsigned last = 0;
    if (lane == 0) last = atomicAdd(p.counters + rb, 1u) == (unsigned)(w_last - w_first);
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    __threadfence();
    const bool first_inside = range_begin(w_first, sp) >= tile_begin;
    // Fixed order: warp index. Only the first contributor can have begun before the row block
    // (then it is that warp's last segment, slot 2w+1); every later one begins inside.
    const auto slot = [&](int i) {
        const int32_t cw = w_first + i;
        const int32_t cslot = cw == w_first && !first_inside ? 2 * cw + 1 : 2 * cw;
        return p.partial + (size_t)cslot * p.m * TR;
    };
    pq2_store_partial_sums(p, rb, TR, w_last - w_first + 1, slot, lane, 32);
    if (lane == 0) p.counters[rb] = 0;
}

template <int LAYOUT, int RT, int U, int TOKS>
__global__ void __launch_bounds__(256, 1) decode_kernel(const pq2_decode_problem p, const stream_plan sp)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int32_t w = blockIdx.x * warps + warp;
    const int32_t u_begin = range_begin(w, sp), u_end = range_begin(w + 1, sp);
    if (u_begin >= u_end) return;

    constexpr int NT = TOKS > 8 ? 2 : 1;
    const int groups = sp.groups, stages = sp.stages;
    ring<LAYOUT, RT, U> R{smem + (size_t)warp * stages * ring<LAYOUT, RT, U>::kStageBytes};

    cursor pc;  // producer: the next chunk to copy
    pc.u = u_begin;
    pc.rb = u_begin / groups;
    pc.g = u_begin - pc.rb * groups;
    for (int s = 0; s < stages - 1; ++s) {
        if (pc.u < u_end) {
            issue_chunk(R, s, pc, U, p, groups, lane);
            advance(pc, U, groups);
        }
        cp_async_commit();
    }
    // Launched as a programmatic dependent of the quantiser (pq2_matmul_cuda): the weight copies
    // above overlap it (and the end of the kernel before it); the activations, counters and
    // workspace are touched only after this. The next call's quantiser may launch now: it
    // waits for this grid before touching anything.
    pq2_pdl_handoff();

    act_lane<NT> A;
    {
        const int gid = lane >> 2, tq = lane & 3;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int tok_b = nt * 8 + gid, tok = nt * 8 + 2 * tq;
            A.has_b[nt] = tok_b < p.m;
            A.live[nt][0] = tok < p.m;
            A.live[nt][1] = tok + 1 < p.m && TOKS > 1;
            A.q[nt] = p.q8 + (size_t)(A.has_b[nt] ? tok_b : 0) * p.k + tq * 8;
            A.xs[nt] = p.xs + (size_t)(A.live[nt][0] ? tok : 0) * groups;
            A.sums[nt] = p.sums + (size_t)(A.live[nt][0] ? tok : 0) * groups;
        }
    }

    // Split row blocks met (at most two: the range's first and last); their arrivals are
    // counted once the whole range is done, so one fence serves both and the stream never
    // stalls on it.
    int32_t split_first = -1, split_last = -1;
    cursor cc;  // consumer
    cc.u = u_begin;
    cc.rb = u_begin / groups;
    cc.g = u_begin - cc.rb * groups;
    int stage = 0;
    while (cc.u < u_end) {
        // One segment: this row block's units in the range. Chunks are whole (unroll divides
        // groups and the ranges are cut at chunk boundaries), so the hot loop has no tails.
        const int32_t rb = cc.rb, seg_begin = cc.u;
        const int32_t seg_end = min(u_end, (rb + 1) * groups);
        float acc[RT][NT][4];
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[r][nt][j] = 0.0f;
        do {
            cp_async_wait_dyn(stages - 2);  // this lane's copies of chunk cc have landed
            // Refill the stage consumed last iteration (its values are already in registers).
            if (pc.u < u_end) {
                issue_chunk(R, stage == 0 ? stages - 1 : stage - 1, pc, U, p, groups, lane);
                advance(pc, U, groups);
            }
            cp_async_commit();
            compute_chunk<LAYOUT, RT, NT, U, TOKS>(R, stage, cc, U, p, A, groups, lane, acc);
            advance(cc, U, groups);
            stage = stage + 1 == stages ? 0 : stage + 1;
        } while (cc.u < seg_end);
        if (end_segment<RT, NT>(p, sp, w, u_begin, rb, seg_begin, seg_end, acc, lane)) {
            if (seg_begin == u_begin) split_first = rb;
            else split_last = rb;
        }
    }
    cp_async_wait<0>();
    if (split_first >= 0 || split_last >= 0) {
        __threadfence();  // this warp's partials are visible before it is counted
        __syncwarp();
        if (split_first >= 0) arrive_split<RT>(p, sp, split_first, lane);
        if (split_last >= 0) arrive_split<RT>(p, sp, split_last, lane);
    }
}

// ---- instances ------------------------------------------------------------------------------
// The compiled kernels, as a list a reviewer can read: layout x RT (sub-tiles per unit) x U
// (units per ring stage) x TOKS (1: m == 1; 8: m <= 8; 16: m <= 16). Warps, stages and blocks
// are runtime values.
#define PQ2_DECODE_INSTANCES_LRT(X, L, R) \
    X(L, R, 1, 1) X(L, R, 2, 1) X(L, R, 4, 1) X(L, R, 1, 8) X(L, R, 2, 8) X(L, R, 4, 8) \
    X(L, R, 1, 16) X(L, R, 2, 16) X(L, R, 4, 16)
#define PQ2_DECODE_INSTANCES(X)                                                                 \
    PQ2_DECODE_INSTANCES_LRT(X, PQ2_LAYOUT_TILES, 1) PQ2_DECODE_INSTANCES_LRT(X, PQ2_LAYOUT_TILES, 2) \
    PQ2_DECODE_INSTANCES_LRT(X, PQ2_LAYOUT_TILES, 4) PQ2_DECODE_INSTANCES_LRT(X, PQ2_LAYOUT_PLANES, 1) \
    PQ2_DECODE_INSTANCES_LRT(X, PQ2_LAYOUT_PLANES, 2) PQ2_DECODE_INSTANCES_LRT(X, PQ2_LAYOUT_PLANES, 4)

using decode_fn = void (*)(const pq2_decode_problem, const stream_plan);

decode_fn find_instance(int32_t layout, int32_t rt, int32_t unroll, int64_t m)
{
    const int toks = pq2_decode_tokens_class(m);
#define PQ2_MATCH(L, R, U, T) \
    if (layout == (L) && rt == (R) && unroll == (U) && toks == (T)) return decode_kernel<L, R, U, T>;
    PQ2_DECODE_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
    return nullptr;
}

size_t ring_bytes(const pq2_decode_config &cfg, int32_t layout)
{
    const size_t per_unit = (size_t)cfg.rt * 32 * (layout == PQ2_LAYOUT_TILES ? 17 : 24);
    return (size_t)cfg.warps * cfg.stages * cfg.unroll * per_unit;
}

}  // namespace

pq2_status pq2_decode_init_device(const char *fn, int max_smem_optin)
{
    // The whole ring budget is shared memory: ask for the largest carveout so that the residency
    // the occupancy query promises is what the hardware gives.
#define PQ2_ATTR(L, R, U, T)                                                                                 \
    PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(decode_kernel<L, R, U, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem_optin)); \
    PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(decode_kernel<L, R, U, T>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    PQ2_DECODE_INSTANCES(PQ2_ATTR)
#undef PQ2_ATTR
    return PQ2_OK;
}

pq2_status pq2_decode_check_shape(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                  int32_t layout_rt, int max_warps, bool coarse_rows)
{
    if (cfg.rt != 1 && cfg.rt != 2 && cfg.rt != 4)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config rt=%d is not 1, 2 or 4", fn, (int)cfg.rt);
    if (layout == PQ2_LAYOUT_TILES && !coarse_rows && cfg.rt != layout_rt)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config rt=%d must equal the tile-major layout's rt=%d", fn,
                             (int)cfg.rt, (int)layout_rt);
    if (layout == PQ2_LAYOUT_TILES && coarse_rows && (cfg.rt < layout_rt || cfg.rt % layout_rt != 0))
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config rt=%d must be a multiple of the tile-major layout's rt=%d (row-block "
                             "family)", fn, (int)cfg.rt, (int)layout_rt);
    if (cfg.warps < 1 || cfg.warps > max_warps)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config warps=%d is not in 1..%d", fn, (int)cfg.warps,
                             max_warps);
    if (cfg.unroll != 1 && cfg.unroll != 2 && cfg.unroll != 4)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config unroll=%d is not 1, 2 or 4", fn, (int)cfg.unroll);
    return PQ2_OK;
}

pq2_status pq2_decode_check_smem(const char *fn, const pq2_decode_config &cfg, size_t smem, int max_smem)
{
    if (smem > (size_t)max_smem)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: config warps=%d unroll=%d stages=%d rt=%d needs %zu bytes of shared "
                             "memory per block; the device allows %d",
                             fn, (int)cfg.warps, (int)cfg.unroll, (int)cfg.stages, (int)cfg.rt, smem, max_smem);
    return PQ2_OK;
}

pq2_status pq2_decode_check_config(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                   int32_t layout_rt, int64_t m, int64_t k, int max_smem)
{
    PQ2_CHECK(pq2_decode_check_shape(fn, cfg, layout, layout_rt, 8));
    if ((k >> 7) % cfg.unroll != 0)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config unroll=%d must divide k/128=%lld (chunks never straddle rows)",
                             fn, (int)cfg.unroll, (long long)(k >> 7));
    if (cfg.stages < 2 || cfg.stages > 8)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config stages=%d is not in 2..8", fn, (int)cfg.stages);
    if (cfg.blocks < 0)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config blocks=%d is negative", fn, (int)cfg.blocks);
    PQ2_CHECK(pq2_decode_check_smem(fn, cfg, ring_bytes(cfg, layout), max_smem));
    if (!find_instance(layout, cfg.rt, cfg.unroll, m))
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: no compiled decode kernel for layout %s rt=%d m=%lld",
                             fn, pq2_layout_name(layout), (int)cfg.rt, (long long)m);
    return PQ2_OK;
}

pq2_status pq2_decode_grid(const char *fn, pq2_decode_config *cfg, int32_t layout, int64_t m,
                           int64_t n, int64_t k, int sms, int64_t *blocks)
{
    // Every warp must own at least one chunk: the arrival count of a split row block is the
    // number of warps whose ranges meet it, and the ranges are only all non-empty when
    // total warps <= chunks.
    const int64_t units = pq2_decode_row_blocks(n, cfg->rt) * (k >> 7);
    const int64_t chunks = units / cfg->unroll;
    if (chunks < cfg->warps) cfg->warps = (int32_t)chunks;
    int64_t b = cfg->blocks;
    if (b == 0) {
        int per_sm = 0;
        PQ2_CUDA_TRY(fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                             &per_sm, find_instance(layout, cfg->rt, cfg->unroll, m), cfg->warps * 32,
                             ring_bytes(*cfg, layout)));
        if (per_sm < 1)
            return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: config warps=%d unroll=%d stages=%d does not fit on an SM",
                                 fn, (int)cfg->warps, (int)cfg->unroll, (int)cfg->stages);
        b = (int64_t)per_sm * sms;
    }
    if (b > chunks / cfg->warps) b = chunks / cfg->warps;
    if (b > INT32_MAX) b = INT32_MAX;
    *blocks = b;
    return PQ2_OK;
}

pq2_status pq2_decode_launch(const char *fn, const pq2_decode_problem &p,
                             const pq2_decode_config &cfg, int64_t blocks, bool after_kernel,
                             cudaStream_t stream)
{
    stream_plan sp;
    sp.groups = (int32_t)(p.k >> 7);
    const int64_t units = pq2_decode_row_blocks(p.n, cfg.rt) * sp.groups;
    if (units > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: n=%lld k=%lld has %lld units of 16*rt rows x 128 "
                             "columns; the decode kernels index at most 2^31-1", fn,
                             (long long)p.n, (long long)p.k, (long long)units);
    sp.units = (int32_t)units;
    sp.unroll = cfg.unroll;
    sp.chunks = (int32_t)(units / cfg.unroll);
    sp.total_warps = (int32_t)(blocks * cfg.warps);
    sp.stages = cfg.stages;
    decode_fn kernel = find_instance(p.layout, cfg.rt, cfg.unroll, p.m);
    // Programmatic dependent launch (Hopper): stream weights while the preceding kernel (the
    // quantiser) finishes; the kernel waits for it before reading activations.
    pq2_launch l((unsigned)blocks, cfg.warps * 32, ring_bytes(cfg, p.layout), stream, after_kernel);
    PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, kernel, p, sp));
    return pq2_launch_status(fn);
}
