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
// Modes: 0 no dependency, 2 the real one, 3 copies only, 4 = 2 + a spin of spin_ns.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "device/ptx.cuh"
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
};

struct Seg4Params {
    const Seg4Mat *mats;
    int nmat;
    unsigned *counters, *epochs;
    unsigned long long *stamps;  // [grid][nmat][4] or null
    int mode, spin_ns, slots, pf, gop;  // gop: operand groups the region holds
};

constexpr int kSC = 40;  // units a slot at most (>= every Gs)
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
    __shared__ unsigned s_epoch;

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
        if (tid == 0) {
            if (st) st[0] = gtimer4();
            if ((p.mode == 2 || p.mode == 4) && j > 0) {
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
        // the operand of the CTA's slices: groups [gA, gB)
        const int gA = u1 > u0 ? (int)(u0 / slice) * Gs : 0;
        const int gB = u1 > u0 ? (int)((u1 - 1) / slice + 1) * Gs : 0;
        for (int e = tid; e < (gB - gA) * 32; e += nthr) act_xb[e] = __ldcg(m.xbits + gA * 32 + e);
        for (int e = tid; e < gB - gA; e += nthr)
            act_xs[e] = __ldcg(m.xs + gA + e), act_sums[e] = __ldcg(m.sums + gA + e);
        named_barrier_sync(1, nthr);
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
                    const int g = pc.ks * Gs + pc.gl + i - gA;
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
            __threadfence_block();  // the partials before the count (release)
            __syncwarp();
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
           (size_t)slots * NW * 32 * 4 + 4 * (size_t)slots;
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
        // a CTA's groups: the slices its range meets (at most two)
        const long long slice = (long long)m.rbs * m.Gs;
        for (int c = 0; c < pl->grid; ++c) {
            const long long u0 = m.units * c / pl->grid, u1 = m.units * (c + 1) / pl->grid;
            if (u1 > u0) {
                const int g = (int)((u1 - 1) / slice - u0 / slice + 1) * m.Gs;
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
int seg4_grid(void *h) { return static_cast<Seg4Plan *>(h)->grid; }

int seg4_max_slots(void *h, int nw)
{
    Seg4Plan &pl = *static_cast<Seg4Plan *>(h);
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    for (int s = 16; s >= 1; --s) {
        const size_t b = (size_t)s * kSlotBytes + 16 * (size_t)s + (((size_t)pl.gop * 520 + 15) & ~(size_t)15) +
                         (size_t)s * nw * 32 * 4 + 4 * (size_t)s + 64;
        if (b <= (size_t)optin) return s;
    }
    return 0;
}

int seg4_launch(void *h, int nw, int slots, int mode, int spin_ns, int pf,
                unsigned long long *stamps, cudaStream_t stream)
{
    Seg4Plan &pl = *static_cast<Seg4Plan *>(h);
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
