// decode_rowblock.cu - the row-block decode family (TILES layout, M = 1..16): one block per row
// block of 16*RT rows, its warps splitting the row block's 128-groups, codes loaded straight
// into registers, partial sums reduced in shared memory in warp order.
//
// Why a second family (bench/NOTES.md, v7): the stream-K family (decode.cu) spends ~104
// warp-instructions per 512-byte sub-tile (cp.async ring, split-row protocol, 64-bit address
// math) with 8-24 warps per SM; at the H200's 18 bytes per SM clock the SM can issue ~60-100.
// Here a sub-tile costs one 16-byte load, 16 mask ops, 4 MMAs and the C-register arithmetic
// (~40 at M = 1), and occupancy, not a ring, hides the memory latency.
//
// Arithmetic: as decode.cu (masked-plane MMA, plane 0 started from -sum(q)). The B fragment of
// lane (gid, tq) carries token min(gid, m-1): with m < 8 the surplus columns repeat the last
// token instead of being predicated off, so the hot loop has no token tests; C columns >= m are
// never stored.
//
// Work split: warp w of the block takes groups [w*G/W, (w+1)*G/W) of row block blockIdx.x,
// contiguous in the tile-major stream, in batches of U units (the last one shorter). STAGES 2:
// the next batch's codes and scales load while the current one computes (two register sets);
// STAGES 1: load, then compute. The first batch's loads are issued before the programmatic-
// dependent-launch wait, so weight streaming overlaps the quantiser.
#include "decode.cuh"

namespace {

// 16 bytes read once: no L1 allocation.
__device__ __forceinline__ uint4 ld_stream16(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
// Asks L2 to fetch [p, p + bytes) from memory (16-byte aligned, multiple of 16); no completion.
__device__ __forceinline__ void prefetch_l2(const void *p, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

__device__ __forceinline__ uint32_t ld_stream4(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// The weight bytes of up to U units for one lane: per sub-tile its 16 code bytes and the scale
// word of rows gid (low half) and gid+8 (high half).
template <int RT, int U>
struct batch {
    uint4 codes[U][RT];
    uint32_t scales[U][RT];
};

// Loads units [0, n) of a batch starting at unit pointer `codes` (already + lane*16) and scale
// word pointer `scales` (already + gid). Units are RT*512 code bytes and RT*8 scale words apart.
template <int RT, int U>
__device__ __forceinline__ void load_batch(batch<RT, U> &b, const uint8_t *codes, const uint32_t *scales, int n)
{
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RT; ++r)
            if (u < n) {
                b.codes[u][r] = ld_stream16(codes + (u * RT + r) * 512);
                b.scales[u][r] = ld_stream4(scales + (u * RT + r) * 8);
            }
}

// Per-lane activation addressing: B fragments of token min(nt*8+gid, m-1) and d_x, sums of the
// tokens of this lane's C columns, min(nt*8+2tq+j, m-1).
template <int NT, int NJ>
struct act_ptrs {
    const int8_t *q[NT];       // + tq*8
    const float *xs[NT][NJ];   // [g]
    const int32_t *sums[NT][NJ];
};

// Accumulates units [0, n) of batch b (groups g0, g0+1, ...) into acc.
template <int RT, int U, int NT, int TOKS>
__device__ __forceinline__ void compute_batch(const batch<RT, U> &b, int g0, int n,
                                              const act_ptrs<NT, TOKS == 1 ? 1 : 2> &A,
                                              float (&acc)[RT][NT][4])
{
    constexpr int NJ = TOKS == 1 ? 1 : 2;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (u >= n) break;
        const int g = g0 + u;
        uint2 bq[NT][4];
        float xs[NT][NJ];
        int ns[NT][NJ];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int s = 0; s < 4; ++s) bq[nt][s] = __ldg(reinterpret_cast<const uint2 *>(A.q[nt] + g * 128 + s * 32));
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                xs[nt][j] = __ldg(A.xs[nt][j] + g) * (1.0f / 64.0f);
                ns[nt][j] = -__ldg(A.sums[nt][j] + g);
            }
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const uint4 w = b.codes[u][r];
            const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&b.scales[u][r]));
            // A fragment registers: {row gid, row gid+8} x {code bytes tq*8..+3, tq*8+4..+7}.
            const uint32_t a0[4] = {pq2_plane<0>(w.x), pq2_plane<0>(w.z), pq2_plane<0>(w.y), pq2_plane<0>(w.w)};
            const uint32_t a1[4] = {pq2_plane<1>(w.x), pq2_plane<1>(w.z), pq2_plane<1>(w.y), pq2_plane<1>(w.w)};
            const uint32_t a2[4] = {pq2_plane<2>(w.x), pq2_plane<2>(w.z), pq2_plane<2>(w.y), pq2_plane<2>(w.w)};
            const uint32_t a3[4] = {pq2_plane<3>(w.x), pq2_plane<3>(w.z), pq2_plane<3>(w.y), pq2_plane<3>(w.w)};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int zero[4] = {0, 0, 0, 0};
                const int init[4] = {ns[nt][0], ns[nt][NJ - 1], ns[nt][0], ns[nt][NJ - 1]};
                int d0[4], d1[4], d2[4], d3[4];
                pq2_mma_u8s8(d0, a0, bq[nt][0].x, bq[nt][0].y, init);
                pq2_mma_u8s8(d1, a1, bq[nt][1].x, bq[nt][1].y, zero);
                pq2_mma_u8s8(d2, a2, bq[nt][2].x, bq[nt][2].y, zero);
                pq2_mma_u8s8(d3, a3, bq[nt][3].x, bq[nt][3].y, zero);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (TOKS == 1 && (j & 1)) continue;  // m == 1: column 2tq only
                    const int v = ((d0[j] * 4 + d1[j]) * 4 + d2[j]) * 4 + d3[j];
                    const float scale = (j < 2 ? wf.x : wf.y) * xs[nt][NJ == 1 ? 0 : (j & 1)];
                    acc[r][nt][j] = fmaf((float)v, scale, acc[r][nt][j]);
                }
            }
        }
    }
}

template <int RT, int U, int TOKS, int STAGES>
__global__ void __launch_bounds__(512) rowblock_kernel(const pq2_decode_problem p)
{
    extern __shared__ __align__(16) float red[];  // [warp][r][nt][j][lane]
    constexpr int NT = TOKS > 8 ? 2 : 1;
    constexpr int NJ = TOKS == 1 ? 1 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int gid = lane >> 2, tq = lane & 3;
    const int G = (int)(p.k >> 7);
    const int rb = blockIdx.x;
    const int g_begin = (int)((int64_t)warp * G / warps), g_end = (int)((int64_t)(warp + 1) * G / warps);
    const int len = g_end - g_begin;

    const size_t unit0 = (size_t)rb * G + g_begin;
    const uint8_t *codes = p.codes + unit0 * (RT * 512) + lane * 16;
    const uint32_t *scales = reinterpret_cast<const uint32_t *>(p.wscales) + unit0 * (RT * 8) + gid;

    if (p.prefetch && lane == 0 && len > 0) {
        // The whole of this warp's weights (and, mode 2, the same slice of the row block one
        // resident wave ahead) head for L2 now: the memory queue fills at once instead of one
        // register batch per warp at a time.
        const uint8_t *scale_bytes = reinterpret_cast<const uint8_t *>(p.wscales);
        prefetch_l2(p.codes + unit0 * (RT * 512), (uint32_t)len * (RT * 512));
        prefetch_l2(scale_bytes + unit0 * (RT * 32), (uint32_t)len * (RT * 32));
        const int64_t rb_ahead = (int64_t)rb + p.ahead;
        if (p.prefetch == 2 && rb_ahead < gridDim.x) {
            const size_t unit_ahead = (size_t)rb_ahead * G + g_begin;
            prefetch_l2(p.codes + unit_ahead * (RT * 512), (uint32_t)len * (RT * 512));
            prefetch_l2(scale_bytes + unit_ahead * (RT * 32), (uint32_t)len * (RT * 32));
        }
    }
    batch<RT, U> b0, b1;
    if (len > 0) load_batch<RT, U>(b0, codes, scales, min(len, U));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Launched as a programmatic dependent of the quantiser: the loads above overlap it; the
    // activations are read and y written only after this wait. The next call's quantiser may
    // launch now (it waits for this grid before touching anything).
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif

    act_ptrs<NT, NJ> A;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        A.q[nt] = p.q8 + (size_t)min(nt * 8 + gid, p.m - 1) * p.k + tq * 8;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int tok = min(nt * 8 + 2 * tq + j, p.m - 1);
            A.xs[nt][j] = p.xs + (size_t)tok * G;
            A.sums[nt][j] = p.sums + (size_t)tok * G;
        }
    }

    float acc[RT][NT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][nt][j] = 0.0f;

    constexpr int kBatchCodes = U * RT * 512, kBatchScales = U * RT * 8;
    if constexpr (STAGES == 1) {
        for (int i = 0; i < len; i += U) {
            if (i > 0) load_batch<RT, U>(b0, codes + (size_t)i * (RT * 512), scales + i * (RT * 8), min(len - i, U));
            compute_batch<RT, U, NT, TOKS>(b0, g_begin + i, min(len - i, U), A, acc);
        }
    } else {
        // Ping-pong between two register sets: no copies between iterations.
        for (int i = 0; i < len; i += 2 * U) {
            if (i + U < len)
                load_batch<RT, U>(b1, codes + (size_t)(i + U) * (RT * 512), scales + (i + U) * (RT * 8), min(len - i - U, U));
            compute_batch<RT, U, NT, TOKS>(b0, g_begin + i, min(len - i, U), A, acc);
            if (i + U >= len) break;
            if (i + 2 * U < len)
                load_batch<RT, U>(b0, codes + (size_t)(i + 2 * U) * (RT * 512), scales + (i + 2 * U) * (RT * 8),
                                  min(len - i - 2 * U, U));
            compute_batch<RT, U, NT, TOKS>(b1, g_begin + i + U, min(len - i - U, U), A, acc);
        }
    }
    (void)kBatchCodes, (void)kBatchScales;

    // Reduction over the block's warps in warp order (deterministic).
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
    for (int e = threadIdx.x; e < outputs; e += blockDim.x) {
        const int tok = e / TR, row = e - tok * TR;
        const int64_t n_row = (int64_t)rb * TR + row;
        if (n_row >= p.n) continue;
        // Where C element (row, tok) lives: sub-tile r, lane (gid, tq), register j.
        const int r = row >> 4, rr = row & 15, nt = tok >> 3, c = tok & 7;
        const int src = ((r * NT + nt) * 4 + (rr >> 3) * 2 + (c & 1)) * 32 + (rr & 7) * 4 + (c >> 1);
        float v = 0.0f;
        for (int w = 0; w < warps; ++w) v += red[w * (RT * NT * 128) + src];
        pq2_store_from_f32(p.y, (size_t)tok * p.n + n_row, p.y_dtype, v);
    }
}

// ---- instances ------------------------------------------------------------------------------
// RT (sub-tiles per unit, = the layout's rt) x U (units per batch) x TOKS (1: m == 1; 8: m <= 8;
// 16: m <= 16) x STAGES (1: load then compute; 2: next batch loads during this one). Only the
// combinations ptxas compiles without spills (tools/ptxas_report.py; batches of at most 4
// sub-tiles); rt 4 serves m <= 8 (larger m goes to the stream family).
#define PQ2_ROWBLOCK_ALL_TOKS(X, R, U) X(R, U, 1, 1) X(R, U, 8, 1) X(R, U, 16, 1) X(R, U, 1, 2) X(R, U, 8, 2) X(R, U, 16, 2)
#define PQ2_ROWBLOCK_LEAN_16(X, R, U) X(R, U, 1, 1) X(R, U, 8, 1) X(R, U, 16, 1) X(R, U, 1, 2) X(R, U, 8, 2)
#define PQ2_ROWBLOCK_TO_8(X, R, U) X(R, U, 1, 1) X(R, U, 8, 1) X(R, U, 1, 2) X(R, U, 8, 2)
#define PQ2_ROWBLOCK_INSTANCES(X)                                                       \
    PQ2_ROWBLOCK_ALL_TOKS(X, 1, 1) PQ2_ROWBLOCK_ALL_TOKS(X, 1, 2) PQ2_ROWBLOCK_LEAN_16(X, 1, 4) \
    PQ2_ROWBLOCK_LEAN_16(X, 2, 1) PQ2_ROWBLOCK_LEAN_16(X, 2, 2) PQ2_ROWBLOCK_TO_8(X, 4, 1)

using rowblock_fn = void (*)(const pq2_decode_problem);

rowblock_fn find_rowblock(int32_t rt, int32_t unroll, int64_t m, int32_t stages)
{
    const int toks = m == 1 ? 1 : m <= 8 ? 8 : 16;
#define PQ2_MATCH(R, U, T, S) \
    if (rt == (R) && unroll == (U) && toks == (T) && stages == (S)) return rowblock_kernel<R, U, T, S>;
    PQ2_ROWBLOCK_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
    return nullptr;
}

}  // namespace

size_t pq2_rowblock_smem(const pq2_decode_config &cfg, int64_t m)
{
    const int nt = m > 8 ? 2 : 1;
    return (size_t)cfg.warps * cfg.rt * nt * 128 * sizeof(float);
}

pq2_status pq2_rowblock_check_config(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                     int32_t layout_rt, int64_t m)
{
    if (layout != PQ2_LAYOUT_TILES)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: config family=%d (row block) reads the tiles layout only",
                             fn, (int)cfg.family);
    if (cfg.rt != layout_rt)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config rt=%d must equal the tile-major layout's rt=%d", fn,
                             (int)cfg.rt, (int)layout_rt);
    if (cfg.warps < 1 || cfg.warps > 16)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config warps=%d is not in 1..16 (row block family)",
                             fn, (int)cfg.warps);
    if (cfg.unroll != 1 && cfg.unroll != 2 && cfg.unroll != 4)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config unroll=%d is not 1, 2 or 4", fn, (int)cfg.unroll);
    if (cfg.stages != 1 && cfg.stages != 2)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config stages=%d is not 1 or 2 (row block family: register batches)", fn,
                             (int)cfg.stages);
    if (cfg.prefetch < 0 || cfg.prefetch > 2)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config prefetch=%d is not 0, 1 or 2", fn,
                             (int)cfg.prefetch);
    if (cfg.blocks != 0)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config blocks=%d must be 0 for the row block family (one block per row block)",
                             fn, (int)cfg.blocks);
    if (!find_rowblock(cfg.rt, cfg.unroll, m, cfg.stages))
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: no compiled row-block kernel for rt=%d unroll=%d m=%lld",
                             fn, (int)cfg.rt, (int)cfg.unroll, (long long)m);
    return PQ2_OK;
}

pq2_status pq2_rowblock_init_device(const char *fn)
{
#define PQ2_ATTR(R, U, T, S) \
    PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(rowblock_kernel<R, U, T, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * 4 * 2 * 128 * 4));
    PQ2_ROWBLOCK_INSTANCES(PQ2_ATTR)
#undef PQ2_ATTR
    return PQ2_OK;
}

pq2_status pq2_rowblock_resident(const char *fn, const pq2_decode_config &cfg, int64_t m, int sms,
                                 int64_t *resident)
{
    int per_sm = 0;
    PQ2_CUDA_TRY(fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                         &per_sm, find_rowblock(cfg.rt, cfg.unroll, m, cfg.stages), cfg.warps * 32,
                         pq2_rowblock_smem(cfg, m)));
    if (per_sm < 1)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: row-block config warps=%d rt=%d unroll=%d does not fit on an SM",
                             fn, (int)cfg.warps, (int)cfg.rt, (int)cfg.unroll);
    *resident = (int64_t)per_sm * sms;
    return PQ2_OK;
}

pq2_status pq2_rowblock_launch(const char *fn, const pq2_decode_problem &p, const pq2_decode_config &cfg,
                               bool after_kernel, cudaStream_t stream)
{
    const int64_t blocks = pq2_decode_row_blocks(p.n, cfg.rt);
    if (blocks > INT32_MAX || p.k / 128 * blocks > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: n=%lld k=%lld: too many row blocks for one grid", fn,
                             (long long)p.n, (long long)p.k);
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)blocks);
    lc.blockDim = dim3(cfg.warps * 32);
    lc.dynamicSmemBytes = pq2_rowblock_smem(cfg, p.m);
    lc.stream = stream;
    cudaLaunchAttribute attr[1];
    if (after_kernel) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        lc.attrs = attr;
        lc.numAttrs = 1;
    }
    PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&lc, find_rowblock(cfg.rt, cfg.unroll, p.m, cfg.stages), p));
    return pq2_launch_status(fn);
}
