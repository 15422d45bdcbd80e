// seg.cu - lab prototype for issue 36 (not product): one persistent kernel streams the m = 1
// projections of many matrices (tiles rt 2, 32-row row blocks) through one shared-memory ring per
// CTA filled by one producer lane with large bulk copies; NW consumer warps take V units each of
// every slot. The producer runs ahead across matrix boundaries (it never waits for activations),
// so the next matrix's weights land while the consumers wait for the dependency.
//
// Per matrix j, CTA c takes the flat units [c*U/P, (c+1)*U/P) (unit = row block x group, rb-major).
// Consumers accumulate per row block, flush into a per-CTA row accumulator in shared memory (float
// atomics) and at the matrix's end add the CTA's rows into y (float atomics, y zeroed before).
//
// Modes: 0 no cross-CTA dependency; 3 mode 0 without the arithmetic (the copy engine's rate);
// 2 the real one (counter per matrix, targets grow with a per-CTA
// epoch, never reset); 4 = 2 plus a spin of spin_ns after the flag (a producer recomputed inside
// the CTA); 5 = 2 and 6 = 0 with the real producer (producers.cuh: residual add + RMSNorm,
// SwiGLU or the plain input, rotated, Q8, bit slices) computed by every CTA from the matrix's
// inputs straight into shared memory (WR also: 7 CTA t < tiles makes tile t of the operand into
// global memory, every CTA copies the whole operand after all tiles; 8 the same with per-tile
// flags, each warp waiting for and copying a tile when its walk reaches it). Modes 0-4 stage matrix j's activations (bit slices, scales, sums) from global into
// shared memory at the matrix's start (the stand-in for the producer's output).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "device/ptx.cuh"
#include "rowblock/activations.cuh"
#include "producers.cuh"

struct SegMat {
    const uint8_t *codes;   // tiles rt 2 code region
    const uint8_t *scales;  // scale region
    const uint4 *xbits;     // [G][32] (128 words)
    const float *xs;        // [G]
    const int *sums;        // [G]
    float *y;               // [N]
    long long units;        // row blocks * G
    int G, rbs;
    seg_prod prod;          // modes 5, 6: the producer recomputed in every CTA
    uint8_t *dbg;           // CTA 0's staged operand (bits, scales, sums), or null
    const uint32_t *xpack;  // WR PACK: [G][32] the packed bit slices (producers.cuh)
};

struct SegParams {
    const SegMat *mats;
    int nmat;
    unsigned *counters;           // [nmat], never reset
    unsigned *epochs;             // [grid]
    unsigned long long *stamps;   // [grid][nmat][4] or null
    int mode, spin_ns, slots, evict_first;
    int gmax, rowacc_floats;
    float *bws;          // DET: [nmat][grid][2][32] partials of the row blocks two CTAs share
    unsigned *bcount;    // DET: [nmat][grid] arrivals (two a launch: the odd one is the last)
    int dump;            // CTA 0 copies its staged operand to each matrix's dbg
    int wr_rbs;          // WR: the most row blocks one warp's range meets
    unsigned *pcounters; // WR: [nmat] the distributed producers' arrivals (mode 7), never reset
    unsigned *pepochs;   // WR: [grid] launches of the WR kernel (pcounters' targets)
    unsigned *tcounters; // WR: [nmat][32] each operand tile's producer arrivals (mode 8), never reset
};

constexpr int kUnitCodes = 1024, kUnitScales = 64, kUnitBytes = kUnitCodes + kUnitScales;

__device__ __forceinline__ unsigned long long gtimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void bulk_copy_hint(uint64_t *bar, void *dst, const void *src,
                                               uint32_t bytes, uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
                 : "memory");
}

__device__ __forceinline__ void bulk_copy_plain(uint64_t *bar, void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void cta_range(long long U, int c, int P, long long &u0, long long &u1)
{
    u0 = U * c / P, u1 = U * (c + 1) / P;
}

// The same in 32-bit unsigned arithmetic (WR's i32 flag: every range of these matrices fits), and
// the divisions by a matrix's group count, either way.
__device__ __forceinline__ void cta_range_any(long long U, int c, int P, bool i32, long long &u0, long long &u1)
{
    if (i32) {
        const unsigned Uu = (unsigned)U;
        u0 = Uu * (unsigned)c / (unsigned)P, u1 = Uu * (unsigned)(c + 1) / (unsigned)P;
    } else {
        cta_range(U, c, P, u0, u1);
    }
}
__device__ __forceinline__ long long div_any(long long x, int G, bool i32)
{
    return i32 ? (long long)((unsigned)x / (unsigned)G) : x / G;
}

// DET: the sums in a fixed order (the product's requirement): each warp's partial of a slot goes
// to its own shared slot, one warp adds the slot's partials in warp order into the CTA's row
// accumulators (slot order), interior row blocks are stored, and a row block two CTAs share is
// added by the second to arrive (left part first). Otherwise float atomics (y zeroed before).
template <int NW, int V, bool DET>
__global__ void __launch_bounds__((NW + 1) * 32, 1) seg_kernel(const SegParams p)
{
    constexpr int SU = NW * V;
    constexpr int SLOT = SU * kUnitBytes;
    extern __shared__ __align__(128) uint8_t smem[];
    const int slots = p.slots;
    uint8_t *ring = smem;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)slots * SLOT);
    uint64_t *empty = full + slots;
    uint4 *act_xb = reinterpret_cast<uint4 *>(empty + slots);
    float *act_xs = reinterpret_cast<float *>(act_xb + (size_t)p.gmax * 32);
    int *act_sums = reinterpret_cast<int *>(act_xs + p.gmax);
    float *rowacc = reinterpret_cast<float *>(
        reinterpret_cast<uint8_t *>(act_xb) + (((size_t)p.gmax * 520 + 15) & ~(size_t)15));
    float *part = rowacc + p.rowacc_floats;  // DET: [2 parities][NW][2 row blocks][32]
    float *xch = part + 2 * NW * 64;          // modes 5, 6: the Hadamard exchange, 4 a thread
    __shared__ unsigned s_epoch, s_last[2];
    __shared__ float s_red[8];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c = blockIdx.x, P = gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; ++s) mbar_init_count(full + s, 1), mbar_init_count(empty + s, NW);
        mbar_init_fence();
        s_epoch = p.epochs[c];
    }
    for (int e = threadIdx.x; e < p.rowacc_floats; e += blockDim.x) rowacc[e] = 0.0f;
    __syncthreads();
    const unsigned epoch = s_epoch;

    if (warp == NW) {  // the producer
        if (lane != 0) return;
        uint64_t pol = 0;
        if (p.evict_first)
            asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        else
            asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
        unsigned k = 0;
        for (int j = 0; j < p.nmat; ++j) {
            const SegMat &m = p.mats[j];
            long long u0, u1;
            cta_range(m.units, c, P, u0, u1);
            for (long long b = u0; b < u1; b += SU, ++k) {
                const int n = (int)min((long long)SU, u1 - b);
                const int s = (int)(k % (unsigned)slots);
                if (k >= (unsigned)slots) mbar_wait(empty + s, ((k / slots) - 1) & 1u);
                uint8_t *dst = ring + (size_t)s * SLOT;
                mbar_expect_tx(full + s, (uint32_t)n * kUnitBytes);
                bulk_copy_hint(full + s, dst, m.codes + b * kUnitCodes, (uint32_t)n * kUnitCodes,
                               pol);
                bulk_copy_hint(full + s, dst + SU * kUnitCodes, m.scales + b * kUnitScales,
                               (uint32_t)n * kUnitScales, pol);
            }
        }
        return;
    }

    // consumers
    const int tid = threadIdx.x, nthr = NW * 32, gid = lane >> 2;
    const lane_consts<1> lc(lane);
    const int ebits = (lane & 3) << 24;
    const float back = __int_as_float(0x3f800000 + ebits);  // 4^tq
    unsigned k = 0;
    for (int j = 0; j < p.nmat; ++j) {
        const SegMat &m = p.mats[j];
        long long u0, u1;
        cta_range(m.units, c, P, u0, u1);
        const int G = m.G;
        unsigned long long *st = p.stamps ? p.stamps + ((size_t)c * p.nmat + j) * 4 : nullptr;
        if (tid == 0) {
            if (st) st[0] = gtimer();
            if ((p.mode == 2 || p.mode == 4 || p.mode == 5) && j > 0) {
                const unsigned target = (epoch + 1) * (unsigned)P;
                const unsigned long long t0 = gtimer();
                while (ld_acquire(p.counters + j - 1) < target) {
                    __nanosleep(32);
                    if (gtimer() - t0 > 2000000000ull) {
                        printf("seg: CTA %d stuck at matrix %d\n", c, j);
                        __trap();
                    }
                }
            }
            const unsigned long long t1 = gtimer();
            if (st) st[1] = t1;
            if (p.mode == 4)
                while (gtimer() - t1 < (unsigned long long)p.spin_ns) {
                }
        }
        named_barrier_sync(1, nthr);
        if (p.mode >= 5 && m.prod.kind != SEG_STATIC) {
            float *hbuf = reinterpret_cast<float *>(act_xb + (size_t)G * 32);  // groups [G, 2G)
            cta_produce(m.prod, G, nthr, xch, hbuf, s_red, act_xb, act_xs, act_sums, c == 0);
        } else {
            // stage the activations (written by other CTAs in the product: read past L1)
            for (int e = tid; e < G * 32; e += nthr) act_xb[e] = __ldcg(m.xbits + e);
            for (int e = tid; e < G; e += nthr) act_xs[e] = __ldcg(m.xs + e), act_sums[e] = __ldcg(m.sums + e);
            named_barrier_sync(1, nthr);
        }
        if (c == 0 && p.dump && m.dbg) {  // the check's copy of CTA 0's operand
            uint4 *d = reinterpret_cast<uint4 *>(m.dbg);
            for (int e = tid; e < G * 32; e += nthr) d[e] = act_xb[e];
            float *dx = reinterpret_cast<float *>(d + G * 32);
            int *ds = reinterpret_cast<int *>(dx + G);
            for (int e = tid; e < G; e += nthr) dx[e] = act_xs[e], ds[e] = act_sums[e];
        }
        if (tid == 0 && st) st[2] = gtimer();

        const long long rb_first = u0 / G;
        long long cur_rb = -1;
        float acc[2][2], acc_a[2][2];  // acc_a (DET): the slot's first row block, once it changed
        acc[0][0] = acc[0][1] = acc[1][0] = acc[1][1] = 0.0f;
        auto lanesum = [&](float x) {
            float v = x * back;
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            return v;
        };
        auto flush = [&]() {
            if (cur_rb < 0) return;
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float v = lanesum(acc[r][h]);
                    if ((lane & 3) == 0)
                        atomicAdd(rowacc + (cur_rb - rb_first) * 32 + r * 16 + h * 8 + gid, v);
                    acc[r][h] = 0.0f;
                }
        };
        for (long long b = u0; b < u1; b += SU, ++k) {
            const int n = (int)min((long long)SU, u1 - b);
            const int s = (int)(k % (unsigned)slots);
            mbar_wait(full + s, (k / slots) & 1u);
            const uint8_t *sl = ring + (size_t)s * SLOT;
            const int i0 = warp * V;
            const long long rb0 = b / G;  // the slot's first row block
            bool changed = false;          // DET: the warp's units met a second row block
            int lr0 = 0;                   // DET: the slot-local row block of its first unit
            if (i0 < n && p.mode != 3) {  // mode 3: the copies alone (no arithmetic)
                long long f = b + i0;
                long long rb = f / G;
                int g = (int)(f - rb * G);
                if constexpr (DET) cur_rb = rb, lr0 = (int)(rb - rb0);
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    const int i = i0 + v;
                    if (i >= n) break;
                    if (rb != cur_rb) {
                        if constexpr (DET) {
#pragma unroll
                            for (int r = 0; r < 2; ++r)
#pragma unroll
                                for (int h = 0; h < 2; ++h) acc_a[r][h] = acc[r][h], acc[r][h] = 0.0f;
                            changed = true;
                        } else {
                            flush();
                        }
                        cur_rb = rb;
                    }
                    const uint4 w0 = *reinterpret_cast<const uint4 *>(sl + (i * 2 + 0) * 512 + lane * 16);
                    const uint4 w1 = *reinterpret_cast<const uint4 *>(sl + (i * 2 + 1) * 512 + lane * 16);
                    const uint32_t sc0 = *reinterpret_cast<const uint32_t *>(sl + SU * kUnitCodes + (i * 2 + 0) * 32 + gid * 4);
                    const uint32_t sc1 = *reinterpret_cast<const uint32_t *>(sl + SU * kUnitCodes + (i * 2 + 1) * 32 + gid * 4);
                    const uint4 bx = act_xb[g * 32 + lane];
                    const int ns = act_sums[g] * lc.c_neg;
                    const float xs = act_xs[g];
                    const uint4 w[2] = {w0, w1};
                    const uint32_t sc[2] = {sc0, sc1};
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
                        const uint32_t a[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
                        const int init[4] = {ns, 0, ns, 0};
                        int d[4];
                        pq2_bmma_and_popc(d, a, bx.x, bx.y, init);
                        pq2_bmma_and_popc(d, a, bx.z, bx.w, d);
                        acc[r][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * xs, acc[r][0]);
                        acc[r][1] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * xs, acc[r][1]);
                    }
                    if (++g == G) g = 0, ++rb;
                }
            }
            if constexpr (DET) {
                // this warp's two slot-local row blocks (zero where it has none) ...
                float *mine = part + ((k & 1) * NW + warp) * 64;
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float first = lanesum(changed ? acc_a[r][h] : acc[r][h]);
                        const float second = lanesum(changed ? acc[r][h] : 0.0f);
                        if ((lane & 3) == 0) {
                            const int row = r * 16 + h * 8 + gid;
                            mine[lr0 * 32 + row] = first;
                            mine[(1 - lr0) * 32 + row] = lr0 ? 0.0f : second;
                        }
                        acc[r][h] = 0.0f;
                    }
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + s);
                named_barrier_sync(1, nthr);
                // ... summed in warp order by one warp, into the CTA's rows in slot order
                if (warp == (int)(k % NW)) {
                    const int nlr = (int)((b + n - 1) / G - rb0) + 1;
                    const float *all = part + (k & 1) * NW * 64;
                    for (int lr = 0; lr < nlr; ++lr) {
                        float v = 0.0f;
#pragma unroll
                        for (int w = 0; w < NW; ++w) v += all[w * 64 + lr * 32 + lane];
                        rowacc[(rb0 + lr - rb_first) * 32 + lane] += v;
                    }
                }
            } else {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + s);
            }
        }
        if constexpr (!DET) flush();
        named_barrier_sync(1, nthr);
        if (u1 > u0) {
            const long long rb_last = (u1 - 1) / G;
            const int rows = (int)(rb_last - rb_first + 1) * 32;
            if constexpr (DET) {
                const bool head = u0 % G != 0, tail = u1 % G != 0;  // shared with c - 1, c + 1
                float *bw = p.bws + (size_t)j * P * 64;
                for (int e = tid; e < rows; e += nthr) {
                    const long long rb = rb_first + e / 32;
                    const int side = (head && rb == rb_first) ? 1 : (tail && rb == rb_last) ? 0 : -1;
                    if (side < 0)
                        m.y[rb_first * 32 + e] = rowacc[e];
                    else  // boundary c (head) or c + 1 (tail), the left part at 0
                        bw[((size_t)(side ? c : c + 1) * 2 + side) * 32 + (e & 31)] = rowacc[e];
                    rowacc[e] = 0.0f;
                }
                if (head || tail) {
                    __threadfence();
                    named_barrier_sync(1, nthr);
                    if (tid < 2) {
                        const bool mine = tid == 0 ? head : tail;
                        const int id = tid == 0 ? c : c + 1;
                        s_last[tid] = mine ? (atomicAdd(p.bcount + (size_t)j * P + id, 1u) & 1u) : 0u;
                    }
                    named_barrier_sync(1, nthr);
                    for (int t = 0; t < 2; ++t) {
                        if (!s_last[t]) continue;
                        __threadfence();
                        const int id = t == 0 ? c : c + 1;
                        const long long rb = t == 0 ? rb_first : rb_last;
                        if (tid < 32) {
                            const float *q = bw + (size_t)id * 64;
                            m.y[rb * 32 + tid] = __ldcg(q + tid) + __ldcg(q + 32 + tid);
                        }
                    }
                }
            } else {
                for (int e = tid; e < rows; e += nthr) {
                    atomicAdd(m.y + rb_first * 32 + e, rowacc[e]);
                    rowacc[e] = 0.0f;
                }
            }
        }
        // every mode signals (so the counters keep pace with the epochs); modes >= 2 wait
        __threadfence();
        named_barrier_sync(1, nthr);
        if (tid == 0) atomicAdd(p.counters + j, 1u);
        if (tid == 0 && st) st[3] = gtimer();
    }
    if (tid == 0) p.epochs[c] = epoch + 1;
}


// ---- the register alternative (REG): no ring, no producer warp ----------------------------------
// Consumer warp w streams its own contiguous range of the CTA's units of every matrix straight
// into registers (two batches of U units in flight, loads that bypass L1), as today's row-block
// kernels load, and issues the next matrix's first two batches before the dependency wait: the
// registers are the ring. Fixed-order sums: each warp's partial of a row block goes to its own
// shared slot (a warp meets a row block once), summed in warp order at the matrix's end;
// boundaries as DET.
template <int U> struct reg_batch {
    uint4 w[U][2];
    uint32_t sc[U][2];
};

template <int U>
__device__ __forceinline__ void reg_load(reg_batch<U> &bt, const SegMat &m, long long f, int n,
                                         int lane)
{
    const uint8_t *cd = m.codes + f * kUnitCodes + lane * 16;
    const uint32_t *sd = reinterpret_cast<const uint32_t *>(m.scales + f * kUnitScales) + (lane >> 2);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (u < n) {
                bt.w[u][r] = ld_stream16(cd + (u * 2 + r) * 512);
                bt.sc[u][r] = ld_stream4(sd + (u * 2 + r) * 8);
            }
}

template <int NW, int U>
__global__ void __launch_bounds__(NW * 32, 1) seg_reg_kernel(const SegParams p)
{
    extern __shared__ __align__(128) uint8_t smem[];
    uint4 *act_xb = reinterpret_cast<uint4 *>(smem);
    float *act_xs = reinterpret_cast<float *>(act_xb + (size_t)p.gmax * 32);
    int *act_sums = reinterpret_cast<int *>(act_xs + p.gmax);
    float *rowpart = reinterpret_cast<float *>(smem + (((size_t)p.gmax * 520 + 15) & ~(size_t)15));
    float *xch = rowpart + (size_t)p.rowacc_floats * NW;  // [row block][warp][32] before it
    __shared__ unsigned s_epoch, s_last[2];
    __shared__ float s_red[8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2;
    const int c = blockIdx.x, P = gridDim.x, tid = threadIdx.x, nthr = NW * 32;
    if (tid == 0) s_epoch = p.epochs[c];
    __syncthreads();
    const unsigned epoch = s_epoch;
    const lane_consts<1> lc(lane);
    const float back = __int_as_float(0x3f800000 + ((lane & 3) << 24));
    auto lanesum = [&](float x) {
        float v = x * back;
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        return v;
    };
    auto warp_range = [&](long long u0, long long u1, int w, long long &a, long long &b) {
        a = u0 + (u1 - u0) * w / NW, b = u0 + (u1 - u0) * (w + 1) / NW;
    };
    reg_batch<U> b0, b1;
    // the first matrix's first batches
    {
        long long u0, u1, a, b;
        cta_range(p.mats[0].units, c, P, u0, u1);
        warp_range(u0, u1, warp, a, b);
        if (a < b) reg_load<U>(b0, p.mats[0], a, (int)min((long long)U, b - a), lane);
        if (a + U < b) reg_load<U>(b1, p.mats[0], a + U, (int)min((long long)U, b - a - U), lane);
    }
    for (int j = 0; j < p.nmat; ++j) {
        const SegMat &m = p.mats[j];
        long long u0, u1, a, b;
        cta_range(m.units, c, P, u0, u1);
        warp_range(u0, u1, warp, a, b);
        const int G = m.G;
        unsigned long long *st = p.stamps ? p.stamps + ((size_t)c * p.nmat + j) * 4 : nullptr;
        if (tid == 0) {
            if (st) st[0] = gtimer();
            if ((p.mode == 2 || p.mode == 4 || p.mode == 5) && j > 0) {
                const unsigned target = (epoch + 1) * (unsigned)P;
                const unsigned long long t0 = gtimer();
                while (ld_acquire(p.counters + j - 1) < target) {
                    __nanosleep(32);
                    if (gtimer() - t0 > 2000000000ull) {
                        printf("seg: CTA %d stuck at matrix %d\n", c, j);
                        __trap();
                    }
                }
            }
            const unsigned long long t1 = gtimer();
            if (st) st[1] = t1;
            if (p.mode == 4)
                while (gtimer() - t1 < (unsigned long long)p.spin_ns) {
                }
        }
        named_barrier_sync(1, nthr);
        if (p.mode >= 5 && m.prod.kind != SEG_STATIC) {
            float *hbuf = reinterpret_cast<float *>(act_xb + (size_t)G * 32);
            cta_produce(m.prod, G, nthr, xch, hbuf, s_red, act_xb, act_xs, act_sums, c == 0);
        } else {
            for (int e = tid; e < G * 32; e += nthr) act_xb[e] = __ldcg(m.xbits + e);
            for (int e = tid; e < G; e += nthr) act_xs[e] = __ldcg(m.xs + e), act_sums[e] = __ldcg(m.sums + e);
            named_barrier_sync(1, nthr);
        }
        if (tid == 0 && st) st[2] = gtimer();
        const long long rb_first = u0 / G;
        float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        long long cur_rb = a / G;
        int g = (int)(a - cur_rb * G);
        auto flush = [&]() {
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float v = lanesum(acc[r][h]);
                    if ((lane & 3) == 0)
                        rowpart[((cur_rb - rb_first) * NW + warp) * 32 + r * 16 + h * 8 + gid] = v;
                    acc[r][h] = 0.0f;
                }
        };
        auto compute = [&](const reg_batch<U> &bt, int n) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u >= n) break;
                const uint4 bx = act_xb[g * 32 + lane];
                const int ns = act_sums[g] * lc.c_neg;
                const float xs = act_xs[g];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&bt.sc[u][r]));
                    const uint32_t aa[4] = {bt.w[u][r].x, bt.w[u][r].y, bt.w[u][r].z, bt.w[u][r].w};
                    const int init[4] = {ns, 0, ns, 0};
                    int d[4];
                    pq2_bmma_and_popc(d, aa, bx.x, bx.y, init);
                    pq2_bmma_and_popc(d, aa, bx.z, bx.w, d);
                    acc[r][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * xs, acc[r][0]);
                    acc[r][1] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * xs, acc[r][1]);
                }
                if (++g == G) {
                    g = 0;
                    flush();
                    ++cur_rb;
                }
            }
        };
        if (p.mode != 3) {
            for (long long f = a; f < b; f += 2 * U) {
                compute(b0, (int)min((long long)U, b - f));
                if (f + 2 * U < b) reg_load<U>(b0, m, f + 2 * U, (int)min((long long)U, b - f - 2 * U), lane);
                if (f + U >= b) break;
                compute(b1, (int)min((long long)U, b - f - U));
                if (f + 3 * U < b) reg_load<U>(b1, m, f + 3 * U, (int)min((long long)U, b - f - 3 * U), lane);
            }
            if (a < b && g != 0) flush();  // the last row block's partial
        } else {
            // mode 3: the loads alone (consume the registers so the loads are kept)
            unsigned sink = 0;
            for (long long f = a; f < b; f += 2 * U) {
                sink ^= b0.w[0][0].x ^ b1.w[0][0].y;
                if (f + 2 * U < b) reg_load<U>(b0, m, f + 2 * U, (int)min((long long)U, b - f - 2 * U), lane);
                if (f + 3 * U < b) reg_load<U>(b1, m, f + 3 * U, (int)min((long long)U, b - f - 3 * U), lane);
            }
            if (sink == 0x12345678u) rowpart[0] = 1.0f;
        }
        // the next matrix's first batches, before this one's sums and the dependency wait
        if (j + 1 < p.nmat) {
            long long v0, v1, na, nb;
            cta_range(p.mats[j + 1].units, c, P, v0, v1);
            warp_range(v0, v1, warp, na, nb);
            if (na < nb) reg_load<U>(b0, p.mats[j + 1], na, (int)min((long long)U, nb - na), lane);
            if (na + U < nb)
                reg_load<U>(b1, p.mats[j + 1], na + U, (int)min((long long)U, nb - na - U), lane);
        }
        named_barrier_sync(1, nthr);
        if (u1 > u0) {
            const long long rb_last = (u1 - 1) / G;
            const int rows = (int)(rb_last - rb_first + 1) * 32;
            const bool head = u0 % G != 0, tail = u1 % G != 0;
            float *bw = p.bws + (size_t)j * P * 64;
            for (int e = tid; e < rows; e += nthr) {
                const long long rb = rb_first + e / 32;
                float v = 0.0f;
                for (int w = 0; w < NW; ++w) {  // the warps whose ranges meet rb, in order
                    long long wa, wb;
                    warp_range(u0, u1, w, wa, wb);
                    if (wa < wb && wa / G <= rb && (wb - 1) / G >= rb)
                        v += rowpart[((rb - rb_first) * NW + w) * 32 + (e & 31)];
                }
                const int side = (head && rb == rb_first) ? 1 : (tail && rb == rb_last) ? 0 : -1;
                if (side < 0)
                    m.y[rb_first * 32 + e] = v;
                else
                    bw[((size_t)(side ? c : c + 1) * 2 + side) * 32 + (e & 31)] = v;
            }
            if (head || tail) {
                __threadfence();
                named_barrier_sync(1, nthr);
                if (tid < 2) {
                    const bool mine = tid == 0 ? head : tail;
                    const int id = tid == 0 ? c : c + 1;
                    s_last[tid] = mine ? (atomicAdd(p.bcount + (size_t)j * P + id, 1u) & 1u) : 0u;
                }
                named_barrier_sync(1, nthr);
                for (int t = 0; t < 2; ++t) {
                    if (!s_last[t]) continue;
                    __threadfence();
                    const int id = t == 0 ? c : c + 1;
                    const long long rb = t == 0 ? rb_first : rb_last;
                    if (tid < 32) {
                        const float *q = bw + (size_t)id * 64;
                        m.y[rb * 32 + tid] = __ldcg(q + tid) + __ldcg(q + 32 + tid);
                    }
                }
            }
        }
        __threadfence();
        named_barrier_sync(1, nthr);
        if (tid == 0) atomicAdd(p.counters + j, 1u);
        if (tid == 0 && st) st[3] = gtimer();
    }
    if (tid == 0) p.epochs[c] = epoch + 1;
}


// ---- per-warp rings (WR): REG's warp-owned ranges and fixed order, a shared-memory ring per warp --
// Warp w streams its contiguous share of the CTA's units of every matrix through its own `slots`
// slots of CH units (two bulk copies a slot: codes, scales; L2 evict-first), lane 0 refilling a
// slot as soon as the warp has consumed it, with the next chunk in the warp's walk, which crosses
// matrices: the ring never waits for activations, so at a boundary it holds the next matrix's
// first bytes. A warp meets a row block once: its partial goes to its own shared slot, summed in
// warp order at the matrix's end; boundaries, dependencies and producers as REG.
struct WrCursor {
    int j;
    long long pos, end;
};

template <int NW>
__device__ __forceinline__ bool wr_next(const SegParams &p, WrCursor &cu, int c, int P, int w,
                                        int CH, long long &f, int &n, int &jj, bool i32)
{
    while (cu.pos >= cu.end) {
        if (++cu.j >= p.nmat) return false;
        long long u0, u1;
        cta_range_any(p.mats[cu.j].units, c, P, i32, u0, u1);
        cu.pos = u0 + (u1 - u0) * w / NW, cu.end = u0 + (u1 - u0) * (w + 1) / NW;
    }
    n = (int)min((long long)CH, cu.end - cu.pos);
    f = cu.pos, jj = cu.j;
    cu.pos += n;
    return true;
}

// CH whole units of one ring slot inside one row block, unrolled (WR's fast path): immediate
// offsets from the slot's and the operand's bases, the same arithmetic as the loop below.
template <int CH, bool PACK, bool ZI>
__device__ __forceinline__ void wr_units(const uint8_t *sl, int i0, int cnt, const uint4 *act_xb, const float *act_xs,
                                         const int *act_sums, int g, int lane, int gid,
                                         const lane_consts<1> &lc, float (&acc)[2][2])
{
    const uint32_t *xp = reinterpret_cast<const uint32_t *>(act_xb) + g * 32 + lane;
    const uint4 *xq = act_xb + g * 32 + lane;
    const uint8_t *cb = sl + i0 * kUnitCodes + lane * 16;                 // the lane's codes
    const uint8_t *sb = sl + CH * kUnitCodes + i0 * kUnitScales + gid * 4;  // its scales
    act_sums += g, act_xs += g;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        if (i >= cnt) break;  // cnt < CH: a tail or a row block's end
        const uint4 w0 = *reinterpret_cast<const uint4 *>(cb + (i * 2 + 0) * 512);
        const uint4 w1 = *reinterpret_cast<const uint4 *>(cb + (i * 2 + 1) * 512);
        const uint32_t sc0 = *reinterpret_cast<const uint32_t *>(sb + (i * 2 + 0) * 32);
        const uint32_t sc1 = *reinterpret_cast<const uint32_t *>(sb + (i * 2 + 1) * 32);
        const uint4 bx = PACK ? unpack_slice(xp[i * 32]) : xq[i * 32];
        const int ns = act_sums[i] * lc.c_neg;
        const float xs = act_xs[i];
        const uint4 w[2] = {w0, w1};
        const uint32_t sc[2] = {sc0, sc1};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
            const uint32_t aa[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
            int d[4];
            if (ZI) {
                // C = 0 (RZ, no moves), ns added after: the same integers, so the same bits
                const int zero[4] = {0, 0, 0, 0};
                pq2_bmma_and_popc(d, aa, bx.x, bx.y, zero);
                pq2_bmma_and_popc(d, aa, bx.z, bx.w, d);
                acc[r][0] = fmaf((float)(d[0] + ns + lc.f2 * d[1]), wf.x * xs, acc[r][0]);
                acc[r][1] = fmaf((float)(d[2] + ns + lc.f2 * d[3]), wf.y * xs, acc[r][1]);
            } else {
                const int init[4] = {ns, 0, ns, 0};
                pq2_bmma_and_popc(d, aa, bx.x, bx.y, init);
                pq2_bmma_and_popc(d, aa, bx.z, bx.w, d);
                acc[r][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * xs, acc[r][0]);
                acc[r][1] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * xs, acc[r][1]);
            }
        }
    }
}

template <int NW, int CH, bool PACK>
__global__ void __launch_bounds__(NW * 32, 1) seg_wr_kernel(const SegParams p)
{
    constexpr int SLOT = CH * kUnitBytes;
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int GB = PACK ? 128 : 512;  // bit-slice bytes a group
    uint4 *act_xb = reinterpret_cast<uint4 *>(smem);
    float *act_xs = reinterpret_cast<float *>(smem + (size_t)p.gmax * GB);
    int *act_sums = reinterpret_cast<int *>(act_xs + p.gmax);
    float *rowpart = reinterpret_cast<float *>(smem + (((size_t)p.gmax * (GB + 8) + 15) & ~(size_t)15));
    float *xch = rowpart + (size_t)NW * p.wr_rbs * 32;  // NW * 32 float4
    uint8_t *rings = reinterpret_cast<uint8_t *>(xch + NW * 32 * 4);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2;
    const int c = blockIdx.x, P = gridDim.x, tid = threadIdx.x, nthr = NW * 32;
    uint8_t *ring = rings + (size_t)warp * p.slots * SLOT;
    uint64_t *full = reinterpret_cast<uint64_t *>(rings + (size_t)NW * p.slots * SLOT) + warp * p.slots;
    __shared__ unsigned s_epoch, s_last[2];
    __shared__ float s_red[8];
    __shared__ int s_lo[NW], s_hi[NW];  // each warp's row blocks of the matrix, from the CTA's first
    __shared__ __align__(8) uint64_t s_stage;  // the operand's bulk copy (modes 0, 2, 4)
    // mode 8: a tile's copy (its barrier, whether a warp issued it this matrix, its completed phases)
    __shared__ __align__(8) uint64_t s_tbar[32];
    __shared__ unsigned s_issued[32], s_tgen[32];
    if (lane == 0) {
        for (int s = 0; s < p.slots; ++s) mbar_init_count(full + s, 1);
        if (warp == 0) {
            mbar_init_count(&s_stage, 1);
            for (int t = 0; t < 32; ++t) mbar_init_count(s_tbar + t, 1), s_issued[t] = 0, s_tgen[t] = 0;
        }
        mbar_init_fence();
    }
    __shared__ unsigned s_pepoch;
    if (tid == 0) s_epoch = p.epochs[c], s_pepoch = p.pepochs[c];
    unsigned stagings = 0;
    __syncthreads();
    const unsigned epoch = s_epoch, pepoch = s_pepoch;
    uint64_t pol = 0;
    const int fm = (p.evict_first >> 1) & 3;  // the release at a matrix's end (below)
    const bool thermo = (p.evict_first >> 3) & 1;  // the thermometer core (below; no code 3)
    const bool unroll = (p.evict_first >> 4) & 1;  // whole chunks inside a row block unrolled
    const bool i32 = (p.evict_first >> 5) & 1;  // the ranges in 32-bit arithmetic
    const bool zi = (p.evict_first >> 6) & 1;   // the unrolled core's C operand zero, ns added after
    const int pf = p.evict_first >> 7;        // L2 prefetches this many chunks beyond the ring's copies
    // knockouts (timing only, wrong sums; spin_ns outside mode 4): 1 no operand copy, 2 no sums
    // leave the CTA (rows, shared row blocks), 4 no flush, 8 no start barrier, 16 no arithmetic,
    // 32 the shared row blocks' partials stored only (no atomic, no combine), 64 the operand's
    // copy issued at the previous matrix's walk end (mode 0); bits 8+: a spin of (ko >> 8) x 100 ns
    // at the matrix's start, every warp held
    const int ko = p.mode == 4 ? 0 : p.spin_ns;
    if (p.evict_first & 1)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
    WrCursor issue{-1, 0, 0};
    auto refill = [&](int s) {
        long long f;
        int n, jj;
        if (!wr_next<NW>(p, issue, c, P, warp, CH, f, n, jj, i32)) return;
        if (lane == 0) {
            const SegMat &mm = p.mats[jj];
            uint8_t *dst = ring + (size_t)s * SLOT;
            mbar_expect_tx(full + s, (uint32_t)n * kUnitBytes);
            bulk_copy_hint(full + s, dst, mm.codes + f * kUnitCodes, (uint32_t)n * kUnitCodes, pol);
            bulk_copy_hint(full + s, dst + CH * kUnitCodes, mm.scales + f * kUnitScales,
                           (uint32_t)n * kUnitScales, pol);
        }
    };
    WrCursor ahead{-1, 0, 0};
    auto prefetch = [&]() {
        long long f;
        int n, jj;
        if (!wr_next<NW>(p, ahead, c, P, warp, CH, f, n, jj, i32)) return;
        if (lane == 0) {
            const SegMat &mm = p.mats[jj];
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(mm.codes + f * kUnitCodes), "r"(n * kUnitCodes) : "memory");
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(mm.scales + f * kUnitScales), "r"(n * kUnitScales) : "memory");
        }
    };
    if (pf) {
        long long f;
        int n, jj;
        for (int s = 0; s < p.slots; ++s) wr_next<NW>(p, ahead, c, P, warp, CH, f, n, jj, i32);
        for (int i = 0; i < pf; ++i) prefetch();
    }
    for (int s = 0; s < p.slots; ++s) refill(s);
    const lane_consts<1> lc(lane);
    const float back = __int_as_float(0x3f800000 + ((lane & 3) << 24));
    auto lanesum = [&](float x) {
        float v = x * back;
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        return v;
    };
    auto issue_operand = [&](const SegMat &mo) {
        // the previous matrix's reads of the region (generic) before the copy's writes
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        mbar_expect_tx(&s_stage, (uint32_t)mo.G * (GB + 8));
        bulk_copy_plain(&s_stage, act_xb, PACK ? static_cast<const void *>(mo.xpack) : mo.xbits,
                        (uint32_t)mo.G * GB);
        bulk_copy_plain(&s_stage, act_xs, mo.xs, (uint32_t)mo.G * 4);
        bulk_copy_plain(&s_stage, act_sums, mo.sums, (uint32_t)mo.G * 4);
    };
    int ks = 0;        // the ring slot of the warp's next chunk, and its phase (no divisions)
    unsigned kph = 0;
    if (p.mode == 8 && thermo) __trap();  // mode 8's tile waits live in the unrolled path only
    for (int j = 0; j < p.nmat; ++j) {
        const SegMat &m = p.mats[j];
        long long u0, u1;
        cta_range_any(m.units, c, P, i32, u0, u1);
        const long long a = u0 + (u1 - u0) * warp / NW, b = u0 + (u1 - u0) * (warp + 1) / NW;
        const int G = m.G;
        const int ptiles = m.prod.kind != SEG_STATIC ? G / 8 : 0;  // tiles of 1024 a producer makes
        // mode 8: only the tiles' producers (and matrices with no producer) wait for the previous
        // matrix; the other CTAs wait for each tile as their walk reaches it
        const bool tiled = p.mode == 8 && ptiles;
        unsigned long long *st = p.stamps ? p.stamps + ((size_t)c * p.nmat + j) * 4 : nullptr;
        if (tid == 0) {
            if (st) st[0] = gtimer();
            if ((p.mode == 2 || p.mode == 4 || p.mode == 5 || p.mode == 7 || (p.mode == 8 && (!tiled || c < ptiles))) && j > 0) {
                const unsigned target = (epoch + 1) * (unsigned)P;
                const unsigned long long t0 = gtimer();
                while (ld_acquire(p.counters + j - 1) < target) {
                    __nanosleep(32);
                    if (gtimer() - t0 > 2000000000ull) {
                        printf("seg: CTA %d stuck at matrix %d\n", c, j);
                        __trap();
                    }
                }
            }
            const unsigned long long t1 = gtimer();
            if (st) st[1] = t1;
            if (p.mode == 4)
                while (gtimer() - t1 < (unsigned long long)p.spin_ns) {
                }
            else if (ko >> 8)  // a spin of (ko >> 8) x 100 ns, every warp held (no memory operation)
                while (gtimer() - t1 < 100ull * (unsigned long long)(ko >> 8)) {
                }
        }
        if (!(ko & 8) || p.mode == 8 || (ko >> 8)) named_barrier_sync(1, nthr);
        if ((p.mode == 7 || p.mode == 8) && ptiles) {
            // distributed producers: CTA c < ptiles makes tile c of the operand (the row's sum as
            // every CTA would) into the operand's global buffers, then arrives; every CTA waits for
            // all tiles and copies the operand in
            if (c < ptiles) {
                float *hbuf = PACK ? nullptr : reinterpret_cast<float *>(act_xb + (size_t)G * 32);
                uint4 *dst = PACK ? reinterpret_cast<uint4 *>(const_cast<uint32_t *>(m.xpack))
                                  : const_cast<uint4 *>(m.xbits);
                cta_produce<PACK>(m.prod, G, nthr, xch, hbuf, s_red, dst, const_cast<float *>(m.xs),
                                  const_cast<int *>(m.sums), c == 0, c);
                asm volatile("fence.proxy.async.global;" ::: "memory");
                if (fm == 0) __threadfence();
                named_barrier_sync(1, nthr);
                if (tid == (fm == 0 ? 0 : 1)) {
                    if (fm == 3) asm volatile("fence.acq_rel.gpu;" ::: "memory");
                    else if (fm != 0) __threadfence();
                    atomicAdd(p.mode == 7 ? p.pcounters + j : p.tcounters + (size_t)j * 32 + c, 1u);
                }
            }
            if (tid == 0 && p.mode == 7) {
                const unsigned target = (pepoch + 1) * (unsigned)ptiles;
                const unsigned long long t0 = gtimer();
                while (ld_acquire(p.pcounters + j) < target) {
                    __nanosleep(32);
                    if (gtimer() - t0 > 2000000000ull) {
                        printf("seg: CTA %d stuck at matrix %d's producers\n", c, j);
                        __trap();
                    }
                }
                // the other CTAs' generic stores, now visible here, to the bulk copy's reads
                asm volatile("fence.proxy.async.global;" ::: "memory");
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                mbar_expect_tx(&s_stage, (uint32_t)G * (GB + 8));
                bulk_copy_plain(&s_stage, act_xb, PACK ? static_cast<const void *>(m.xpack) : m.xbits,
                                (uint32_t)G * GB);
                bulk_copy_plain(&s_stage, act_xs, m.xs, (uint32_t)G * 4);
                bulk_copy_plain(&s_stage, act_sums, m.sums, (uint32_t)G * 4);
            }
            if (p.mode == 7) {
                mbar_wait(&s_stage, stagings & 1u);
                ++stagings;
            }
        } else if (p.mode >= 5 && m.prod.kind != SEG_STATIC) {
            float *hbuf = PACK ? nullptr : reinterpret_cast<float *>(act_xb + (size_t)G * 32);
            cta_produce<PACK>(m.prod, G, nthr, xch, hbuf, s_red, act_xb, act_xs, act_sums, c == 0);
        } else if (p.mode != 3 && !(ko & 1)) {
            // one bulk copy of the operand (static in this probe; the product's comes from the
            // producer inside): one round trip instead of a loop of loads; ko 64: issued at the
            // previous matrix's walk end instead (overlapping its sums), the first matrix's here
            if (tid == 0 && (!(ko & 64) || j == 0)) issue_operand(m);
            mbar_wait(&s_stage, stagings & 1u);
            ++stagings;
        }
        if (tid == 0 && st) st[2] = gtimer();
        const long long rb_first = div_any(u0, G, i32), wrb0 = div_any(a, G, i32);
        if (lane == 0) s_lo[warp] = a < b ? (int)(wrb0 - rb_first) : 1 << 30, s_hi[warp] = a < b ? (int)(div_any(b - 1, G, i32) - rb_first) : -1;
        float *mine = rowpart + (size_t)warp * p.wr_rbs * 32;
        float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        long long cur_rb = wrb0;
        int g = (int)(a - cur_rb * G);
        auto flush = [&]() {
            if (ko & 4) {
                acc[0][0] += acc[0][1] + acc[1][0] + acc[1][1];  // kept live, not stored
                return;
            }
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float v = lanesum(acc[r][h]);
                    if ((lane & 3) == 0) mine[(cur_rb - wrb0) * 32 + r * 16 + h * 8 + gid] = v;
                    acc[r][h] = 0.0f;
                }
        };
        // mode 8: tile t of the operand is in shared memory once bit t is set (this warp's view);
        // the first warp that needs a tile polls its producer's arrival and copies it in
        unsigned ready = tiled ? 0u : ~0u;
        auto need = [&](int g0, int cnt) {
            for (int t = g0 >> 3; t <= (g0 + cnt - 1) >> 3; ++t) {
                if ((ready >> t) & 1u) continue;
                if (lane == 0 && atomicCAS(s_issued + t, 0u, 1u) == 0u) {
                    const unsigned long long t0 = gtimer();
                    while (ld_acquire(p.tcounters + (size_t)j * 32 + t) < pepoch + 1) {
                        __nanosleep(32);
                        if (gtimer() - t0 > 2000000000ull) {
                            printf("seg: CTA %d stuck at matrix %d's tile %d\n", c, j, t);
                            __trap();
                        }
                    }
                    asm volatile("fence.proxy.async.global;" ::: "memory");
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    mbar_expect_tx(s_tbar + t, 8u * (GB + 8));
                    bulk_copy_plain(s_tbar + t, reinterpret_cast<uint8_t *>(act_xb) + (size_t)t * 8 * GB,
                                    (PACK ? reinterpret_cast<const uint8_t *>(m.xpack) : reinterpret_cast<const uint8_t *>(m.xbits)) +
                                        (size_t)t * 8 * GB, 8u * GB);
                    bulk_copy_plain(s_tbar + t, act_xs + t * 8, m.xs + t * 8, 32u);
                    bulk_copy_plain(s_tbar + t, act_sums + t * 8, m.sums + t * 8, 32u);
                }
                __syncwarp();
                mbar_wait(s_tbar + t, s_tgen[t] & 1u);
                ready |= 1u << t;
            }
        };
        for (long long f = a; f < b; f += CH) {
            const int n = (int)min((long long)CH, b - f);
            const int s = ks;
            mbar_wait(full + s, kph);
            if (++ks == p.slots) ks = 0, kph ^= 1u;
            if (ko & 16) {
                g = (int)((g + n) % G);  // the row-block walk without the arithmetic
            } else if (p.mode != 3 && (unroll || p.mode == 8) && !thermo) {
                // the slot's units unrolled, in pieces that end where a row block does
                const uint8_t *sl = ring + (size_t)s * SLOT;
                for (int i0 = 0; i0 < n;) {
                    const int take = min(n - i0, G - g);
                    if (tiled) need(g, take);
                    if (take == CH) {  // a whole slot: no tests between the units
                        if (zi) wr_units<CH, PACK, true>(sl, 0, CH, act_xb, act_xs, act_sums, g, lane, gid, lc, acc);
                        else wr_units<CH, PACK, false>(sl, 0, CH, act_xb, act_xs, act_sums, g, lane, gid, lc, acc);
                    } else if (zi) {
                        wr_units<CH, PACK, true>(sl, i0, take, act_xb, act_xs, act_sums, g, lane, gid, lc, acc);
                    } else {
                        wr_units<CH, PACK, false>(sl, i0, take, act_xb, act_xs, act_sums, g, lane, gid, lc, acc);
                    }
                    g += take, i0 += take;
                    if (g == G) {
                        g = 0;
                        flush();
                        ++cur_rb;
                    }
                }
            } else if (p.mode != 3) {
                const uint8_t *sl = ring + (size_t)s * SLOT;
                for (int i = 0; i < n; ++i) {
                    const uint4 w0 = *reinterpret_cast<const uint4 *>(sl + (i * 2 + 0) * 512 + lane * 16);
                    const uint4 w1 = *reinterpret_cast<const uint4 *>(sl + (i * 2 + 1) * 512 + lane * 16);
                    const uint32_t sc0 = *reinterpret_cast<const uint32_t *>(sl + CH * kUnitCodes + (i * 2 + 0) * 32 + gid * 4);
                    const uint32_t sc1 = *reinterpret_cast<const uint32_t *>(sl + CH * kUnitCodes + (i * 2 + 1) * 32 + gid * 4);
                    const uint4 bx = PACK ? unpack_slice(reinterpret_cast<const uint32_t *>(act_xb)[g * 32 + lane])
                                          : act_xb[g * 32 + lane];
                    const int ns = act_sums[g] * lc.c_neg;
                    const float xs = act_xs[g];
                    const uint4 w[2] = {w0, w1};
                    const uint32_t sc[2] = {sc0, sc1};
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
                        uint32_t aa[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
                        const int init[4] = {ns, 0, ns, 0};
                        int d[4];
                        if (thermo) {
                            // codes 0..2 as (e0 | e1, e1): one and-popc against the bits at both
                            // positions of a weight counts c = e0 + 2 e1 (exact while no code is 3)
#pragma unroll
                            for (int q = 0; q < 4; ++q) aa[q] |= (aa[q] >> 1) & 0x55555555u;
                            pq2_bmma_and_popc(d, aa, bx.x, bx.y, init);
                        } else {
                            pq2_bmma_and_popc(d, aa, bx.x, bx.y, init);
                            pq2_bmma_and_popc(d, aa, bx.z, bx.w, d);
                        }
                        acc[r][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * xs, acc[r][0]);
                        acc[r][1] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * xs, acc[r][1]);
                    }
                    if (++g == G) {
                        g = 0;
                        flush();
                        ++cur_rb;
                    }
                }
            }
            __syncwarp();
            refill(s);
            if (pf) prefetch();
        }
        if (p.mode != 3 && a < b && g != 0) flush();  // the last row block's partial
        named_barrier_sync(1, nthr);
        if ((ko & 64) && !(ko & 1) && p.mode == 0 && j + 1 < p.nmat && tid == 0) issue_operand(p.mats[j + 1]);
        if (u1 > u0 && p.mode != 3 && !(ko & 2)) {
            const long long rb_last = div_any(u1 - 1, G, i32);
            const int rows = (int)(rb_last - rb_first + 1) * 32;
            const bool head = u0 != rb_first * G, tail = u1 != div_any(u1, G, i32) * G;
            float *bw = p.bws + (size_t)j * P * 64;
            for (int e = tid; e < rows; e += nthr) {
                const int lr = e >> 5;
                const long long rb = rb_first + lr;
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < NW; ++w)  // the warps whose ranges meet rb, in order
                    if (s_lo[w] <= lr && lr <= s_hi[w])
                        v += rowpart[(w * p.wr_rbs + (lr - s_lo[w])) * 32 + (e & 31)];
                const int side = (head && rb == rb_first) ? 1 : (tail && rb == rb_last) ? 0 : -1;
                if (side < 0)
                    m.y[rb_first * 32 + e] = v;
                else
                    bw[((size_t)(side ? c : c + 1) * 2 + side) * 32 + (e & 31)] = v;
            }
            if ((head || tail) && !(ko & 32)) {  // ko 32: the shared row blocks' partials stored, not combined
                if (fm == 0) __threadfence();
                named_barrier_sync(1, nthr);
                if (tid < 2) {
                    const bool mine2 = tid == 0 ? head : tail;
                    const int id = tid == 0 ? c : c + 1;
                    if (fm == 3 && mine2) asm volatile("fence.acq_rel.gpu;" ::: "memory");
                    else if (fm != 0 && mine2) __threadfence();  // after the barrier: cumulative over the CTA's stores
                    s_last[tid] = mine2 ? (atomicAdd(p.bcount + (size_t)j * P + id, 1u) & 1u) : 0u;
                }
                named_barrier_sync(1, nthr);
                for (int t = 0; t < 2; ++t) {
                    if (!s_last[t]) continue;
                    __threadfence();
                    const int id = t == 0 ? c : c + 1;
                    const long long rb = t == 0 ? rb_first : rb_last;
                    if (tid < 32) {
                        const float *q = bw + (size_t)id * 64;
                        m.y[rb * 32 + tid] = __ldcg(q + tid) + __ldcg(q + 32 + tid);
                    }
                }
            }
        }
        // the release of the CTA's share: fm 0 every thread fences before the barrier; fm 1 the
        // barrier, then thread 1 (no copies of its own) fences (fence.sc) and adds; fm 2 the
        // barrier, then thread 1 adds with release semantics; fm 3 as 1 with fence.acq_rel
        if (fm == 0) {
            __threadfence();
            named_barrier_sync(1, nthr);
            if (tid == 0) atomicAdd(p.counters + j, 1u);
        } else {
            named_barrier_sync(1, nthr);
            if (tid == 1) {
                if (fm == 1) {
                    __threadfence();
                    atomicAdd(p.counters + j, 1u);
                } else if (fm == 3) {
                    asm volatile("fence.acq_rel.gpu;" ::: "memory");
                    atomicAdd(p.counters + j, 1u);
                } else {
                    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + j) : "memory");
                }
            }
        }
        if (tid == 0 && p.mode != 7 && c < ptiles) atomicAdd(p.pcounters + j, 1u);  // targets keep pace
        if (tid == 0 && p.mode != 8 && c < ptiles) atomicAdd(p.tcounters + (size_t)j * 32 + c, 1u);
        if (tid == 0 && tiled)  // after the matrix's end barrier: every issued copy has been waited for
            for (int t = 0; t < ptiles; ++t) s_tgen[t] += s_issued[t], s_issued[t] = 0;
        if (tid == 0 && st) st[3] = gtimer();
    }
    if (tid == 0) p.epochs[c] = epoch + 1, p.pepochs[c] = pepoch + 1;
}

// ---- host ---------------------------------------------------------------------------------

struct SegPlan {
    SegMat *d_mats;
    int nmat, gmax, gmin, rowacc_floats;
    unsigned *counters, *epochs, *bcount, *pcounters, *pepochs, *tcounters;
    float *bws;
    int grid;
};

template <int NW, int V> static size_t smem_bytes(const SegPlan &pl, int slots)
{
    return (size_t)slots * NW * V * kUnitBytes + 16 * slots + (((size_t)pl.gmax * 520 + 15) & ~(size_t)15) +
           (size_t)pl.rowacc_floats * 4 + (size_t)2 * NW * 64 * 4 + (size_t)NW * 32 * 16;
}

extern "C" {

void *seg_plan(const SegMat *mats, int nmat)
{
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    SegPlan *pl = new SegPlan();
    pl->nmat = nmat;
    pl->grid = prop.multiProcessorCount;
    pl->gmax = 0;
    pl->gmin = 1 << 30;
    long long rb = 0;
    for (int j = 0; j < nmat; ++j) {
        pl->gmax = mats[j].G > pl->gmax ? mats[j].G : pl->gmax;
        pl->gmin = mats[j].G < pl->gmin ? mats[j].G : pl->gmin;
        for (int c = 0; c < pl->grid; ++c) {
            long long u0, u1;
            u0 = mats[j].units * c / pl->grid, u1 = mats[j].units * (c + 1) / pl->grid;
            if (u1 > u0) {
                long long n = (u1 - 1) / mats[j].G - u0 / mats[j].G + 1;
                rb = n > rb ? n : rb;
            }
        }
    }
    pl->rowacc_floats = (int)rb * 32;
    cudaMalloc(&pl->d_mats, sizeof(SegMat) * nmat);
    cudaMemcpy(pl->d_mats, mats, sizeof(SegMat) * nmat, cudaMemcpyHostToDevice);
    cudaMalloc(&pl->counters, 4 * nmat);
    cudaMemset(pl->counters, 0, 4 * nmat);
    cudaMalloc(&pl->epochs, 4 * pl->grid);
    cudaMemset(pl->epochs, 0, 4 * pl->grid);
    cudaMalloc(&pl->bcount, (size_t)4 * nmat * pl->grid);
    cudaMemset(pl->bcount, 0, (size_t)4 * nmat * pl->grid);
    cudaMalloc(&pl->bws, (size_t)4 * 64 * nmat * pl->grid);
    cudaMalloc(&pl->pcounters, 4 * nmat);
    cudaMemset(pl->pcounters, 0, 4 * nmat);
    cudaMalloc(&pl->pepochs, 4 * pl->grid);
    cudaMemset(pl->pepochs, 0, 4 * pl->grid);
    cudaMalloc(&pl->tcounters, (size_t)4 * 32 * nmat);
    cudaMemset(pl->tcounters, 0, (size_t)4 * 32 * nmat);
    for (int j = 0; j < nmat; ++j)
        if (mats[j].prod.kind != SEG_STATIC && mats[j].G / 8 > 32) {
            fprintf(stderr, "seg: matrix %d: more than 32 operand tiles (mode 8)\n", j);
            return nullptr;
        }
    if (pl->gmax % 4 != 0) {  // the scales and sums regions' 16-byte alignment (bulk copies)
        fprintf(stderr, "seg: the largest group count %d is not a multiple of 4\n", pl->gmax);
        return nullptr;
    }
    for (int j = 0; j < nmat; ++j)
        if (mats[j].prod.kind == SEG_NORM &&
            2 * (size_t)mats[j].G > (size_t)pl->gmax) {
            fprintf(stderr, "seg: matrix %d: the norm's row does not fit the operand region\n", j);
            return nullptr;
        }
    for (int j = 0; j < nmat; ++j)
        if (mats[j].prod.kind != SEG_STATIC && mats[j].G % 8 != 0) {
            fprintf(stderr, "seg: matrix %d: a producer needs whole 1024-element tiles\n", j);
            return nullptr;
        }
    for (int j = 0; j < nmat; ++j)  // WR mode 7: one CTA a tile of the operand
        if (mats[j].prod.kind != SEG_STATIC && mats[j].G / 8 > pl->grid) {
            fprintf(stderr, "seg: matrix %d has more operand tiles than CTAs\n", j);
            return nullptr;
        }
    // DET needs at most two CTAs on a row block: every CTA's range at least one row block
    for (int j = 0; j < nmat; ++j)
        if (mats[j].units / pl->grid < mats[j].G) {
            fprintf(stderr, "seg: matrix %d has CTA ranges below a row block\n", j);
            return nullptr;
        }
    return pl;
}

int seg_grid(void *h) { return static_cast<SegPlan *>(h)->grid; }

// WR: the most row blocks one warp's range meets, over the matrices and CTAs (NW warps).
static int wr_rbs_of(const SegPlan &pl, int nw)
{
    static std::vector<SegMat> host;
    if ((int)host.size() != pl.nmat) {
        host.resize(pl.nmat);
        cudaMemcpy(host.data(), pl.d_mats, sizeof(SegMat) * pl.nmat, cudaMemcpyDeviceToHost);
    }
    long long most = 1;
    for (int j = 0; j < pl.nmat; ++j)
        for (int c = 0; c < pl.grid; ++c) {
            const long long U = host[j].units, G = host[j].G;
            const long long u0 = U * c / pl.grid, u1 = U * (c + 1) / pl.grid;
            for (int w = 0; w < nw; ++w) {
                const long long a = u0 + (u1 - u0) * w / nw, b = u0 + (u1 - u0) * (w + 1) / nw;
                if (b > a) most = std::max(most, (b - 1) / G - a / G + 1);
            }
        }
    return (int)most;
}

static size_t wr_smem(const SegPlan &pl, int nw, int ch, int slots, int rbs, bool pack)
{
    return (((size_t)pl.gmax * (pack ? 136 : 520) + 15) & ~(size_t)15) + (size_t)nw * rbs * 32 * 4 + (size_t)nw * 32 * 16 +
           (size_t)nw * slots * ch * kUnitBytes + (size_t)nw * slots * 8;
}

int seg_wr_max_slots(void *h, int nw, int ch, int pack)
{
    SegPlan &pl = *static_cast<SegPlan *>(h);
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    const int rbs = wr_rbs_of(pl, nw);
    for (int s = 64; s >= 1; --s)
        if (wr_smem(pl, nw, ch, s, rbs, pack != 0) + 1024 <= (size_t)optin) return s;  // + the static shared (640-768 B)
    return 0;
}

// Largest slot count that fits for (NW, V), or the error.
int seg_max_slots(void *h, int nw, int v)
{
    SegPlan &pl = *static_cast<SegPlan *>(h);
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    for (int s = 64; s >= 1; --s) {
        size_t b = (size_t)s * nw * v * kUnitBytes + 16 * s + (((size_t)pl.gmax * 520 + 15) & ~(size_t)15) +
                   (size_t)pl.rowacc_floats * 4 + (size_t)2 * nw * 64 * 4 +
                   (size_t)nw * 32 * 16 + 64;
        if (b <= (size_t)optin) return s;
    }
    return 0;
}

int seg_launch(void *h, int nw, int v, int det, int slots, int mode, int spin_ns, int evict_first,
               int dump, unsigned long long *stamps, cudaStream_t stream)
{
    SegPlan &pl = *static_cast<SegPlan *>(h);
    if (det == 1 && nw * v > pl.gmin) return -3;  // DET: a slot meets at most two row blocks
    SegParams p{pl.d_mats, pl.nmat, pl.counters, pl.epochs, stamps, mode, spin_ns, slots,
                evict_first, pl.gmax, pl.rowacc_floats, pl.bws, pl.bcount, dump};
    cudaError_t e = cudaSuccess;
#define SEG_CASE(NW_, V_, DET_)                                                                          \
    if (det <= 1 && nw == NW_ && v == V_ && (det != 0) == DET_) {                                                                    \
        const size_t sm = smem_bytes<NW_, V_>(pl, slots);                                          \
        static size_t set_to = 0; /* attribute and occupancy once (not under capture) */           \
        if (sm > set_to)                                                                           \
            e = cudaFuncSetAttribute(seg_kernel<NW_, V_, DET_>,                                          \
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);        \
        if (e == cudaSuccess) {                                                                    \
            if (sm > set_to) {                                                                     \
                int occ = 0;                                                                       \
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, seg_kernel<NW_, V_, DET_>,           \
                                                              (NW_ + 1) * 32, sm);                 \
                if (occ < 1) return -2;                                                            \
                set_to = sm;                                                                       \
            }                                                                                      \
            seg_kernel<NW_, V_, DET_><<<pl.grid, (NW_ + 1) * 32, sm, stream>>>(p);                       \
            e = cudaGetLastError();                                                                \
        }                                                                                          \
        return e == cudaSuccess ? 0 : (int)e;                                                      \
    }
#define SEG_REG_CASE(NW_, U_)                                                                      \
    if (det == 2 && nw == NW_ && v == U_) {                                                        \
        const size_t sm = (((size_t)pl.gmax * 520 + 15) & ~(size_t)15) +                           \
                          (size_t)pl.rowacc_floats * NW_ * 4 + (size_t)NW_ * 32 * 16;              \
        static size_t set_to = 0;                                                                  \
        if (sm > set_to)                                                                           \
            e = cudaFuncSetAttribute(seg_reg_kernel<NW_, U_>,                                      \
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);        \
        if (e == cudaSuccess) {                                                                    \
            if (sm > set_to) {                                                                     \
                int occ = 0;                                                                       \
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, seg_reg_kernel<NW_, U_>,       \
                                                              NW_ * 32, sm);                       \
                if (occ < 1) return -2;                                                            \
                set_to = sm;                                                                       \
            }                                                                                      \
            seg_reg_kernel<NW_, U_><<<pl.grid, NW_ * 32, sm, stream>>>(p);                         \
            e = cudaGetLastError();                                                                \
        }                                                                                          \
        return e == cudaSuccess ? 0 : (int)e;                                                      \
    }
#define SEG_WR_CASE(NW_, CH_, PACK_)                                                               \
    if (det == 3 + PACK_ && nw == NW_ && v == CH_) {                                               \
        static int rbs = 0;                                                                        \
        if (!rbs) rbs = wr_rbs_of(pl, NW_);                                                        \
        p.wr_rbs = rbs;                                                                            \
        p.pcounters = pl.pcounters, p.pepochs = pl.pepochs, p.tcounters = pl.tcounters;            \
        const size_t sm = wr_smem(pl, NW_, CH_, slots, rbs, PACK_);                                \
        static size_t set_to = 0;                                                                  \
        if (sm > set_to)                                                                           \
            e = cudaFuncSetAttribute(seg_wr_kernel<NW_, CH_, PACK_>,                                      \
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);        \
        if (e == cudaSuccess) {                                                                    \
            if (sm > set_to) {                                                                     \
                int occ = 0;                                                                       \
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, seg_wr_kernel<NW_, CH_, PACK_>,       \
                                                              NW_ * 32, sm);                       \
                if (occ < 1) return -2;                                                            \
                set_to = sm;                                                                       \
            }                                                                                      \
            seg_wr_kernel<NW_, CH_, PACK_><<<pl.grid, NW_ * 32, sm, stream>>>(p);                         \
            e = cudaGetLastError();                                                                \
        }                                                                                          \
        return e == cudaSuccess ? 0 : (int)e;                                                      \
    }
    SEG_WR_CASE(8, 4, 0)
    SEG_WR_CASE(8, 8, 0)
    SEG_WR_CASE(16, 2, 0)
    SEG_WR_CASE(16, 4, 0)
    SEG_WR_CASE(8, 4, 1)
    SEG_WR_CASE(8, 6, 1)
    SEG_WR_CASE(16, 2, 1)
    SEG_WR_CASE(16, 3, 1)
    SEG_REG_CASE(16, 2)
    SEG_REG_CASE(16, 4)
    SEG_CASE(16, 1, false)
    SEG_CASE(16, 2, false)
    SEG_CASE(8, 2, false)
    SEG_CASE(16, 1, true)
    SEG_CASE(16, 2, true)
    SEG_CASE(8, 2, true)
    return -1;
}
}
