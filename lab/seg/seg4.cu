// seg4.cu - lab prototype for issue 36, the fourth form (not product). What the H100 run of
// seg.cu (NOTES: segment-stream-v3-measured) said binds, taken on:
// - bytes in flight: each matrix is cut into KS K-slices (row blocks x groups of one slice,
//   slice-major), so a CTA's operand is at most two slices' groups (<= 48 here) and the ring gets
//   ~174 KB; and the producer lane also prefetches into L2 the piece PF slots ahead of the one it
//   copies (cp.async.bulk.prefetch.L2), so more bytes are in flight than the ring holds;
// - fixed-order sums without a barrier a slot: a slot is one "piece", the CTA's run inside one
//   (slice, row block), at most SC = 40 units; each warp sums its share of the piece, writes it to
//   the slot's partial buffer and counts itself in; the last warp adds the NW partials in warp
//   order and releases the slot. A piece that is a whole row block of a one-slice matrix is stored
//   to y; any other is one contribution of its row block (index slice * 2 + side), written to a
//   workspace, and the row block's last contributor (an arrival counter a row block, never reset)
//   adds them in index order.
// - the producers inside (modes 5 = 2 and 6 = 0 with them): the static inputs (signs, norm weight)
//   of the CTA's tiles are loaded into registers before the dependency wait, every dynamic load
//   (the row for the RMSNorm's sum, the CTA's tiles of x and x2) is issued at once after it, and
//   only the 1024-element tiles that cover the CTA's groups are rotated and quantised, with the
//   product's arithmetic (producers.cuh), into the operand region.
// Modes: 0 no dependency, 2 the real one, 3 copies only, 4 = 2 + a spin of spin_ns.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "device/ptx.cuh"
#include "producers.cuh"
#include "rowblock/activations.cuh"

struct Seg4Mat {
    const uint8_t *codes, *scales;  // tiles rt 2
    const uint4 *xbits;             // [G][32]
    const float *xs;                // [G]
    const int *sums;                // [G]
    float *y;                       // [N]
    float *ws;                      // [rbs][2 KS][32] contributions
    unsigned *cnt;                  // [rbs] arrivals
    long long units;                // rbs * G
    int G, rbs, KS, Gs;             // Gs = G / KS groups a slice
    seg_prod prod;                  // modes 5, 6
};

struct Seg4Params {
    const Seg4Mat *mats;
    int nmat;
    unsigned *counters, *epochs;
    unsigned long long *stamps;  // [grid][nmat][4] or null
    int mode, spin_ns, slots, pf, gop;  // gop: operand groups the region holds
};

constexpr int kSC = 40;  // units a slot at most (>= every Gs)
// The producer's passes at most: the operand's tiles (<= 6 here: 48 groups) over the 256-thread
// groups of NW warps.
template <int NW> constexpr int kMaxPasses = (6 + NW / 8 - 1) / (NW / 8);
constexpr int kUnitCodes = 1024, kUnitScales = 64, kUnitBytes = kUnitCodes + kUnitScales;
constexpr int kSlotBytes = kSC * kUnitBytes;

__device__ __forceinline__ unsigned long long gtimer4()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned ld_acquire4(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void prefetch_l2(const void *p, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ void copy_hint(uint64_t *bar, void *dst, const void *src, uint32_t bytes,
                                          uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
                 : "memory");
}

// A CTA's walk through its pieces: matrix j's flat units [u0, u1) in slice-major order
// (f = ks * rbs * Gs + rb * Gs + gl), cut at every (slice, row block) edge.
struct piece {
    int ks, rb, gl, n;
};
struct walker {
    const Seg4Mat *mats;
    int nmat, c, P, j;
    long long f, u1;
    __device__ void start(int jj)
    {
        j = jj;
        if (j >= nmat) return;
        const long long U = mats[j].units;
        f = U * c / P, u1 = U * (c + 1) / P;
    }
    // The next piece, moving on to later matrices when this one is done; false past the last.
    __device__ bool next(piece &pc, int &jj)
    {
        while (j < nmat && f >= u1) start(j + 1);
        if (j >= nmat) return false;
        const Seg4Mat &m = mats[j];
        const long long slice = (long long)m.rbs * m.Gs;
        pc.ks = (int)(f / slice);
        const long long r = f - pc.ks * slice;
        pc.rb = (int)(r / m.Gs);
        pc.gl = (int)(r - (long long)pc.rb * m.Gs);
        pc.n = (int)min((long long)(m.Gs - pc.gl), u1 - f);
        jj = j;
        f += pc.n;
        return true;
    }
};

__device__ __forceinline__ long long cta_start(long long U, int c, int P)
{
    return U * c / P;
}

// Whether a CTA's range starts strictly inside the piece [a, a + Gs) (at most one does: every
// CTA's range holds at least Gs units, checked by the plan).
__device__ __forceinline__ bool cut_inside(long long U, int P, long long a, int Gs)
{
    long long c = (a + 1) * P / U;
    while (c < P && cta_start(U, (int)c, P) <= a) ++c;
    return c < P && cta_start(U, (int)c, P) < a + Gs;
}

// The producer's registers for the CTA's tiles [t0, t1): thread T of 256-thread group grp takes
// tiles t0 + grp, t0 + grp + groups, ... (at most MAXP), elements 4 (T % 256) .. + 3 of each.
template <int MAXP> struct prod_regs {
    char4 s[MAXP];
    float4 w[MAXP];
    uint2 x[MAXP], x2[MAXP];
    uint2 rx[8], rr[8];  // NORM, the first 256 threads: the whole row (at most 8 tiles)
};

// Before the dependency wait: the static inputs (signs; the norm weight).
template <int MAXP>
__device__ __forceinline__ void produce_static(const seg_prod &pd, int t0, int t1, int groups,
                                               prod_regs<MAXP> &r)
{
    const int T = threadIdx.x, t = T & 255, grp = T >> 8;
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        const int tile = min(t0 + grp + i * groups, t1 - 1);
        const int e = tile * 1024 + 4 * t;
        r.s[i] = *reinterpret_cast<const char4 *>(pd.signs + e);
        if (pd.kind == SEG_NORM) r.w[i] = *reinterpret_cast<const float4 *>(pd.w + e);
    }
}

// After it: every dynamic load at once, then the tiles. The RMSNorm's sum as the product's
// 256-thread block takes it (threads 0-255, tile by tile, fmaf), so the same bits.
template <int MAXP>
__device__ __forceinline__ void produce_tiles(const seg_prod &pd, int G, int t0, int t1, int g0,
                                              int nthr, prod_regs<MAXP> &r, float *xch, float *red,
                                              uint4 *act_xb, float *act_xs, int *act_sums,
                                              bool first_cta)
{
    const int T = threadIdx.x, t = T & 255, grp = T >> 8, groups = nthr >> 8;
    const int width = G * 128, tiles = width >> 10;
    const uint2 *x = static_cast<const uint2 *>(pd.x), *x2 = static_cast<const uint2 *>(pd.x2);
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        const int tile = min(t0 + grp + i * groups, t1 - 1);
        const int e4 = (tile * 1024 + 4 * t) >> 2;  // in 4-element (8-byte) units
        r.x[i] = __ldcg(x + e4);
        if (pd.kind != SEG_ROTATE) r.x2[i] = __ldcg(x2 + e4);
    }
    float scale = 0.0f;
    if (pd.kind == SEG_NORM) {
        if (grp == 0) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int e4 = (min(u, tiles - 1) * 1024 + 4 * t) >> 2;
                r.rx[u] = __ldcg(x + e4), r.rr[u] = __ldcg(x2 + e4);
            }
            float ss = 0.0f;
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                if (u >= tiles) break;
                float h[4], q[4];
                pq2_load4<PQ2_DTYPE_BF16>(&r.rx[u], h);
                pq2_load4<PQ2_DTYPE_BF16>(&r.rr[u], q);
#pragma unroll
                for (int j = 0; j < 4; ++j) h[j] += q[j];
#pragma unroll
                for (int j = 0; j < 4; ++j) ss = fmaf(h[j], h[j], ss);
                if (first_cta && pd.h_out) pq2_store4(pd.h_out, PQ2_DTYPE_BF16, u * 1024 + 4 * t, h);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if ((T & 31) == 0) red[T >> 5] = ss;
        }
        named_barrier_sync(1, nthr);
        float s = 0.0f;
        for (int w = 0; w < 8; ++w) s += red[w];
        scale = 1.0f / sqrtf(s / (float)width + pd.eps);
    }
    const int passes = (t1 - t0 + groups - 1) / groups;  // the same in every thread
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        if (i >= passes) break;
        const int tile = t0 + grp + i * groups;
        const bool live = tile < t1;
        float v[4];
        if (pd.kind == SEG_NORM) {
            float h[4], q[4];
            pq2_load4<PQ2_DTYPE_BF16>(&r.x[i], h);
            pq2_load4<PQ2_DTYPE_BF16>(&r.x2[i], q);
#pragma unroll
            for (int j = 0; j < 4; ++j) h[j] += q[j];
            v[0] = h[0] * scale * r.w[i].x, v[1] = h[1] * scale * r.w[i].y;
            v[2] = h[2] * scale * r.w[i].z, v[3] = h[3] * scale * r.w[i].w;
        } else if (pd.kind == SEG_SWIGLU) {
            float g[4], u[4];
            pq2_load4<PQ2_DTYPE_BF16>(&r.x[i], g);
            pq2_load4<PQ2_DTYPE_BF16>(&r.x2[i], u);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        } else {
            pq2_load4<PQ2_DTYPE_BF16>(&r.x[i], v);
        }
        v[0] *= r.s[i].x, v[1] *= r.s[i].y, v[2] *= r.s[i].z, v[3] *= r.s[i].w;
        hadamard_1024_nb(v, xch, nthr);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] *= pd.rsqrt_b;
        if (live) {
            const int g = ((tile * 1024 + 4 * t) >> 7) - g0;  // the group in the operand region
            q8_store_group(v, T & 31, 0, g, g, 1, width, nullptr, act_xs, act_sums,
                           reinterpret_cast<uint32_t *>(act_xb), nullptr);
        }
        named_barrier_sync(1, nthr);  // xch is read until here
    }
}

template <int NW>
__global__ void __launch_bounds__((NW + 1) * 32, 1) seg4_kernel(const Seg4Params p)
{
    extern __shared__ __align__(128) uint8_t smem[];
    const int slots = p.slots;
    uint8_t *ring = smem;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)slots * kSlotBytes);
    uint64_t *empty = full + slots;
    uint4 *act_xb = reinterpret_cast<uint4 *>(empty + slots);
    float *act_xs = reinterpret_cast<float *>(act_xb + (size_t)p.gop * 32);
    int *act_sums = reinterpret_cast<int *>(act_xs + p.gop);
    float *part = reinterpret_cast<float *>(
        reinterpret_cast<uint8_t *>(act_xb) + (((size_t)p.gop * 520 + 15) & ~(size_t)15));
    unsigned *scnt = reinterpret_cast<unsigned *>(part + (size_t)slots * NW * 32);
    float *xch = reinterpret_cast<float *>(
        (reinterpret_cast<uintptr_t>(scnt + slots) + 15) & ~(uintptr_t)15);  // 4 a thread
    __shared__ unsigned s_epoch;
    __shared__ float s_red[8];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c = blockIdx.x, P = gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; ++s) mbar_init_count(full + s, 1), mbar_init_count(empty + s, NW);
        mbar_init_fence();
        s_epoch = p.epochs[c];
    }
    for (int s = threadIdx.x; s < slots; s += blockDim.x) scnt[s] = 0;
    __syncthreads();
    const unsigned epoch = s_epoch;

    if (warp == NW) {  // the producer lane
        if (lane != 0) return;
        uint64_t pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        walker w{p.mats, p.nmat, c, P, 0, 0, 0}, ahead{p.mats, p.nmat, c, P, 0, 0, 0};
        w.start(0), ahead.start(0);
        piece pc, pa;
        int j, ja;
        for (int i = 0; i < p.pf; ++i) {  // the first PF pieces into L2
            if (!ahead.next(pa, ja)) break;
            const Seg4Mat &m = p.mats[ja];
            const long long u = (long long)pa.rb * m.G + pa.ks * m.Gs + pa.gl;
            prefetch_l2(m.codes + u * kUnitCodes, (uint32_t)pa.n * kUnitCodes);
        }
        for (unsigned k = 0; w.next(pc, j); ++k) {
            const int s = (int)(k % (unsigned)slots);
            if (k >= (unsigned)slots) mbar_wait(empty + s, ((k / slots) - 1) & 1u);
            const Seg4Mat &m = p.mats[j];
            const long long u = (long long)pc.rb * m.G + pc.ks * m.Gs + pc.gl;
            uint8_t *dst = ring + (size_t)s * kSlotBytes;
            mbar_expect_tx(full + s, (uint32_t)pc.n * kUnitBytes);
            copy_hint(full + s, dst, m.codes + u * kUnitCodes, (uint32_t)pc.n * kUnitCodes, pol);
            copy_hint(full + s, dst + kSC * kUnitCodes, m.scales + u * kUnitScales,
                      (uint32_t)pc.n * kUnitScales, pol);
            if (p.pf > 0 && ahead.next(pa, ja)) {
                const Seg4Mat &ma = p.mats[ja];
                const long long ua = (long long)pa.rb * ma.G + pa.ks * ma.Gs + pa.gl;
                prefetch_l2(ma.codes + ua * kUnitCodes, (uint32_t)pa.n * kUnitCodes);
            }
        }
        return;
    }

    // consumers
    const int tid = threadIdx.x, nthr = NW * 32, gid = lane >> 2;
    const lane_consts<1> lc(lane);
    const float back = __int_as_float(0x3f800000 + ((lane & 3) << 24));
    auto lanesum = [&](float x) {
        float v = x * back;
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        return v;
    };
    walker w{p.mats, p.nmat, c, P, 0, 0, 0};
    unsigned k = 0;
    for (int j = 0; j < p.nmat; ++j) {
        const Seg4Mat &m = p.mats[j];
        const long long U = m.units, u0 = U * c / P, u1 = U * (c + 1) / P;
        const long long slice = (long long)m.rbs * m.Gs;
        const int Gs = m.Gs, KS = m.KS;
        unsigned long long *st = p.stamps ? p.stamps + ((size_t)c * p.nmat + j) * 4 : nullptr;
        // the operand of the CTA's slices, groups [gA, gB), held as the 1024-element tiles that
        // cover them, [t0, t1): groups [g0, g0 + (t1 - t0) * 8)
        const int gA = u1 > u0 ? (int)(u0 / slice) * Gs : 0;
        const int gB = u1 > u0 ? (int)((u1 - 1) / slice + 1) * Gs : 0;
        const int t0 = gA / 8, t1 = (gB + 7) / 8, g0 = t0 * 8, g1 = min(t1 * 8, m.G);
        const bool produce = p.mode >= 5 && m.prod.kind != SEG_STATIC && u1 > u0;
        prod_regs<kMaxPasses<NW>> pr;
        if (produce) produce_static(m.prod, t0, t1, nthr >> 8, pr);  // before the wait
        if (tid == 0) {
            if (st) st[0] = gtimer4();
            if ((p.mode == 2 || p.mode == 4 || p.mode == 5) && j > 0) {
                const unsigned target = (epoch + 1) * (unsigned)P;
                const unsigned long long t0 = gtimer4();
                while (ld_acquire4(p.counters + j - 1) < target) {
                    __nanosleep(32);
                    if (gtimer4() - t0 > 2000000000ull) {
                        printf("seg4: CTA %d stuck at matrix %d\n", c, j);
                        __trap();
                    }
                }
            }
            const unsigned long long t1 = gtimer4();
            if (st) st[1] = t1;
            if (p.mode == 4)
                while (gtimer4() - t1 < (unsigned long long)p.spin_ns) {
                }
        }
        named_barrier_sync(1, nthr);
        if (produce) {
            produce_tiles(m.prod, m.G, t0, t1, g0, nthr, pr, xch, s_red, act_xb, act_xs, act_sums,
                          c == 0);
        } else {
            for (int e = tid; e < (g1 - g0) * 32; e += nthr) act_xb[e] = __ldcg(m.xbits + g0 * 32 + e);
            for (int e = tid; e < g1 - g0; e += nthr)
                act_xs[e] = __ldcg(m.xs + g0 + e), act_sums[e] = __ldcg(m.sums + g0 + e);
            named_barrier_sync(1, nthr);
        }
        if (tid == 0 && st) st[2] = gtimer4();

        w.start(j);
        piece pc;
        int jj;
        while (w.f < w.u1) {  // this matrix's pieces only
            w.next(pc, jj);
            const int s = (int)(k % (unsigned)slots);
            mbar_wait(full + s, (k / slots) & 1u);
            const uint8_t *sl = ring + (size_t)s * kSlotBytes;
            const int i0 = warp * pc.n / NW, i1 = (warp + 1) * pc.n / NW;
            float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
            if (p.mode != 3) {
                for (int i = i0; i < i1; ++i) {
                    const int g = pc.ks * Gs + pc.gl + i - g0;
                    const uint4 w0 = *reinterpret_cast<const uint4 *>(sl + (i * 2 + 0) * 512 + lane * 16);
                    const uint4 w1 = *reinterpret_cast<const uint4 *>(sl + (i * 2 + 1) * 512 + lane * 16);
                    const uint32_t sc0 = *reinterpret_cast<const uint32_t *>(sl + kSC * kUnitCodes + (i * 2 + 0) * 32 + gid * 4);
                    const uint32_t sc1 = *reinterpret_cast<const uint32_t *>(sl + kSC * kUnitCodes + (i * 2 + 1) * 32 + gid * 4);
                    const uint4 bx = act_xb[g * 32 + lane];
                    const int ns = act_sums[g] * lc.c_neg;
                    const float xs = act_xs[g];
                    const uint4 wv[2] = {w0, w1};
                    const uint32_t scv[2] = {sc0, sc1};
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&scv[r]));
                        const uint32_t a[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
                        const int init[4] = {ns, 0, ns, 0};
                        int d[4];
                        pq2_bmma_and_popc(d, a, bx.x, bx.y, init);
                        pq2_bmma_and_popc(d, a, bx.z, bx.w, d);
                        acc[r][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * xs, acc[r][0]);
                        acc[r][1] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * xs, acc[r][1]);
                    }
                }
            }
            // this warp's share of the piece, then count in; the last warp sums in warp order
            float *pt = part + (size_t)s * NW * 32;
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float v = lanesum(acc[r][h]);
                    if ((lane & 3) == 0) pt[warp * 32 + r * 16 + h * 8 + gid] = v;
                }
            __syncwarp();
            __threadfence_block();  // the warp's partials before the count (release)
            unsigned old = 0;
            if (lane == 0) old = atomicAdd(scnt + s, 1u);
            old = __shfl_sync(0xffffffffu, old, 0);
            if (old % NW == NW - 1) {
                __threadfence_block();
                float v = 0.0f;
                for (int x = 0; x < NW; ++x) v += pt[x * 32 + lane];
                const bool whole = pc.gl == 0 && pc.n == Gs;
                if (KS == 1 && whole) {
                    m.y[(size_t)pc.rb * 32 + lane] = v;
                } else {
                    const int side = pc.gl == 0 ? 0 : 1;
                    float *wsr = m.ws + (size_t)pc.rb * (2 * KS) * 32;
                    wsr[(pc.ks * 2 + side) * 32 + lane] = v;
                    // the row block's contributions: each slice once, twice where a CTA's range
                    // starts inside it
                    int expected = 0;
                    for (int q = 0; q < KS; ++q)
                        expected += 1 + (cut_inside(U, P, q * slice + (long long)pc.rb * Gs, Gs) ? 1 : 0);
                    __threadfence();
                    __syncwarp();
                    unsigned a = 0;
                    if (lane == 0) a = atomicAdd(m.cnt + pc.rb, 1u);
                    a = __shfl_sync(0xffffffffu, a, 0);
                    if ((a + 1) % (unsigned)expected == 0) {
                        __threadfence();
                        float t = 0.0f;
                        for (int q = 0; q < KS; ++q) {
                            t += __ldcg(wsr + (q * 2) * 32 + lane);
                            if (cut_inside(U, P, q * slice + (long long)pc.rb * Gs, Gs))
                                t += __ldcg(wsr + (q * 2 + 1) * 32 + lane);
                        }
                        m.y[(size_t)pc.rb * 32 + lane] = t;
                    }
                }
                __syncwarp();
            }
            if (lane == 0) mbar_arrive(empty + s);  // after the sum: the slot's partials are read
            ++k;
        }
        __threadfence();
        named_barrier_sync(1, nthr);
        if (tid == 0) atomicAdd(p.counters + j, 1u);
        if (tid == 0 && st) st[3] = gtimer4();
    }
    if (tid == 0) p.epochs[c] = epoch + 1;
}

// ---- host ---------------------------------------------------------------------------------

struct Seg4Plan {
    Seg4Mat *d_mats;
    int nmat, gop, grid;
    unsigned *counters, *epochs;
};

template <int NW> static size_t smem4(const Seg4Plan &pl, int slots)
{
    return (size_t)slots * kSlotBytes + 16 * (size_t)slots + (((size_t)pl.gop * 520 + 15) & ~(size_t)15) +
           (size_t)slots * NW * 32 * 4 + 4 * (size_t)slots + 16 + (size_t)NW * 32 * 16;
}

extern "C" {

// mats: G, rbs, KS, Gs, units filled; ws and cnt allocated here when null.
void *seg4_plan(Seg4Mat *mats, int nmat)
{
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    Seg4Plan *pl = new Seg4Plan();
    pl->nmat = nmat;
    pl->grid = prop.multiProcessorCount;
    pl->gop = 0;
    for (int j = 0; j < nmat; ++j) {
        Seg4Mat &m = mats[j];
        if (m.G % m.KS != 0 || m.G / m.KS != m.Gs || m.Gs > kSC ||
            m.units / pl->grid < m.Gs) {
            fprintf(stderr, "seg4: matrix %d: G %d KS %d Gs %d does not fit\n", j, m.G, m.KS, m.Gs);
            return nullptr;
        }
        // a CTA's groups: the 1024-element tiles covering the slices its range meets
        const long long slice = (long long)m.rbs * m.Gs;
        if (m.G % 8 != 0 || (m.prod.kind == SEG_NORM && m.G / 8 > 8)) {
            fprintf(stderr, "seg4: matrix %d: K is not a multiple of 1024 (or a norm over 8192)\n", j);
            return nullptr;
        }
        for (int c = 0; c < pl->grid; ++c) {
            const long long u0 = m.units * c / pl->grid, u1 = m.units * (c + 1) / pl->grid;
            if (u1 > u0) {
                const int gA = (int)(u0 / slice) * m.Gs, gB = (int)((u1 - 1) / slice + 1) * m.Gs;
                const int g = ((gB + 7) / 8 - gA / 8) * 8;
                pl->gop = g > pl->gop ? g : pl->gop;
            }
        }
        if (!m.ws) cudaMalloc(&m.ws, (size_t)m.rbs * 2 * m.KS * 32 * 4);
        if (!m.cnt) {
            cudaMalloc(&m.cnt, (size_t)m.rbs * 4);
            cudaMemset(m.cnt, 0, (size_t)m.rbs * 4);
        }
    }
    cudaMalloc(&pl->d_mats, sizeof(Seg4Mat) * nmat);
    cudaMemcpy(pl->d_mats, mats, sizeof(Seg4Mat) * nmat, cudaMemcpyHostToDevice);
    cudaMalloc(&pl->counters, 4 * nmat);
    cudaMemset(pl->counters, 0, 4 * nmat);
    cudaMalloc(&pl->epochs, 4 * pl->grid);
    cudaMemset(pl->epochs, 0, 4 * pl->grid);
    return pl;
}

int seg4_gop(void *h) { return static_cast<Seg4Plan *>(h)->gop; }

// The producers' passes need the operand's tiles within kMaxPasses.
int seg4_passes_fit(void *h, int nw)
{
    const int tiles = static_cast<Seg4Plan *>(h)->gop / 8;
    const int groups = nw * 32 / 256;
    return (tiles + groups - 1) / groups <= (nw == 16 ? kMaxPasses<16> : kMaxPasses<8>);
}
int seg4_grid(void *h) { return static_cast<Seg4Plan *>(h)->grid; }

int seg4_max_slots(void *h, int nw)
{
    Seg4Plan &pl = *static_cast<Seg4Plan *>(h);
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    for (int s = 16; s >= 1; --s) {
        const size_t b = (size_t)s * kSlotBytes + 16 * (size_t)s + (((size_t)pl.gop * 520 + 15) & ~(size_t)15) +
                         (size_t)s * nw * 32 * 4 + 4 * (size_t)s + 16 + (size_t)nw * 32 * 16 + 128;
        if (b <= (size_t)optin) return s;
    }
    return 0;
}

int seg4_launch(void *h, int nw, int slots, int mode, int spin_ns, int pf,
                unsigned long long *stamps, cudaStream_t stream)
{
    Seg4Plan &pl = *static_cast<Seg4Plan *>(h);
    if (mode >= 5 && !seg4_passes_fit(h, nw)) return -4;  // the operand's tiles need more passes
    Seg4Params p{pl.d_mats, pl.nmat, pl.counters, pl.epochs, stamps, mode, spin_ns, slots, pf, pl.gop};
    cudaError_t e = cudaSuccess;
#define SEG4_CASE(NW_)                                                                             \
    if (nw == NW_) {                                                                               \
        const size_t sm = smem4<NW_>(pl, slots);                                                   \
        static size_t set_to = 0;                                                                  \
        if (sm > set_to)                                                                           \
            e = cudaFuncSetAttribute(seg4_kernel<NW_>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                     (int)sm);                                                     \
        if (e == cudaSuccess) {                                                                    \
            if (sm > set_to) {                                                                     \
                int occ = 0;                                                                       \
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, seg4_kernel<NW_>,              \
                                                              (NW_ + 1) * 32, sm);                 \
                if (occ < 1) return -2;                                                            \
                set_to = sm;                                                                       \
            }                                                                                      \
            seg4_kernel<NW_><<<pl.grid, (NW_ + 1) * 32, sm, stream>>>(p);                          \
            e = cudaGetLastError();                                                                \
        }                                                                                          \
        return e == cudaSuccess ? 0 : (int)e;                                                      \
    }
    SEG4_CASE(16)
    SEG4_CASE(8)
    return -1;
}
}
