// td.cu - LAB (issue 36, not product): the tile dataflow's stall structure on synthetic data.
// One CTA per SM: NW consumer warps, one operand warp, one producer warp. The 27B's 257 matrices
// (m = 1 step order) are cut into cells of one row block x one K tile (8 units, 8.7 KB); cell i of
// a matrix belongs to warp i mod (P NW) of the grid, so the whole grid walks every matrix in the
// same order: K-major (every row block's K tile 0, then tile 1, ...) or output-major (output tile
// 0's row blocks over all of K, then tile 1's). A consumer warp streams its cells through its own
// bulk-copy ring, waits for the cell's operand tile in shared memory, runs the product's m = 1
// core, stores the cell's 32 partial sums and releases its output tile's counter (no barrier, no
// atomic with a return). The producer warps make the operand tiles: task (j, t) waits for matrix
// j-1's output tile t (tile-local: SwiGLU, or a norm with rstd applied after Q8) or for all of its
// tiles (a full boundary: the host, an exact norm), spins prod_ns (the producer's arithmetic),
// writes the 4 KB tile and releases it. The operand warp polls the tiles' flags lane-parallel and
// bulk-copies each ready tile into a ring of TS tile slots. Variants:
//   0 no dependency (every tile ready at once), K-major walks;
//   1 every boundary full (WR's structure), K-major walks;
//   2 exact norms: host, norm and norm boundaries full, SwiGLU tile-local (gate_up output-major,
//     down K-major);
//   3 rstd after Q8: out -> gate_up and down -> in_proj tile-local, host and SwiGLU full.
// needed 0: the operand warp copies every tile of every matrix into its CTA; needed 1: only the
// tiles its consumer warps' cells use (a slot's barrier phase is then counted by its copies).
// bal 1: cell i goes to CTA i mod P and the CTA's cells to its warps in turn, so the CTAs' shares
// of a matrix differ by at most one cell (bal 0: warp i mod (P NW), up to 1.4x between CTAs).
// red 1 (the realistic partials): a cell's warp arrives on its row block's counter with an atomic
// that returns; the row block's last arrival sums its nk partials in K order (one round trip) into
// the row block's 32 sums and counts the row block on its output tile, and producers read sums
// (4 KB a tile in the product) instead of every K tile's partials. fused 1: the row block's last
// arrival takes the tile's count with a return too, and the tile's last arrival makes the
// successor's tile-local operand tile itself (no producer warp poll, one hop fewer).
// prodns -1 (with red): real producers instead of the spin: the tile's row-block sums through
// SwiGLU or the norm (exact, with the whole row's sum, at a full boundary; rstd left out at a
// tile-local one) or none (the host's output), the signs, the 1024-wide transform in one warp and
// the product's q8_store_group, stored aside (the consumers keep the hashed tiles).
// own 1 (with red): no producer warps and no copies; each CTA's operand warp waits for the
// dependency of every tile its cells use and writes the tile into its shared-memory slot itself
// (the activation recomputed in every CTA, as Hazy's megakernel does), then arrives on the slot.
// Stamps (one untimed launch a variant and mode: bal 0, bal 1, red, red fused, red own): each boundary's
// skew, dependency seen, tile made, copy issued and first tile ready, medians by the role of the
// matrix after it.
// Checked: every variant's partial sums bit-identical to variant 0's (poisoned before each check),
// two epochs each with needed 0, needed 1, bal 1, red, red fused, red fused with real producers
// (prodns -1), own with real producers and own with the spin; with red the row blocks' sums equal
// the host's additions of variant 0's partials in the same order. Timed: 3 rounds, alternating;
// producer spins 0 / 1 us, and real producers. Stall cycles a warp: ring waits, tile waits.
//     nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-td lab/seg/td.cu
//     build/lab-td [out.json]
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "device/ptx.cuh"
#include "quantize/q8_group.cuh"
#include "rotate/hadamard.cuh"
#include "rowblock/activations.cuh"

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

constexpr int kUnit = 1088;            // 32 rows x 128 weights: 1024 code bytes + 32 fp16 scale pairs
constexpr int kCell = 8 * kUnit;       // one row block x one K tile of 1024
constexpr int kTile = 4096 + 64;       // an operand tile: 8 groups of 512 B bit slices, 8 xs, 8 sums
constexpr int NW = 8, SL = 2, TS = 20;  // consumer warps, ring slots a warp, operand tile slots
constexpr int kMaxTiles = 2176;        // the step's operand tiles (2117), for the slot map
constexpr size_t kSmem = (size_t)NW * SL * kCell + (size_t)TS * kTile + 8 * (NW * SL + TS);

struct Mat {
    long long u0;     // first unit in base
    long long pbase;  // first partial (floats)
    int nb, nk;       // row blocks, K tiles
    int walk;         // 0 K-major, 1 output-major
    int paired;       // output tile t = row blocks [32t, 32t + 32) and [nb/2 + 32t, ...) (gate_up)
    int dep;          // 0 none, 1 tile-local (tile t needs j-1's output tile t), 2 all of j-1's
    int nout;         // output tiles (counters), <= 32 where a successor waits on them
    int tbase;        // the global sequence number of its first operand tile
    int rb0;          // its first row block in the step's row-block numbering (red 1)
    int src;          // its operand's producer (real producers): 0 rotate (the host's output),
                      // 1 RMSNorm (exact at a full boundary, rstd left out at a tile-local one),
                      // 2 SwiGLU (of a paired predecessor)
};

struct TP {
    const uint8_t *base;
    const Mat *mats;
    int nmat, ntiles;
    const int *cnt;     // [nmat][32] cells an output tile
    unsigned *done;     // [nmat][32] cells finished (never reset; target cnt (depoch + 1))
    unsigned *ready;    // [nmat][32] operand tiles made (target rdy_epoch + 1)
    uint8_t *op;        // [ntiles][kTile]
    float *part;        // the cells' partial sums
    unsigned epoch;
    unsigned depoch;    // launches before this one that released the done counters
    int prod_ns, compute;
    int needed;         // 1: a CTA copies only the tiles its warps' cells use; 0: every tile
    int rel;            // 0: no per-cell release (variant 0 only: the protocol's release cost)
    int bal;            // cells to warps: 0 round-robin over the grid's warps (cell i to warp
                        // i mod T), 1 over the CTAs first (cell i to CTA i mod P, its warps in turn):
                        // CTAs' shares differ by at most one cell; cell i runs in round i / T either way
    // red 1: each row block's cells arrive on its counter (an atomic with a return); the last
    // arrival sums the row block's partials in K order into fin and counts the row block on its
    // output tile (done_r: row blocks, target rbs (repoch + 1)); producers read fin, not partials.
    // fused 1 (with red 1): the row block's last arrival also takes its output tile's count with a
    // return, and the tile's last arrival makes the successor's operand tile itself when that
    // tile is tile-local (no producer warp, no second flag hop).
    int red, fused;
    // own 1 (with red, not fused): no producer warps and no copies. Each CTA's operand warp waits
    // for the dependency of every tile its cells use and makes the tile itself, straight into its
    // shared-memory slot (the Hazy pattern: the activation recomputed in every CTA), then arrives
    // on the slot's barrier. The ready flags are not touched (rdy_epoch counts launches that do).
    int own;
    unsigned rdy_epoch;
    unsigned *rbcnt;    // [row blocks] arrivals (target nk (repoch + 1))
    unsigned *done_r;   // [nmat][32] row blocks finished
    float *fin;         // [row blocks][32] the row blocks' sums
    unsigned repoch;    // red launches before this one
    // prod_ns < 0 (with red): real producers. make_tile reads the tile's 1024 row-block sums
    // (SwiGLU: gate and up), adds a residual and the norm weight (an exact norm reads the whole
    // previous output for its row sum), applies the signs, the 1024-wide transform and Q8 with the
    // product's device functions, and stores the result to qs / qsum / qbits (not read: the
    // consumers keep the hashed tiles, so the bits checks hold); the spin is not run.
    const float *resid, *nw;
    const int8_t *sg;
    float *qs;
    int32_t *qsum;
    uint32_t *qbits;
    int stamps;         // 1: record the boundaries' times in stamp (costs atomics; not timed)
    unsigned long long *stamp;  // [nmat][8]: see the enum below
    unsigned long long *wstat;  // [P][NW][2] cycles: ring waits, tile waits
};

__device__ __forceinline__ unsigned ld_acq(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// stamp fields a matrix: consumers' last cell done (min, max over warps), producers' dependency
// seen and tile released (max over tiles), the operand warps' last copy issued (max over CTAs),
// consumers' first tile ready (min, max over warps)
enum { kEndMin, kEndMax, kSeenMax, kProdMax, kCopyMax, kStartMin, kStartMax, kStampFields = 8 };

__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void stuck(unsigned long long t0, const char *what, int c, int j, int t)
{
    if (gtime() - t0 > 2000000000ull) {
        printf("td: CTA %d stuck on %s, matrix %d tile %d\n", c, what, j, t);
        __trap();
    }
}

__device__ __forceinline__ bool mbar_try(uint64_t *bar, unsigned parity)
{
    unsigned ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    return ok != 0;
}

// waits for the phase of `parity`, trapping with a message after 2 s
__device__ __forceinline__ void mbar_wait_t(uint64_t *bar, unsigned parity, const char *what, int c, int j, int t)
{
    if (mbar_try(bar, parity)) return;
    const unsigned long long t0 = gtime();
    while (!mbar_try(bar, parity)) stuck(t0, what, c, j, t);
}

__device__ __forceinline__ void bulk_pol(uint64_t *bar, void *dst, const void *src, uint32_t bytes, uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
                 : "memory");
}

__device__ __forceinline__ void bulk(uint64_t *bar, void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

// cell i of matrix m: its row block, K tile and output tile
__device__ __forceinline__ void cell_of(const Mat &m, int i, int &rb, int &kt, int &ot)
{
    if (m.walk == 0) {
        kt = i / m.nb, rb = i - kt * m.nb;
        ot = m.paired ? (rb < m.nb / 2 ? rb : rb - m.nb / 2) / 32 : rb / 32;
    } else {
        const int R = m.paired ? 64 : 32, per = R * m.nk;
        ot = i / per;
        const int rem = i - ot * per, r = rem / m.nk;
        kt = rem - r * m.nk;
        rb = m.paired ? (r < 32 ? 32 * ot + r : m.nb / 2 + 32 * ot + r - 32) : 32 * ot + r;
    }
}

// the unit at u (codes +0 / +512, scales +1024) against operand group g of a tile slot
__device__ __forceinline__ void unit(const uint8_t *u, const uint8_t *tile, int g, int lane, int gid,
                                     const lane_consts<1> &lc, float (&acc)[2][2])
{
    const uint4 w0 = *reinterpret_cast<const uint4 *>(u + lane * 16);
    const uint4 w1 = *reinterpret_cast<const uint4 *>(u + 512 + lane * 16);
    const uint32_t sc0 = *reinterpret_cast<const uint32_t *>(u + 1024 + gid * 4);
    const uint32_t sc1 = *reinterpret_cast<const uint32_t *>(u + 1024 + 32 + gid * 4);
    const uint4 bx = reinterpret_cast<const uint4 *>(tile)[g * 32 + lane];
    const float xs = reinterpret_cast<const float *>(tile + 4096)[g];
    const int ns = reinterpret_cast<const int *>(tile + 4128)[g] * lc.c_neg;
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
}

__device__ __forceinline__ unsigned atom_add_acq_rel(unsigned *p)
{
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
    return old;
}

// the 1024-wide transform of the lane's 8 x 4 values (lane L holds group w's elements 4L..4L+3),
// stage by stage as hadamard_block with log2b = 10 (lab/seg/tprod.cu checks the bits)
__device__ __forceinline__ void hadamard_1024_warp(float (&v)[8][4], int lane)
{
#pragma unroll
    for (int w = 0; w < 8; ++w) butterfly(v[w][0], v[w][1]), butterfly(v[w][2], v[w][3]);
#pragma unroll
    for (int w = 0; w < 8; ++w) butterfly(v[w][0], v[w][2]), butterfly(v[w][1], v[w][3]);
#pragma unroll
    for (int bit = 2; bit < 7; ++bit) {
        const int mask = 1 << (bit - 2);
        const float sign = stage_sign(lane & mask);
#pragma unroll
        for (int w = 0; w < 8; ++w)
#pragma unroll
            for (int j = 0; j < 4; ++j) v[w][j] = stage_update(v[w][j], __shfl_xor_sync(0xffffffffu, v[w][j], mask), sign);
    }
#pragma unroll
    for (int s = 0; s < 3; ++s)
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            if (w & (1 << s)) continue;
            const int h = w | (1 << s);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float lo = v[w][j], hi = v[h][j];
                v[w][j] = stage_update(lo, hi, stage_sign(false));
                v[h][j] = stage_update(hi, lo, stage_sign(true));
            }
        }
}

// The real producer of operand tile t of matrix j (prod_ns < 0, red): returns 0 x the sum of
// the values it read (NaN if it read a sum before it was written).
// slot: the CTA's shared-memory tile slot to write the Q8 result into (own), or NULL: the global
// scratch qs / qsum / qbits
__device__ __forceinline__ float real_tile(const TP &p, int j, int t, int dep, int lane, uint8_t *slot)
{
    const Mat &m = p.mats[j], &a = p.mats[j - 1];
    const int task = m.tbase + t;
    const float *x = p.fin + (size_t)(a.rb0 + 32 * t) * 32;
    float v[8][4], raw = 0.0f;
    if (m.src == 2) {  // SwiGLU of the paired predecessor: gate rows 32t.., up rows nb/2 + 32t..
        const float *up = p.fin + (size_t)(a.rb0 + a.nb / 2 + 32 * t) * 32;
        float4 g[8], u[8];
#pragma unroll
        for (int w = 0; w < 8; ++w)
            g[w] = __ldcg(reinterpret_cast<const float4 *>(x + 128 * w + 4 * lane)),
            u[w] = __ldcg(reinterpret_cast<const float4 *>(up + 128 * w + 4 * lane));
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const float gg[4] = {g[w].x, g[w].y, g[w].z, g[w].w}, uu[4] = {u[w].x, u[w].y, u[w].z, u[w].w};
#pragma unroll
            for (int k = 0; k < 4; ++k) v[w][k] = gg[k] / (1.0f + expf(-gg[k])) * uu[k], raw += gg[k] + uu[k];
        }
    } else {
        float4 xv[8], rv[8], wv[8];
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const int e = 1024 * t + 128 * w + 4 * lane;
            xv[w] = __ldcg(reinterpret_cast<const float4 *>(x + 128 * w + 4 * lane));
            rv[w] = *reinterpret_cast<const float4 *>(p.resid + e);
            wv[w] = *reinterpret_cast<const float4 *>(p.nw + e);
        }
        float scale = 1.0f;
        if (m.src == 1 && dep == 2) {  // the exact norm: the whole previous output's sum of squares
            const float *row = p.fin + (size_t)a.rb0 * 32;
            const int W = a.nb * 32;
            float ss = 0.0f;
            for (int i0 = 4 * lane; i0 < W; i0 += 128 * 8) {
                float4 hv[8], r2[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int i = min(i0 + 128 * u, W - 4);
                    hv[u] = __ldcg(reinterpret_cast<const float4 *>(row + i));
                    r2[u] = *reinterpret_cast<const float4 *>(p.resid + i);
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    if (i0 + 128 * u >= W) break;
                    const float h[4] = {hv[u].x + r2[u].x, hv[u].y + r2[u].y, hv[u].z + r2[u].z, hv[u].w + r2[u].w};
                    raw += hv[u].x + hv[u].y + hv[u].z + hv[u].w;
#pragma unroll
                    for (int k = 0; k < 4; ++k) ss = fmaf(h[k], h[k], ss);
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
            scale = 1.0f / sqrtf(ss / (float)W + 1e-6f);
        }
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const float xx[4] = {xv[w].x, xv[w].y, xv[w].z, xv[w].w}, rr[4] = {rv[w].x, rv[w].y, rv[w].z, rv[w].w};
            const float ww[4] = {wv[w].x, wv[w].y, wv[w].z, wv[w].w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                raw += xx[k];
                v[w][k] = m.src == 0 ? xx[k] : (xx[k] + rr[k]) * scale * ww[k];
            }
        }
    }
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        const char4 sg = *reinterpret_cast<const char4 *>(p.sg + 1024 * t + 128 * w + 4 * lane);
        v[w][0] *= sg.x, v[w][1] *= sg.y, v[w][2] *= sg.z, v[w][3] *= sg.w;
    }
    hadamard_1024_warp(v, lane);
#pragma unroll
    for (int w = 0; w < 8; ++w) {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[w][k] *= 0.03125f;
        if (slot) {  // the tile format: bit slices, then 8 scales at +4096 and 8 sums at +4128
            q8_store_group(v[w], lane, 0, w, w, 1, 128, nullptr, reinterpret_cast<float *>(slot + 4096),
                           reinterpret_cast<int32_t *>(slot + 4128), reinterpret_cast<uint32_t *>(slot), nullptr);
        } else {
            const int g = task * 8 + w;
            q8_store_group(v[w], lane, 0, g, g, 1, 128, nullptr, p.qs, p.qsum, p.qbits, nullptr);
        }
    }
    return __fmul_rn(0.0f, raw);
}

// Operand tile t of matrix j, made by the calling warp once its dependency is met: the
// dependency's data (matrix j-1's first and last row block of the tile or of the matrix: every K
// tile's partials, or with red the row blocks' sums) read in one round trip, a spin for the
// producer's arithmetic, then the tile (a function of its sequence number and the data: a value
// read before it was written is the poison, NaN, and spoils xs through 0 x NaN) and its flag.
// The dependency's data for tile t of matrix j (0 x its values, summed over the warp), and with
// real producers their arithmetic; then the spin.
// REAL: the kernel instance that can run real producers (its registers spill a little; the
// other rows run the instance without them).
template <bool REAL>
__device__ __forceinline__ float tile_dv(const TP &p, int j, int t, int dep, int lane, uint8_t *slot = nullptr)
{
    float dv = 0.0f;
    if (REAL && dep && p.red && p.prod_ns < 0) {
        dv = real_tile(p, j, t, dep, lane, slot);
        dv += __shfl_xor_sync(~0u, dv, 1), dv += __shfl_xor_sync(~0u, dv, 2);
        dv += __shfl_xor_sync(~0u, dv, 4), dv += __shfl_xor_sync(~0u, dv, 8);
        dv += __shfl_xor_sync(~0u, dv, 16);
    } else if (dep) {
        const Mat &a = p.mats[j - 1];
        const int r0 = dep == 1 ? 32 * t : 0;
        const int r1 = dep != 1 ? a.nb - 1 : a.paired ? a.nb / 2 + 32 * t + 31 : min(32 * t + 31, a.nb - 1);
        if (p.red) {
            dv = __ldcg(p.fin + (size_t)(a.rb0 + r0) * 32 + lane) + __ldcg(p.fin + (size_t)(a.rb0 + r1) * 32 + lane);
        } else {  // every load issued before the first add: one round trip, not 2 nk
            float v0[17], v1[17];
#pragma unroll
            for (int k = 0; k < 17; ++k) {
                v0[k] = k < a.nk ? __ldcg(p.part + a.pbase + ((long long)k * a.nb + r0) * 32 + lane) : 0.0f;
                v1[k] = k < a.nk ? __ldcg(p.part + a.pbase + ((long long)k * a.nb + r1) * 32 + lane) : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 17; ++k) dv += v0[k] + v1[k];
        }
        dv = __fmul_rn(0.0f, dv);
        dv += __shfl_xor_sync(~0u, dv, 1), dv += __shfl_xor_sync(~0u, dv, 2);
        dv += __shfl_xor_sync(~0u, dv, 4), dv += __shfl_xor_sync(~0u, dv, 8);
        dv += __shfl_xor_sync(~0u, dv, 16);
    }
    if (lane == 0 && p.prod_ns > 0)
        for (const unsigned long long s0 = gtime(); gtime() - s0 < (unsigned long long)p.prod_ns;) {
        }
    __syncwarp();
    return dv;
}

// the tile's content: bit slices, xs, sums, a function of its sequence number and dv
__device__ __forceinline__ void write_tile(uint8_t *dst, int task, float dv, int lane)
{
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const unsigned e = (unsigned)(q * 32 + lane), h = 0x9e3779b9u * (unsigned)(task + 1) + e * 0x85ebca6bu;
        reinterpret_cast<uint4 *>(dst)[e] = make_uint4(h, h ^ 0xa5a5a5a5u, h * 3u, h + 0x3c6ef372u);
    }
    if (lane < 8) reinterpret_cast<float *>(dst + 4096)[lane] = 1.0f / (float)(1 + ((task + lane) & 7)) + dv;
    else if (lane < 16) reinterpret_cast<int *>(dst + 4128)[lane - 8] = (task * 7 + lane) & 63;
}

template <bool REAL> __device__ __forceinline__ void make_tile(const TP &p, int j, int t, int dep, int lane)
{
    if (p.stamps && lane == 0) atomicMax(p.stamp + (size_t)j * kStampFields + kSeenMax, gtime());
    const int task = p.mats[j].tbase + t;
    const float dv = tile_dv<REAL>(p, j, t, dep, lane);
    write_tile(p.op + (size_t)task * kTile, task, dv, lane);
    __syncwarp();
    if (lane == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.ready + j * 32 + t) : "memory");
        if (p.stamps) atomicMax(p.stamp + (size_t)j * kStampFields + kProdMax, gtime());
    }
}

template <bool REAL> __global__ void __launch_bounds__((NW + 2) * 32, 1) td_kernel(const TP p)
{
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t *rings = smem;
    uint8_t *tiles = smem + (size_t)NW * SL * kCell;
    uint64_t *full = reinterpret_cast<uint64_t *>(tiles + (size_t)TS * kTile);  // [NW][SL]
    uint64_t *tfull = full + NW * SL;                                            // [TS]
    // Tile slots are taken in copy order. s_tseq: a slot's current tile (its sequence number);
    // s_slot: the slot of tile seq (-1 before its copy), written after s_tseq, so a consumer that
    // finds its tile in the map finds the slot holding it. A slot is refilled once the consumers
    // have finished every cell that uses its tile (s_used reaches s_expect, the CTA's cells on
    // the slot's tiles so far), so a tile-local wait stays tile-local inside the CTA too (with
    // needed 1; with needed 0, in_proj's copies reuse the slots of down's last tiles).
    // s_tpar: the parity of the barrier phase that the slot's current copy completes (the slot's
    // copies counted); s_tload: copies issued into the slot so far; s_cnt: the operand warp's
    // count of the CTA's cells on each K tile of the matrix it is at
    __shared__ volatile int s_tseq[TS], s_tpar[TS], s_used[TS];
    __shared__ int s_tload[TS], s_expect[TS], s_cnt[32];
    __shared__ volatile signed char s_slot[kMaxTiles];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = blockIdx.x, P = gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NW * SL; ++s) mbar_init_count(full + s, 1);
        for (int s = 0; s < TS; ++s)
            mbar_init_count(tfull + s, 1), s_tseq[s] = -1, s_tpar[s] = 0, s_tload[s] = 0, s_used[s] = 0, s_expect[s] = 0;
        mbar_init_fence();
    }
    for (int i = threadIdx.x; i < kMaxTiles; i += blockDim.x) s_slot[i] = -1;
    __syncthreads();
    const unsigned target = p.rdy_epoch + 1, dtarget = p.red ? p.repoch + 1 : p.depoch + 1;
    const unsigned *done = p.red ? p.done_r : p.done;
    // the tile counters' target unit: cells a tile, or with red row blocks a tile
    auto tile_count = [&](int j, int t) { return (unsigned)(p.red ? p.cnt[j * 32 + t] / p.mats[j].nk : p.cnt[j * 32 + t]); };

    if (warp == NW) {  // the operand warp: the ready tiles of every matrix, in matrix order
        int nc = 0;  // copies issued (lane 0's count)
        for (int j = 0; j < p.nmat; ++j) {
            const Mat &m = p.mats[j];
            {  // the CTA's cells on each K tile of the matrix
                const int n = m.nb * m.nk, T = P * NW;
                s_cnt[lane] = 0;
                __syncwarp();
                for (int q = lane; (q / NW) * T < n; q += 32) {
                    const int i = (p.bal ? c + P * (q % NW) : c * NW + q % NW) + (q / NW) * T;
                    if (i < n) {
                        int rb, kt, ot;
                        cell_of(m, i, rb, kt, ot);
                        atomicAdd(&s_cnt[kt], 1);
                    }
                }
                __syncwarp();
            }
            unsigned pend = __ballot_sync(~0u, lane < m.nk && (!p.needed || s_cnt[lane] > 0));
            const unsigned long long t0 = gtime();
            unsigned long long tcopy = 0;
            if (p.own) {  // make the CTA's tiles of the matrix as their dependencies are met
                const int dep = j == 0 ? 0 : m.dep;
                bool full_met = dep != 2;
                while (pend) {
                    if (!full_met) {  // every output tile of j-1 (lanes past its tiles count as met)
                        const int no = p.mats[j - 1].nout;
                        const bool okl = lane >= no || ld_acq(done + (j - 1) * 32 + lane) >= tile_count(j - 1, lane) * dtarget;
                        full_met = __all_sync(~0u, okl);
                    }
                    const bool ok = ((pend >> lane) & 1u) &&
                                    (dep == 0 || (dep == 2 && full_met) ||
                                     (dep == 1 && ld_acq(done + (j - 1) * 32 + lane) >= tile_count(j - 1, lane) * dtarget));
                    const unsigned got = __ballot_sync(~0u, ok);
                    __syncwarp();  // the lanes' acquires before the tiles' reads
                    if (got && p.stamps && lane == 0) atomicMax(p.stamp + (size_t)j * kStampFields + kSeenMax, gtime());
                    for (unsigned b = got; b; b &= b - 1) {
                        const int t = __ffs(b) - 1, seq = m.tbase + t, ts = nc % TS;
                        if (lane == 0 && s_tload[ts] > 0)  // the slot's tile used up (its phase completed)
                            while (s_used[ts] < s_expect[ts]) {
                                __nanosleep(20);
                                stuck(t0, "a tile slot", c, j, t);
                            }
                        __syncwarp();
                        __threadfence_block();  // the consumers' reads of the slot before these writes
                        // the real producers write their Q8 into the slot; the hashed tile then
                        // overwrites it (the consumers' bits stay those of the other modes)
                        const float dv = tile_dv<REAL>(p, j, t, dep, lane, tiles + (size_t)ts * kTile);
                        write_tile(tiles + (size_t)ts * kTile, seq, dv, lane);
                        __syncwarp();
                        if (lane == 0) {
                            s_tpar[ts] = s_tload[ts] & 1;  // the phase this arrival completes
                            ++s_tload[ts];
                            s_expect[ts] += s_cnt[t];
                            s_tseq[ts] = seq;
                            __threadfence_block();
                            s_slot[seq] = (signed char)ts;
                            mbar_arrive(tfull + ts);  // release: the warp's tile writes
                            if (p.stamps) tcopy = gtime();
                        }
                        ++nc;
                    }
                    pend &= ~got;
                    if (pend && !got) {
                        __nanosleep(32);
                        stuck(t0, "a tile's dependency", c, j, __ffs(pend) - 1);
                    }
                    __syncwarp();
                }
                if (p.stamps && lane == 0 && tcopy) {
                    atomicMax(p.stamp + (size_t)j * kStampFields + kProdMax, tcopy);
                    atomicMax(p.stamp + (size_t)j * kStampFields + kCopyMax, tcopy);
                }
                continue;
            }
            while (pend) {
                const bool ok = ((pend >> lane) & 1u) && ld_acq(p.ready + j * 32 + lane) >= target;
                const unsigned got = __ballot_sync(~0u, ok);
                __syncwarp();  // the lanes' acquires before lane 0's copies
                if (got && lane == 0) {
                    asm volatile("fence.proxy.async.global;" ::: "memory");
                    for (unsigned b = got; b; b &= b - 1) {
                        const int t = __ffs(b) - 1, seq = m.tbase + t, ts = nc % TS;
                        if (s_tload[ts] > 0) {  // the slot's tile used up and its copy landed
                            while (s_used[ts] < s_expect[ts]) {
                                __nanosleep(20);
                                stuck(t0, "a tile slot", c, j, t);
                            }
                            __threadfence_block();
                            mbar_wait_t(tfull + ts, (unsigned)s_tpar[ts], "a slot's last copy", c, j, t);
                        }
                        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                        mbar_expect_tx(tfull + ts, kTile);
                        bulk(tfull + ts, tiles + (size_t)ts * kTile, p.op + (size_t)seq * kTile, kTile);
                        s_tpar[ts] = s_tload[ts] & 1;  // this copy completes phase s_tload[ts]
                        ++s_tload[ts];
                        s_expect[ts] += s_cnt[t];
                        s_tseq[ts] = seq;
                        __threadfence_block();
                        s_slot[seq] = (signed char)ts;
                        ++nc;
                    }
                    if (p.stamps) tcopy = gtime();
                }
                pend &= ~got;
                if (pend && !got) {
                    __nanosleep(32);
                    stuck(t0, "a tile's flag", c, j, __ffs(pend) - 1);
                }
                __syncwarp();
            }
            if (p.stamps && lane == 0 && tcopy) atomicMax(p.stamp + (size_t)j * kStampFields + kCopyMax, tcopy);
        }
        if (lane == 0)  // no copy may land after the CTA retires
            for (int ts = 0; ts < TS; ++ts)
                if (s_tload[ts] > 0) mbar_wait_t(tfull + ts, (unsigned)s_tpar[ts], "the last copies", c, p.nmat, ts);
        __syncwarp();
        return;
    }
    if (warp == NW + 1) {  // the producer warp: tasks c, c + P, ... of the global tile sequence
        if (p.own) return;
        int j = 0;
        for (int task = c; task < p.ntiles; task += P) {
            while (p.mats[j].tbase + p.mats[j].nk <= task) ++j;
            const Mat &m = p.mats[j];
            const int t = task - m.tbase;
            const int dep = j == 0 ? 0 : m.dep;
            if (dep == 1 && p.red && p.fused) continue;  // made by the tile's last arrival
            const unsigned long long t0 = gtime();
            if (dep == 1) {
                if (lane == 0) {
                    const unsigned tg = tile_count(j - 1, t) * dtarget;
                    while (ld_acq(done + (j - 1) * 32 + t) < tg) {
                        __nanosleep(32);
                        stuck(t0, "a producer's tile", c, j, t);
                    }
                }
            } else if (dep == 2) {
                const int no = p.mats[j - 1].nout;
                bool ok = lane >= no;
                while (!__all_sync(~0u, ok)) {
                    if (!ok) ok = ld_acq(done + (j - 1) * 32 + lane) >= tile_count(j - 1, lane) * dtarget;
                    if (!ok) {
                        __nanosleep(32);
                        stuck(t0, "a producer's matrix", c, j, t);
                    }
                }
            }
            __syncwarp();
            make_tile<REAL>(p, j, t, dep, lane);
        }
        return;
    }

    // consumer warps
    const int gw = p.bal ? c + P * warp : c * NW + warp, T = P * NW, gid = lane >> 2;  // the warp's first cell
    uint8_t *ring = rings + (size_t)warp * SL * kCell;
    uint64_t *wfull = full + warp * SL;
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    int ij = 0, ii = gw;  // the issue cursor: matrix, cell
    auto refill = [&](int s) {
        while (ij < p.nmat && ii >= p.mats[ij].nb * p.mats[ij].nk) ++ij, ii = gw;
        if (ij >= p.nmat) return;
        const Mat &m = p.mats[ij];
        int rb, kt, ot;
        cell_of(m, ii, rb, kt, ot);
        ii += T;
        if (lane == 0) {
            mbar_expect_tx(wfull + s, kCell);
            bulk_pol(wfull + s, ring + (size_t)s * kCell, p.base + (size_t)(m.u0 + (long long)rb * m.nk * 8 + kt * 8) * kUnit,
                     kCell, pol);
        }
    };
    for (int s = 0; s < SL; ++s) refill(s);
    const lane_consts<1> lc(lane);
    const float back = __int_as_float(0x3f800000 + ((lane & 3) << 24));
    unsigned long long st_ring = 0, st_tile = 0;
    int ks = 0;
    unsigned kph = 0;
    for (int j = 0; j < p.nmat; ++j) {
        const Mat &m = p.mats[j];
        const int n = m.nb * m.nk;
        for (int i = gw; i < n; i += T) {
            int rb, kt, ot;
            cell_of(m, i, rb, kt, ot);
            const int s = ks;
            long long c0 = clock64();
            mbar_wait_t(wfull + s, kph, "a ring slot", c, j, kt);
            long long c1 = clock64();
            if (++ks == SL) ks = 0, kph ^= 1u;
            const int seq = m.tbase + kt;
            int ts = s_slot[seq];
            if (ts < 0 || s_tseq[ts] != seq) {
                const unsigned long long t0 = gtime();
                while ((ts = s_slot[seq]) < 0 || s_tseq[ts] != seq) {
                    __nanosleep(20);
                    stuck(t0, "a tile slot's copy", c, j, kt);
                }
            }
            __threadfence_block();
            mbar_wait_t(tfull + ts, (unsigned)s_tpar[ts], "a tile", c, j, kt);
            const long long c2 = clock64();
            if (p.stamps && lane == 0 && i == gw) {
                const unsigned long long now = gtime();
                atomicMin(p.stamp + (size_t)j * kStampFields + kStartMin, now);
                atomicMax(p.stamp + (size_t)j * kStampFields + kStartMax, now);
            }
            st_ring += c1 - c0, st_tile += c2 - c1;
            float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
            if (p.compute) {
                const uint8_t *sl = ring + (size_t)s * kCell, *tl = tiles + (size_t)ts * kTile;
#pragma unroll
                for (int g = 0; g < 8; ++g) unit(sl + g * kUnit, tl, g, lane, gid, lc, acc);
            }
            __syncwarp();
            if (lane == 0) {  // the tile's slot may be refilled once the warp's reads are done
                __threadfence_block();
                atomicAdd((int *)&s_used[ts], 1);
            }
            refill(s);
            float *dst = p.part + m.pbase + ((long long)kt * m.nb + rb) * 32;
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float v = acc[r][h] * back;
                    v += __shfl_xor_sync(~0u, v, 1);
                    v += __shfl_xor_sync(~0u, v, 2);
                    if ((lane & 3) == 0) dst[r * 16 + h * 8 + gid] = v;
                }
            __syncwarp();
            if (!p.red) {
                if (lane == 0 && p.rel)
                    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.done + j * 32 + (ot & 31)) : "memory");
            } else {
                // the row block's arrival; its last arrival (acquiring the others' partials) sums
                // them in K order and counts the row block on its output tile
                unsigned old = 0;
                if (lane == 0) old = atom_add_acq_rel(p.rbcnt + m.rb0 + rb);
                old = __shfl_sync(~0u, old, 0);
                __syncwarp();  // the other lanes' loads after lane 0's acquire
                if (old + 1 == (unsigned)m.nk * dtarget) {
                    float v[17];
#pragma unroll
                    for (int k = 0; k < 17; ++k)
                        v[k] = k < m.nk ? __ldcg(p.part + m.pbase + ((long long)k * m.nb + rb) * 32 + lane) : 0.0f;
                    float sum = 0.0f;
#pragma unroll
                    for (int k = 0; k < 17; ++k)
                        if (k < m.nk) sum += v[k];
                    p.fin[(size_t)(m.rb0 + rb) * 32 + lane] = sum;
                    __syncwarp();
                    const bool make = p.fused && j + 1 < p.nmat && p.mats[j + 1].dep == 1;
                    if (make) {  // the tile's last arrival makes the successor's tile
                        unsigned o2 = 0;
                        if (lane == 0) o2 = atom_add_acq_rel(p.done_r + j * 32 + (ot & 31));
                        o2 = __shfl_sync(~0u, o2, 0);
                        __syncwarp();
                        if (o2 + 1 == tile_count(j, ot) * dtarget) make_tile<REAL>(p, j + 1, ot, 1, lane);
                    } else if (lane == 0) {
                        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.done_r + j * 32 + (ot & 31)) : "memory");
                    }
                }
            }
        }
        if (p.stamps && lane == 0 && gw < n) {
            const unsigned long long now = gtime();
            atomicMin(p.stamp + (size_t)j * kStampFields + kEndMin, now);
            atomicMax(p.stamp + (size_t)j * kStampFields + kEndMax, now);
        }
    }
    if (lane == 0) {
        p.wstat[((size_t)c * NW + warp) * 2 + 0] = st_ring;
        p.wstat[((size_t)c * NW + warp) * 2 + 1] = st_tile;
    }
}

// every unit distinct: codes a hash of (unit, byte), scales small fp16 values
__global__ void fill_units(uint8_t *base, long long units)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < units * (kUnit / 16); i += stride) {
        const long long u = i / (kUnit / 16);
        const int w = (int)(i - u * (kUnit / 16));
        uint4 v;
        if (w < 64) {
            const unsigned h = (unsigned)u * 0x9e3779b9u ^ (unsigned)w * 0x85ebca6bu;
            v = make_uint4(h, h * 0xc2b2ae35u, h ^ 0x27d4eb2fu, h + 0x165667b1u);
        } else {
            const unsigned short q = __half_as_ushort(__float2half(0.01f * (1 + (int)((u + w) % 5))));
            const unsigned x = q | (unsigned)q << 16;
            v = make_uint4(x, x, x, x);
        }
        reinterpret_cast<uint4 *>(base)[i] = v;
    }
}

__global__ void fsum(const float4 *p, long long n, float *sink)
{
    float s = 0.0f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float4 v = p[i];
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 1.2345f) sink[0] = s;
}

int main(int argc, char **argv)
{
    cudaDeviceProp prop;
    CK(cudaSetDevice(0));
    CK(cudaGetDeviceProperties(&prop, 0));
    const int P = prop.multiProcessorCount;
    if ((size_t)prop.sharedMemPerBlockOptin < kSmem) {
        fprintf(stderr, "td: needs %zu B of shared memory a block, the device has %zu\n", kSmem,
                (size_t)prop.sharedMemPerBlockOptin);
        return 1;
    }
    struct Sh { int n, k; };
    const Sh in_proj{16384, 5120}, qkv{14336, 5120}, out{5120, 6144}, gate_up{34816, 5120},
        down{5120, 17408}, head{248320, 5120};
    std::vector<Sh> shapes;
    std::vector<int> role;  // 0 input projection, 1 out, 2 gate_up, 3 down, 4 head
    for (int l = 0; l < 64; ++l) {
        shapes.push_back(l % 4 == 3 ? qkv : in_proj), role.push_back(0);
        shapes.push_back(out), role.push_back(1);
        shapes.push_back(gate_up), role.push_back(2);
        shapes.push_back(down), role.push_back(3);
    }
    shapes.push_back(head), role.push_back(4);
    const int nmat = (int)shapes.size();
    long long units = 0, parts = 0;
    int ntiles = 0, rbs = 0;
    std::vector<Mat> base_mats(nmat);
    for (int j = 0; j < nmat; ++j) {
        Mat &m = base_mats[j];
        m.nb = shapes[j].n / 32, m.nk = shapes[j].k / 1024;
        m.u0 = units, m.pbase = parts, m.tbase = ntiles, m.rb0 = rbs;
        rbs += m.nb;
        m.paired = role[j] == 2;
        m.nout = m.paired ? m.nb / 64 : (m.nb + 31) / 32;
        units += (long long)m.nb * m.nk * 8, parts += (long long)m.nb * 32 * m.nk, ntiles += m.nk;
    }
    const size_t bytes = (size_t)units * kUnit;
    printf("%s, %d SMs; %d matrices, %.3f GB, %d operand tiles, %zu B shared a block\n", prop.name, P, nmat,
           bytes / 1e9, ntiles, kSmem);
    if (ntiles > kMaxTiles) {
        fprintf(stderr, "td: %d operand tiles, the slot map holds %d\n", ntiles, kMaxTiles);
        return 1;
    }
    // the variants' walks and dependencies (see the head of this file)
    auto plan = [&](int v) {
        std::vector<Mat> ms = base_mats;
        for (int j = 0; j < nmat; ++j) {
            Mat &m = ms[j];
            const int r = role[j];
            m.src = r == 1 ? 0 : r == 3 ? 2 : 1;
            if (v == 0) m.walk = 0, m.dep = 0;
            else if (v == 1) m.walk = 0, m.dep = 2;
            else if (v == 2) {
                m.walk = (r == 1 || r == 2) ? 1 : 0;
                m.dep = r == 3 ? 1 : 2;
            } else {
                m.walk = (r == 1 || r == 3) ? 1 : 0;
                m.dep = (r == 0 || r == 2 || r == 4) ? 1 : 2;
            }
        }
        for (int j = 0; j < nmat; ++j)
            if (ms[j].nk > 17) {  // the partial reads' arrays (and TS, 32) hold 17
                fprintf(stderr, "td: matrix %d has %d K tiles (at most 17)\n", j, ms[j].nk);
                exit(1);
            }
        for (int j = 1; j < nmat; ++j) {  // a tile-local dependency needs matching tiles
            const Mat &a = ms[j - 1], &b = ms[j];
            if (b.dep == 1 && (a.walk != 1 || a.nout != b.nk)) {
                fprintf(stderr, "td: variant %d matrix %d: tile-local on %d output tiles (walk %d) for %d K tiles\n", v, j,
                        a.nout, a.walk, b.nk);
                exit(1);
            }
            if (b.dep == 2 && a.nout > 32) {
                fprintf(stderr, "td: variant %d matrix %d: more than 32 output tiles to wait for\n", v, j);
                exit(1);
            }
        }
        return ms;
    };
    std::vector<int> cnt((size_t)nmat * 32, 0);
    for (int j = 0; j < nmat; ++j) {
        const Mat &m = base_mats[j];
        if (m.nout > 32) continue;
        for (int t = 0; t < m.nout; ++t) cnt[(size_t)j * 32 + t] = (m.paired ? 64 : std::min(32, m.nb - 32 * t)) * m.nk;
    }
    uint8_t *base, *op;
    CK(cudaMalloc(&base, bytes));
    fill_units<<<P * 8, 256>>>(base, units);
    CK(cudaGetLastError());
    CK(cudaMalloc(&op, (size_t)ntiles * kTile));
    float *part;
    CK(cudaMalloc(&part, (size_t)parts * 4));
    unsigned *done, *ready;
    CK(cudaMalloc(&done, (size_t)nmat * 32 * 4));
    CK(cudaMalloc(&ready, (size_t)nmat * 32 * 4));
    CK(cudaMemset(done, 0, (size_t)nmat * 32 * 4));
    CK(cudaMemset(ready, 0, (size_t)nmat * 32 * 4));
    int *d_cnt;
    CK(cudaMalloc(&d_cnt, cnt.size() * 4));
    CK(cudaMemcpy(d_cnt, cnt.data(), cnt.size() * 4, cudaMemcpyHostToDevice));
    unsigned long long *wstat;
    CK(cudaMalloc(&wstat, (size_t)P * NW * 2 * 8));
    Mat *d_mats[4];
    for (int v = 0; v < 4; ++v) {
        const std::vector<Mat> ms = plan(v);
        CK(cudaMalloc(&d_mats[v], ms.size() * sizeof(Mat)));
        CK(cudaMemcpy(d_mats[v], ms.data(), ms.size() * sizeof(Mat), cudaMemcpyHostToDevice));
    }
    CK(cudaFuncSetAttribute(td_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
    CK(cudaFuncSetAttribute(td_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, td_kernel<true>, (NW + 2) * 32, kSmem));
    {
        int occ0 = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ0, td_kernel<false>, (NW + 2) * 32, kSmem));
        occ = std::min(occ, occ0);
    }
    if (occ < 1) {
        fprintf(stderr, "td: the kernel does not fit an SM\n");
        return 1;
    }
    unsigned epoch = 0, depoch = 0, repoch = 0, rdy_epoch = 0;
    unsigned long long *stamp;
    CK(cudaMalloc(&stamp, (size_t)nmat * kStampFields * 8));
    unsigned *rbcnt, *done_r;
    float *fin;
    CK(cudaMalloc(&rbcnt, (size_t)rbs * 4));
    CK(cudaMemset(rbcnt, 0, (size_t)rbs * 4));
    CK(cudaMalloc(&done_r, (size_t)nmat * 32 * 4));
    CK(cudaMemset(done_r, 0, (size_t)nmat * 32 * 4));
    CK(cudaMalloc(&fin, (size_t)rbs * 32 * 4));
    // the real producers' inputs (a zero residual, norm weights, signs) and their output
    float *resid, *nwt, *qs;
    int8_t *sgn;
    int32_t *qsum;
    uint32_t *qbits;
    {
        const int W = 17408;
        std::vector<float> hw(W);
        std::vector<int8_t> hs(W);
        for (int i = 0; i < W; ++i) hw[i] = 1.0f + 0.001f * (float)(i % 97), hs[i] = (i * 2654435761u >> 7) & 1 ? 1 : -1;
        CK(cudaMalloc(&resid, (size_t)W * 4));
        CK(cudaMemset(resid, 0, (size_t)W * 4));
        CK(cudaMalloc(&nwt, (size_t)W * 4));
        CK(cudaMemcpy(nwt, hw.data(), (size_t)W * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&sgn, (size_t)W));
        CK(cudaMemcpy(sgn, hs.data(), (size_t)W, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&qs, (size_t)ntiles * 8 * 4));
        CK(cudaMalloc(&qsum, (size_t)ntiles * 8 * 4));
        CK(cudaMalloc(&qbits, (size_t)ntiles * 8 * PQ2_BITS_GROUP_WORDS * 4));
    }
    auto launch = [&](int v, int prod_ns, int compute, int needed, int rel = 1, int stamps = 0, int bal = 0, int red = 0,
                      int fused = 0, int own = 0) {
        const int r = v == 0 && !red ? rel : 1;
        own = own && red && !fused;
        TP p{base, d_mats[v], nmat, ntiles, d_cnt, done, ready, op, part, epoch++, depoch, prod_ns, compute, needed, r,
             bal, red, red && fused, own, rdy_epoch, rbcnt, done_r, fin, repoch, resid, nwt, sgn, qs, qsum, qbits, stamps,
             stamp, wstat};
        if (red) ++repoch;
        else depoch += r;
        if (!own) ++rdy_epoch;
        void *args[] = {&p};  // cooperative: every CTA resident, or an error instead of a hang
        const void *fn = prod_ns < 0 ? (const void *)td_kernel<true> : (const void *)td_kernel<false>;
        CK(cudaLaunchCooperativeKernel(fn, dim3(P), dim3((NW + 2) * 32), args, kSmem, 0));
    };
    // checks: every variant's partials equal variant 0's, poisoned first, two epochs each
    // reps: every tile, the needed ones, the needed ones balanced, then balanced with red, with
    // red fused, red fused with real producers, own with real producers, own with the spin; two
    // epochs each. With red the row blocks' sums are checked too, against the same additions of
    // variant 0's partials on the host.
    std::vector<float> ref((size_t)parts), got((size_t)parts), fref((size_t)rbs * 32), fgot((size_t)rbs * 32);
    int fails = 0;
    for (int v = 0; v < 4; ++v)
        for (int rep = 0; rep < 16; ++rep) {  // 10-11: red fused real; 12-13: own real; 14-15: own
            const int red = rep >= 6, fused = rep >= 8 && rep < 12, real = rep >= 10 && rep < 14, own = rep >= 12;
            CK(cudaMemset(part, 0xff, (size_t)parts * 4));
            CK(cudaMemset(op, 0xff, (size_t)ntiles * kTile));
            CK(cudaMemset(fin, 0xff, (size_t)rbs * 32 * 4));
            launch(v, real ? -1 : 300, 1, rep >= 2, 1, 0, rep >= 4, red, fused, own);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(v == 0 && rep == 0 ? ref.data() : got.data(), part, (size_t)parts * 4, cudaMemcpyDeviceToHost));
            if (v == 0 && rep == 0) {
                size_t nan = 0;
                for (float x : ref) nan += x != x;
                if (nan) printf("CHECK FAILED: variant 0 left %zu partials unwritten\n", nan), ++fails;
                for (int j = 0; j < nmat; ++j) {
                    const Mat &m = base_mats[j];
                    for (int rb = 0; rb < m.nb; ++rb)
                        for (int l = 0; l < 32; ++l) {
                            float sum = 0.0f;
                            for (int k = 0; k < m.nk; ++k) sum += ref[(size_t)m.pbase + ((size_t)k * m.nb + rb) * 32 + l];
                            fref[(size_t)(m.rb0 + rb) * 32 + l] = sum;
                        }
                }
                continue;
            }
            if (red) {
                CK(cudaMemcpy(fgot.data(), fin, fgot.size() * 4, cudaMemcpyDeviceToHost));
                if (memcmp(fref.data(), fgot.data(), fgot.size() * 4) != 0) {
                    size_t bad = 0;
                    for (size_t i = 0; i < fref.size(); ++i) bad += memcmp(&fref[i], &fgot[i], 4) != 0;
                    printf("CHECK FAILED: variant %d (red, fused %d, real %d, own %d) epoch %u: %zu row-block sums differ\n", v,
                           fused, real, own, epoch - 1, bad);
                    ++fails;
                }
            }
            if (memcmp(ref.data(), got.data(), (size_t)parts * 4) != 0) {
                size_t bad = 0;
                for (size_t i = 0; i < ref.size(); ++i) bad += memcmp(&ref[i], &got[i], 4) != 0;
                printf("CHECK FAILED: variant %d (needed %d, bal %d, red %d, fused %d, real %d, own %d) epoch %u: %zu partials differ from variant 0's\n",
                       v, rep >= 2, rep >= 4, red, fused, real, own, epoch - 1, bad);
                ++fails;
            }
        }
    printf("CHECKS: %s\n", fails ? "FAILED" : "all passed");
    struct Row { int v, prod_ns, compute, needed, rel, bal, red = 0, fused = 0, own = 0; std::vector<float> ms; double ring_us = 0, tile_us = 0; };
    std::vector<Row> rows;
    rows.push_back({-1, 0, 0, 0, 1, 0, 0, 0, {}});  // the read floor: a float sum over the same bytes
    rows.push_back({0, 0, 0, 0, 1, 0, 0, 0, {}});
    rows.push_back({0, 0, 0, 1, 1, 0, 0, 0, {}});
    rows.push_back({0, 0, 0, 1, 1, 1, 0, 0, {}});
    rows.push_back({0, 0, 1, 0, 0, 0, 0, 0, {}});  // variant 0 without the per-cell releases
    rows.push_back({0, 0, 1, 1, 0, 0, 0, 0, {}});
    rows.push_back({0, 0, 1, 1, 0, 1, 0, 0, {}});
    for (int v = 0; v < 4; ++v)
        for (int nb : {0, 1, 2, 3, 4})  // needed 0; needed 1; needed 1 and balanced; and red; and red fused
            for (int pn : {0, 1000})  // fused differs from red only where a boundary is tile-local
                if (nb < 4 || v >= 2) rows.push_back({v, pn, 1, nb > 0, 1, nb >= 2, nb >= 3, nb == 4, {}});
    for (int v = 1; v < 4; ++v)  // real producers (prodns -1), red, and red fused where it differs
        for (int fu : {0, 1})
            if (fu == 0 || v >= 2) rows.push_back({v, -1, 1, 1, 1, 1, 1, fu, 0, {}});
    for (int v = 0; v < 4; ++v)  // own: every CTA makes its tiles (spin 0, and real producers)
        for (int pn : {0, -1})
            if (pn == 0 || v >= 1) rows.push_back({v, pn, 1, 1, 1, 1, 1, 0, 1, {}});
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<unsigned long long> ws((size_t)P * NW * 2);
    const double clk_ghz = 1.98;  // only for the stall columns (cycles to us, approximate)
    for (int r = 0; r < 3; ++r)
        for (auto &row : rows) {
            CK(cudaEventRecord(e0));
            if (row.v < 0) fsum<<<P * 4, 512>>>(reinterpret_cast<const float4 *>(base), (long long)(bytes / 16), part);
            else launch(row.v, row.prod_ns, row.compute, row.needed, row.rel, 0, row.bal, row.red, row.fused, row.own);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            row.ms.push_back(ms);
            CK(cudaMemcpy(ws.data(), wstat, ws.size() * 8, cudaMemcpyDeviceToHost));
            double a = 0, b = 0;
            for (int i = 0; i < P * NW; ++i) a += ws[(size_t)i * 2], b += ws[(size_t)i * 2 + 1];
            row.ring_us = a / (P * NW) / (clk_ghz * 1e3), row.tile_us = b / (P * NW) / (clk_ghz * 1e3);
        }
    std::vector<float> f0 = rows[0].ms;
    std::sort(f0.begin(), f0.end());
    const float floor_ms = f0[1];
    printf("floor (float sum): %.3f ms = %.0f GB/s\n", floor_ms, bytes / (floor_ms * 1e-3) / 1e9);
    FILE *js = argc > 1 ? fopen(argv[1], "w") : nullptr;
    if (js) fprintf(js, "{\"device\": \"%s\", \"gb\": %.4f, \"floor_ms\": %.4f, \"rows\": [\n", prop.name, bytes / 1e9, floor_ms);
    printf("%-8s %7s %7s %7s %4s %4s %4s %5s %4s %8s %7s %10s %10s\n", "variant", "prodns", "compute", "needed", "rel", "bal",
           "red", "fused", "own", "ms", "xfloor", "ring_us/w", "tile_us/w");
    for (size_t i = 0; i < rows.size(); ++i) {
        Row &r = rows[i];
        std::vector<float> s = r.ms;
        std::sort(s.begin(), s.end());
        printf("%-8d %7d %7d %7d %4d %4d %4d %5d %4d %8.3f %7.3f %10.1f %10.1f\n", r.v, r.prod_ns, r.compute, r.needed, r.rel, r.bal,
               r.red, r.fused, r.own, s[1],
               s[1] / floor_ms, r.ring_us, r.tile_us);
        if (js)
            fprintf(js, "  {\"variant\": %d, \"prod_ns\": %d, \"compute\": %d, \"needed\": %d, \"rel\": %d, \"bal\": %d, \"red\": %d, \"fused\": %d, \"own\": %d, \"ms\": [%.4f, %.4f, %.4f], \"ring_us\": %.2f, \"tile_us\": %.2f}%s\n",
                    r.v, r.prod_ns, r.compute, r.needed, r.rel, r.bal, r.red, r.fused, r.own, r.ms[0], r.ms[1], r.ms[2], r.ring_us, r.tile_us, i + 1 < rows.size() ? "," : "");
    }
    // the boundaries' stamps: one untimed launch a variant and cell assignment (needed 1, no producer spin); per
    // boundary into matrix j, medians over the matrices of each role, in us: the skew of j-1's
    // warps' ends, then from j-1's last end to the last producer's dependency seen, to its tile
    // released, to the last copy issued, to the last warp's first tile ready (each from the last
    // of the previous event; a tile-local boundary's events may precede j-1's end)
    const char *rname[5] = {"in_proj", "out", "gate_up", "down", "head"};
    if (js) fprintf(js, "], \"stamps\": [\n");
    printf("stamps (us, medians; needed 1, prodns 0; mode 0 bal 0, 1 bal 1, 2 and red, 3 and fused, 4 red own):\n"
           "                  role       skew  ->seen ->prod ->copy ->start  total\n");
    std::vector<unsigned long long> st((size_t)nmat * kStampFields);
    for (int vb = 0; vb < 20; ++vb) {  // modes: bal 0; bal 1; bal 1 red; bal 1 red fused; bal 1 red own
        const int v = vb / 5, mode = vb % 5, bal = mode > 0, red = mode > 1, fused = mode == 3, own = mode == 4;
        for (int j = 0; j < nmat; ++j)
            for (int f = 0; f < kStampFields; ++f)
                st[(size_t)j * kStampFields + f] = (f == kEndMin || f == kStartMin) ? ~0ull : 0ull;
        CK(cudaMemcpy(stamp, st.data(), st.size() * 8, cudaMemcpyHostToDevice));
        launch(v, 0, 1, 1, 1, 1, bal, red, fused, own);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(st.data(), stamp, st.size() * 8, cudaMemcpyDeviceToHost));
        // differences in integers first: the timer's ns since the epoch lose 256 ns as doubles
        const unsigned long long t00 = st[kStartMin];
        auto S = [&](int j, int f) { return (double)(long long)(st[(size_t)j * kStampFields + f] - t00); };
        for (int r = 0; r < 5; ++r) {
            std::vector<double> d[6];
            for (int j = 1; j < nmat; ++j) {
                if (role[j] != r) continue;
                const double e = S(j - 1, kEndMax);
                d[0].push_back(e - S(j - 1, kEndMin));
                d[1].push_back(S(j, kSeenMax) - e);
                d[2].push_back(S(j, kProdMax) - S(j, kSeenMax));
                d[3].push_back(S(j, kCopyMax) - S(j, kProdMax));
                d[4].push_back(S(j, kStartMax) - S(j, kCopyMax));
                d[5].push_back(S(j, kStartMax) - e);
            }
            double med[6];
            for (int k = 0; k < 6; ++k) {
                std::sort(d[k].begin(), d[k].end());
                med[k] = d[k].empty() ? 0.0 : d[k][d[k].size() / 2] / 1e3;
            }
            printf("  variant %d mode %d %-8s %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f\n", v, mode, rname[r], med[0], med[1], med[2], med[3],
                   med[4], med[5]);
            if (js)
                fprintf(js, "  {\"variant\": %d, \"mode\": %d, \"role\": \"%s\", \"skew\": %.3f, \"seen\": %.3f, \"prod\": %.3f, \"copy\": %.3f, \"start\": %.3f, \"total\": %.3f}%s\n",
                        v, mode, rname[r], med[0], med[1], med[2], med[3], med[4], med[5], vb == 19 && r == 4 ? "" : ",");
        }
    }
    if (js) fprintf(js, "]}\n"), fclose(js);
    return fails ? 2 : 0;
}
