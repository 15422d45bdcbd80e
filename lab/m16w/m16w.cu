// LAB (issue 35, batch 16; not product): a decode matmul for 9 <= m <= 16 tokens on sm_90a
// wgmma, against today's row-block kernels (220 instructions per unit at 0.43 issues per
// scheduler per cycle at m = 16: NOTES pass-limits-m1).
//
// y[m][n] = W (tiles rt 2) . Q8(x) for m <= 16, n % (64 H) == 0.
//
// One CTA per SM, NWG warpgroups. A warpgroup multiplies 64 weight rows (two rt-2 tiles; warp
// wq owns sub-tile wq & 1 of tile 2 rb + wq / 2) by all 16 tokens: per group, four
// wgmma.m64n16k32 (one per plane, code * 64 at the top of each byte), A from registers, B (the
// Q8 operand, 16 tokens x one 128-byte group) from shared memory. The CTA's B is resident: the
// whole K (or the CTA's K slice) lands once, by TMA, 2 KB per group, one mbarrier per 8 groups.
// Weights go straight from global memory into registers, D groups ahead (two 8-byte loads per
// lane: the GEMM's a_offset order, so the fragment lines up with the plane order of B). The
// wgmmas of unit i run while unit i-1 is promoted (double-buffered A fragments and int32
// results).
//
// Work split: K slices (S; CTAs c0(ks)..c0(ks+1)-1 take slice ks), within a slice stream-K over
// the units (row block, group) among its workers (warpgroups). A row block's contributors
// (pieces) write fp32 partials to [rb][ks][piece] slots; the last to arrive (a counter per row
// block, reset by it) adds them in (ks, piece) order and stores y: deterministic. A row block
// with one contributor is stored directly.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "device/codes.cuh"
#include "device/ptx.cuh"
#include "gemm/stage.cuh"

using pq2_gemm::kBias;
using pq2_gemm::make_row_scales;
using pq2_gemm::promote_one;
using pq2_gemm::row_scale;
using pq2_gemm::sk_block_of;
using pq2_gemm::sk_first_unit;
using pq2_gemm::token_bias;

namespace {

constexpr int kChunk = 8;        // groups per B mbarrier
constexpr int kMaxChunks = 32;   // groups per slice <= 256

struct m16w_problem {
    const uint8_t *codes;
    const uint16_t *wscales;
    const float *xs;
    const int32_t *sums;
    float *y;          // [m][n]
    float *partial;    // [R][S][MP][16][64]
    unsigned *counters;  // [R], zero between calls
    int n, m, G, R, S, Gs, MP;
    int QU;  // units per stream-K step (OVL: D)
};

__device__ __forceinline__ void wgmma_u8s8_n16(int (&d)[8], const uint32_t (&a)[4], uint64_t desc,
                                               bool accumulate)
{
#if PQ2_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}

// The same with D = A * B (no accumulator input: the results are outputs only, so the promotion
// of the previous unit may redefine its own registers while this one runs).
__device__ __forceinline__ void wgmma_u8s8_n16_first(int (&d)[8], const uint32_t (&a)[4],
                                                     uint64_t desc)
{
#if PQ2_WGMMA
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 0;\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]),
                   "=r"(d[6]), "=r"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#else
    (void)d, (void)a, (void)desc;
#endif
}

// First CTA of slice ks.
__device__ __forceinline__ int slice_cta0(int ks, int S, int C)
{
    return (int)((int64_t)ks * C / S);
}

// The contributors of row block rb in slice ks: workers ja..jb of the slice.
struct contrib {
    int ja, jb;
};
__device__ __forceinline__ contrib contributors(int rb, int ks, const m16w_problem &p, int C,
                                                int nwg)
{
    const int pk = (slice_cta0(ks + 1, p.S, C) - slice_cta0(ks, p.S, C)) * nwg;
    const int gq = p.Gs / p.QU;  // stream-K steps a row block
    const int64_t uk = (int64_t)p.R * gq;
    contrib c;
    c.ja = (int)sk_block_of((int64_t)rb * gq, uk, pk);
    c.jb = (int)sk_block_of((int64_t)rb * gq + gq - 1, uk, pk);
    return c;
}

// The end of a segment (row block rb of 64 H rows, this worker = piece `piece` of slice ks):
// direct store when it is the row block's only contributor, else a partial and the last one's sum.
template <int NWG, int H>
__device__ __forceinline__ void end_segment(const m16w_problem &p, int rb, int ks, int j,
                                            const float (&acc)[H][8], int wg, int wq, int lane,
                                            unsigned *lastflag)
{
    constexpr int ROWS = 64 * H, SLOT = ROWS * 16;
    const int gid = lane >> 2, tq = lane & 3, C = (int)gridDim.x;
    int total = 0, piece = 0;
    for (int s = 0; s < p.S; ++s) {
        const contrib c = contributors(rb, s, p, C, NWG);
        if (s == ks) piece = j - c.ja;
        total += c.jb - c.ja + 1;
    }
    const auto row_of = [&](int h, int i) { return 64 * h + 16 * wq + gid + 8 * ((i >> 1) & 1); };
    const auto tok_of = [&](int i) { return 8 * (i >> 2) + 2 * tq + (i & 1); };
    if (total == 1) {
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int tok = tok_of(i);
                if (tok < p.m) p.y[(size_t)tok * p.n + (size_t)rb * ROWS + row_of(h, i)] = acc[h][i];
            }
        return;
    }
    float *mine = p.partial + (((size_t)rb * p.S + ks) * p.MP + piece) * SLOT;
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
        for (int i = 0; i < 8; ++i) mine[tok_of(i) * ROWS + row_of(h, i)] = acc[h][i];
    __threadfence();
    named_barrier_sync(1 + wg, 128);
    const int t = (int)threadIdx.x & 127;
    if (t == 0) lastflag[wg] = atomicAdd(p.counters + rb, 1u) == (unsigned)(total - 1);
    named_barrier_sync(1 + wg, 128);
    if (!lastflag[wg]) return;
    __threadfence();
    constexpr int V = SLOT / 4 / 128;  // float4s per thread
    float4 v[V];
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.S; ++s) {
        const contrib c = contributors(rb, s, p, C, NWG);
        for (int q = 0; q <= c.jb - c.ja; ++q) {
            const float4 *src = reinterpret_cast<const float4 *>(
                p.partial + (((size_t)rb * p.S + s) * p.MP + q) * SLOT);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float4 x = __ldcg(src + t + 128 * e);
                v[e].x += x.x, v[e].y += x.y, v[e].z += x.z, v[e].w += x.w;
            }
        }
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {
        const int f = 4 * (t + 128 * e), tok = f / ROWS, row = f % ROWS;
        if (tok < p.m) {
            float *dst = p.y + (size_t)tok * p.n + (size_t)rb * ROWS + row;
            dst[0] = v[e].x, dst[1] = v[e].y, dst[2] = v[e].z, dst[3] = v[e].w;
        }
    }
    named_barrier_sync(1 + wg, 128);
    if (t == 0) p.counters[rb] = 0;  // ready for the next call
}

__device__ __forceinline__ void pin_u32(uint32_t &r)
{
    asm volatile("" : "+r"(r)::"memory");
}

// NWG warpgroups per CTA, D units of weights in flight per warp, H 64-row halves per row block
// (a warp holds H sub-tiles of each group: tiles 2 H rb + 2 h + wq / 2).
template <int NWG, int D, int H, bool OVL>
__global__ void __launch_bounds__(NWG * 128, 1)
    m16w_kernel(const m16w_problem p, const __grid_constant__ CUtensorMap qmap)
{
#if PQ2_WGMMA
    static_assert(!OVL || D % 2 == 0, "the set parity follows the ring slot's");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    __shared__ uint64_t bars[kMaxChunks];
    __shared__ unsigned lastflag[NWG];
    const uint32_t raw = smem_u32(smem_raw);
    uint8_t *bsm = smem_raw + (((raw + 1023) & ~1023u) - raw);
    float2 *tcs = reinterpret_cast<float2 *>(bsm + (size_t)p.Gs * 2048);
    // warp-uniform for the compiler (a broadcast): the loop below issues wgmmas
    const int tid = (int)threadIdx.x, lane = tid & 31;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    const int wq = __shfl_sync(0xffffffffu, (tid >> 5) & 3, 0);
    const int gid = lane >> 2, tq = lane & 3;
    const int C = (int)gridDim.x, c = (int)blockIdx.x;
    int ks = 0;
    while (ks + 1 < p.S && slice_cta0(ks + 1, p.S, C) <= c) ++ks;
    const int cta0 = slice_cta0(ks, p.S, C);
    const int pk = (slice_cta0(ks + 1, p.S, C) - cta0) * NWG, j = (c - cta0) * NWG + wg;
    const int64_t uk = (int64_t)p.R * p.Gs;
    // OVL: ranges in whole blocks of D units (G_s % D == 0: every segment is whole blocks)
    const int QU = p.QU;
    const int64_t ua = sk_first_unit(j, uk / QU, pk) * QU, ub = sk_first_unit(j + 1, uk / QU, pk) * QU;
    const int nu = (int)(ub - ua);
    const int G = p.G, Gs = p.Gs, gbase = ks * Gs;
    const int nchunks = (Gs + kChunk - 1) / kChunk;

    if (tid == 0) {
        for (int i = 0; i < nchunks; ++i) mbar_init(&bars[i]);
    }
    // The weight loads of unit (rb, gl), half h: sub-tile ((2 H rb + 2 h + wq / 2) G + gbase +
    // gl) 2 + wq % 2; half h + 1 is 4 G sub-tiles on. cp, sp: the lane's bytes of half 0 of the
    // next unit to load.
    const uint32_t a_off = gid * 64 + (tq & 1) * 8 + (tq >> 1) * 16;
    const size_t half_codes = (size_t)4 * G * 512, half_scales = (size_t)4 * G * 8;  // bytes, words
    int ld_rb = (int)(ua / Gs), ld_gl = (int)(ua - (int64_t)ld_rb * Gs);
    const uint8_t *cp;
    const uint32_t *sp;
    const auto set_ptrs = [&](int rb, int gl) {
        const size_t st = ((size_t)(2 * H * rb + (wq >> 1)) * G + gbase + gl) * 2 + (wq & 1);
        cp = p.codes + st * 512 + a_off;
        sp = reinterpret_cast<const uint32_t *>(p.wscales + st * 16 + 2 * gid);
    };
    set_ptrs(ld_rb, ld_gl);
    const int jump = 4 * H * G - 2 * Gs + 2;
    int ld_i = 0;
    uint2 lo[D][H], hi[D][H];
    uint32_t sc[D][H];
    const auto load = [&](uint2 (&l)[H], uint2 (&h2)[H], uint32_t (&s)[H]) {
#pragma unroll
        for (int h = 0; h < H; ++h) {
            l[h] = ld_stream8(cp + h * half_codes), h2[h] = ld_stream8(cp + h * half_codes + 32);
            s[h] = ld_stream4(sp + h * half_scales);
        }
        if constexpr (OVL) {
            // no branch (ptxas serialises wgmmas around one): the next group is two sub-tiles
            // on, the next row block's first 4 H G - 2 G_s + 2; past the range, stay
            const bool wrap = ++ld_gl == Gs;
            ld_gl = wrap ? 0 : ld_gl;
            const int dst = ++ld_i >= nu ? 0 : wrap ? jump : 2;
            cp += (size_t)dst * 512, sp += dst * 8;
        } else if (++ld_gl == Gs) {
            ld_gl = 0, ++ld_rb;
            set_ptrs(ld_rb, 0);
        } else {
            cp += 1024, sp += 16;  // the next group: two sub-tiles on
        }
    };
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (i < nu) load(lo[i], hi[i], sc[i]);
    __syncthreads();    // the barriers' initialisation
    pq2_pdl_handoff();  // the Q8 operand is the previous kernel's output
    if (tid == 0) {
        for (int ch = 0; ch < nchunks; ++ch) {
            const int g0 = ch * kChunk, g1 = min(Gs, g0 + kChunk);
            mbar_expect_tx(&bars[ch], (uint32_t)(g1 - g0) * 2048u);
            for (int g = g0; g < g1; ++g)
                tma_load_2d(&bars[ch], bsm + (size_t)g * 2048, &qmap, (gbase + g) * 128, 0);
        }
    }
    for (int e = tid; e < Gs * 16; e += NWG * 128) {
        const int gl = e >> 4, tok = e & 15;
        float xs = 0.0f;
        int bias = kBias;
        if (tok < p.m) {
            const size_t at = (size_t)tok * G + gbase + gl;
            xs = __ldg(p.xs + at), bias = token_bias(__ldg(p.sums + at));
        }
        tcs[e] = make_float2(xs, __int_as_float(bias));
    }
    __syncthreads();

    const uint32_t b0 = smem_u32(bsm), tc0 = smem_u32(tcs) + 16 * tq;
    float acc[H][8];
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[h][i] = 0.0f;
    constexpr int NB = OVL ? 2 : 1;  // A fragment and int32 result sets
    int d[NB][H][8];
    uint32_t a[NB][H][4][4];
    uint32_t scp[NB][H];  // the scale words of the unit in each set
    uint32_t bmask = 0;
    int pr_rb = (int)(ua / Gs), pr_gl = (int)(ua - (int64_t)pr_rb * Gs);

    // acc += set s's products (group gl, scale words scp[s])
    const auto promote = [&](int (&dd)[H][8], const uint32_t (&sw)[H], int gl) {
        const float4 t0 = lds_f32x4(tc0 + gl * 128), t1 = lds_f32x4(tc0 + gl * 128 + 64);
#pragma unroll
        for (int h = 0; h < H; ++h) {
#pragma unroll
            for (int q = 0; q < 8; ++q) wgmma_pin(dd[h][q]);
            row_scale w0, w1;
            make_row_scales(sw[h], w0, w1);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                const float4 t = jj ? t1 : t0;
                const int k0 = __float_as_int(t.y), k1 = __float_as_int(t.w);
                float *ac = &acc[h][4 * jj];
                const int *q = &dd[h][4 * jj];
                ac[0] = promote_one(q[0] + k0, w0, t.x, ac[0]);
                ac[1] = promote_one(q[1] + k1, w0, t.z, ac[1]);
                ac[2] = promote_one(q[2] + k0, w1, t.x, ac[2]);
                ac[3] = promote_one(q[3] + k1, w1, t.z, ac[3]);
            }
        }
    };
    const auto end_if = [&](bool end, int rb) {
        if (end) {
            end_segment<NWG, H>(p, rb, ks, j, acc, wg, wq, lane, lastflag);
#pragma unroll
            for (int h = 0; h < H; ++h)
#pragma unroll
                for (int q = 0; q < 8; ++q) acc[h][q] = 0.0f;
        }
    };
    // unit i (ring slot jd) into set s: A fragments, wgmmas issued and committed
    const auto issue = [&](int jd, int s) {
        if constexpr (!OVL) {
            const unsigned ch = (unsigned)pr_gl / kChunk;
            if (!((bmask >> ch) & 1u)) {
                mbar_wait(&bars[ch], 0);
                bmask |= 1u << ch;
            }
        }
#pragma unroll
        for (int h = 0; h < H; ++h) {
            plane_fragments<true>(make_uint4(lo[jd][h].x, lo[jd][h].y, hi[jd][h].x, hi[jd][h].y),
                                  a[s][h]);
#pragma unroll
            for (int k = 0; k < 4; ++k)
#pragma unroll
                for (int r = 0; r < 4; ++r) pin_u32(a[s][h][k][r]);
            scp[s][h] = sc[jd][h];
        }
        // OVL: pr_gl moves on once a block, unit jd of the block is group pr_gl + jd
        const uint32_t gl = (uint32_t)pr_gl + (OVL ? (uint32_t)jd : 0u);
        const uint64_t desc = wgmma_desc_sw128(b0 + gl * 2048u);
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < H; ++h) {
            wgmma_u8s8_n16_first(d[s][h], a[s][h][0], desc);
#pragma unroll
            for (int k = 1; k < 4; ++k) wgmma_u8s8_n16(d[s][h], a[s][h][k], desc + 2 * k, true);
        }
        wgmma_commit();
    };
    // keeps set s's A fragments alive until its wgmmas have retired (the registers are read
    // asynchronously: without this the compiler may reuse them, and ptxas serialises)
    const auto hold_a = [&](int s) {
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
            for (int k = 0; k < 4; ++k)
#pragma unroll
                for (int r = 0; r < 4; ++r) pin_u32(a[s][h][k][r]);
    };

    if constexpr (!OVL) {
        for (int i0 = 0; i0 < nu; i0 += D) {
#pragma unroll
            for (int jd = 0; jd < D; ++jd) {
                const int i = i0 + jd;
                if (i >= nu) break;
                issue(jd, 0);
                if (i + D < nu) load(lo[jd], hi[jd], sc[jd]);
                wgmma_wait<0>();
                hold_a(0);
                promote(d[0], scp[0], pr_gl);
                end_if(pr_gl == Gs - 1 || i == nu - 1, pr_rb);
                if (++pr_gl == Gs) pr_gl = 0, ++pr_rb;
            }
        }
        // every B copy has landed before the CTA exits (a range may not need every chunk)
        for (int ch = 0; ch < nchunks; ++ch)
            if (!((bmask >> ch) & 1u)) mbar_wait(&bars[ch], 0);
    } else {
        // unit i's wgmmas run while unit i - 1 is promoted; nothing between a commit and the
        // wait that retires it branches. Segments are whole blocks of D units; each ends with a
        // drain (wait for all), its last promotion and its end. Every B chunk has landed first.
        for (int ch = 0; ch < nchunks; ++ch) mbar_wait(&bars[ch], 0);
        int i = 0;
        while (i < nu) {
            const int seg_end = min(nu, i + (Gs - pr_gl));
            for (; i < seg_end; i += D) {
                // a block of D units: unit jd's wgmmas run while unit jd - 1 is promoted; all
                // retired before the block ends (ptxas serialises wgmmas left in flight across
                // a loop's back edge)
                issue(0, 0);
#pragma unroll
                for (int jd = 1; jd < D; ++jd) {
                    issue(jd, jd & 1);
                    load(lo[jd - 1], hi[jd - 1], sc[jd - 1]);
                    wgmma_wait<1>();
                    hold_a((jd - 1) & 1);
                    promote(d[(jd - 1) & 1], scp[(jd - 1) & 1], pr_gl + jd - 1);
                }
                load(lo[D - 1], hi[D - 1], sc[D - 1]);
                wgmma_wait<0>();
                hold_a((D - 1) & 1);
                promote(d[(D - 1) & 1], scp[(D - 1) & 1], pr_gl + D - 1);
                pr_gl += D;
            }
            end_segment<NWG, H>(p, pr_rb, ks, j, acc, wg, wq, lane, lastflag);
#pragma unroll
            for (int h = 0; h < H; ++h)
#pragma unroll
                for (int q = 0; q < 8; ++q) acc[h][q] = 0.0f;
            if (pr_gl == Gs) pr_gl = 0, ++pr_rb;
        }
    }
#else
    (void)p, (void)qmap;
    __trap();
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 encoder()
{
    static PFN_cuTensorMapEncodeTiled_v12000 f = [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            fn = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    return f;
}

int max_pieces(int R, int Gs, int pk)
{
    const int64_t uk = (int64_t)R * Gs;
    int mp = 1;
    for (int rb = 0; rb < R; ++rb) {
        const int64_t a = ((int64_t)rb * Gs + 1) * pk + uk - 1, b = ((int64_t)rb * Gs + Gs) * pk + uk - 1;
        const int ja = (int)(a / uk - 1), jb = (int)(b / uk - 1);
        mp = jb - ja + 1 > mp ? jb - ja + 1 : mp;
    }
    return mp;
}

template <int NWG, int D, int H, bool OVL> int launch_t(const m16w_problem &p, const CUtensorMap &map, int ctas,
                                       size_t smem, cudaStream_t st)
{
    auto k = m16w_kernel<NWG, D, H, OVL>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess)
        return 11;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)ctas);
    cfg.blockDim = dim3(NWG * 128);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, p, map) == cudaSuccess ? 0 : 12;
}

}  // namespace

extern "C" {

// Workspace bytes: partial slots then counters (the counters must be zero before the first call).
// S: K slices (G % S == 0), ctas: CTAs (one per SM).
long long m16w_workspace(int n, int k, int S, int ctas, int nwg, int halves, int qu,
                         long long *counters_at)
{
    const int G = k / 128, R = n / (64 * halves), Gs = G / S / qu;
    int mp = 1;
    for (int ks = 0; ks < S; ++ks) {
        const int c0 = (int)((int64_t)ks * ctas / S), c1 = (int)((int64_t)(ks + 1) * ctas / S);
        const int m = max_pieces(R, Gs, (c1 - c0) * nwg);
        mp = m > mp ? m : mp;
    }
    const long long part = (long long)R * S * mp * 64 * halves * 16 * 4;
    *counters_at = part;
    return part + (long long)R * 4 + 256;
}

int m16w_run(const uint8_t *w, int n, int k, const int8_t *q8, const float *xs,
             const int32_t *sums, int m, float *y, void *ws, int S, int ctas, int nwg, int depth,
             int halves, int ovl, void *stream)
{
    if (halves < 1 || halves > 2 || n % (64 * halves) || k % 128 || m < 1 || m > 16) return 1;
    const int G = k / 128;
    if (G % S) return 2;
    const int Gs = G / S;
    if (Gs > kChunk * kMaxChunks || 1024 + (size_t)Gs * 2176 > 227 * 1024) return 3;
    const int R = n / (64 * halves);
    long long cat = 0;
    const int qu = ovl ? depth : 1;
    if (ovl && Gs % depth) return 8;
    m16w_workspace(n, k, S, ctas, nwg, halves, qu, &cat);
    int mp = 1;
    for (int ks = 0; ks < S; ++ks) {
        const int c0 = (int)((int64_t)ks * ctas / S), c1 = (int)((int64_t)(ks + 1) * ctas / S);
        if ((int64_t)R * (Gs / qu) < (int64_t)(c1 - c0) * nwg) return 4;  // an empty worker
        const int mm = max_pieces(R, Gs / qu, (c1 - c0) * nwg);
        mp = mm > mp ? mm : mp;
    }
    m16w_problem p;
    p.codes = w;
    p.wscales = reinterpret_cast<const uint16_t *>(w + (size_t)n * k / 4);
    p.xs = xs, p.sums = sums, p.y = y;
    p.partial = reinterpret_cast<float *>(ws);
    p.counters = reinterpret_cast<unsigned *>(reinterpret_cast<uint8_t *>(ws) + cat);
    p.n = n, p.m = m, p.G = G, p.R = R, p.S = S, p.Gs = Gs, p.MP = mp, p.QU = qu;
    CUtensorMap map;
    const PFN_cuTensorMapEncodeTiled_v12000 enc = encoder();
    if (!enc) return 5;
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)m}, strides[1] = {(cuuint64_t)k};
    const cuuint32_t box[2] = {128, 16}, step[2] = {1, 1};
    if (enc(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<int8_t *>(q8), dims, strides, box,
            step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return 6;
    const size_t smem = 1024 + (size_t)Gs * 2048 + (size_t)Gs * 128;
    cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    switch (ovl * 10000 + halves * 1000 + nwg * 100 + depth) {
    case 1402: return launch_t<4, 2, 1, false>(p, map, ctas, smem, st);
    case 1404: return launch_t<4, 4, 1, false>(p, map, ctas, smem, st);
    case 1304: return launch_t<3, 4, 1, false>(p, map, ctas, smem, st);
    case 2402: return launch_t<4, 2, 2, false>(p, map, ctas, smem, st);
    case 2404: return launch_t<4, 4, 2, false>(p, map, ctas, smem, st);
    case 2304: return launch_t<3, 4, 2, false>(p, map, ctas, smem, st);
    case 11402: return launch_t<4, 2, 1, true>(p, map, ctas, smem, st);
    case 11404: return launch_t<4, 4, 1, true>(p, map, ctas, smem, st);
    case 11304: return launch_t<3, 4, 1, true>(p, map, ctas, smem, st);
    case 11204: return launch_t<2, 4, 1, true>(p, map, ctas, smem, st);
    case 11208: return launch_t<2, 8, 1, true>(p, map, ctas, smem, st);
    case 12304: return launch_t<3, 4, 2, true>(p, map, ctas, smem, st);
    case 12302: return launch_t<3, 2, 2, true>(p, map, ctas, smem, st);
    case 12204: return launch_t<2, 4, 2, true>(p, map, ctas, smem, st);
    case 12208: return launch_t<2, 8, 2, true>(p, map, ctas, smem, st);
    default: return 7;
    }
}

}  // extern "C"
