// tprod.cu - LAB (issue 36, not product): one warp makes one 1024-element tile of a matmul's Q8
// operand (the tile dataflow's producer, NOTES segment-tile-dataflow), with the product's
// arithmetic, and is checked bit for bit against the product's producers:
//   swiglu: silu(gate) * up of the tile's 1024 elements (16 float4 loads a lane, one round trip),
//           against pq2_swiglu_rotate_q8_cuda (width 17408: 17 tiles);
//   norm:   the exact RMSNorm of the whole row (x + residual, 5120: the row bulk-copied into
//           shared memory, the row sum emulating the product's 256 threads and their order),
//           against pq2_norm_rotate_q8_cuda (5 tiles).
// Then the signs, the 1024-wide Hadamard transform in one warp (bits 0-1 in the lane, 2-6 by
// shuffles, 7-9 across the lane's eight groups: each stage the FADD / FFMA of hadamard.cuh, so the
// same bits) and q8_store_group per 128-group (scales, sums, bit slices, q8).
// Lane L holds group w's elements 4L..4L+3 for w = 0..7, the elements that thread 32 w + L of the
// product's 256-thread block holds. Timed: one warp a tile, all tiles at once, inputs in L2 and
// after an L2 flush; %globaltimer from a warp's start to its stores' fence.
//     nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-tprod \
//          lab/seg/tprod.cu -Lbuild/dev-gpu -lpq2 -Xlinker -rpath,'$ORIGIN/dev-gpu'
//     build/lab-tprod [out.json]
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "device/codes.cuh"
#include "device/ptx.cuh"
#include "pq2.h"
#include "quantize/q8_group.cuh"
#include "rotate/hadamard.cuh"

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)
#define PK(x)                                                                          \
    do {                                                                               \
        pq2_status s_ = (x);                                                           \
        if (s_ != PQ2_OK) {                                                            \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, pq2_last_error()); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

constexpr int kNormWidth = 5120, kSwigluWidth = 17408;

struct TArgs {
    int source;  // 0 swiglu, 1 norm
    const float *x, *x2;  // swiglu: gate, up (rows of ld); norm: x, residual
    long long ld;
    const float *norm_weight;
    float eps;
    const int8_t *signs;
    int width;
    float rsqrt_b;
    int8_t *q8;
    float *scales;
    int32_t *sums;
    uint32_t *bits;
    unsigned long long *t;  // [tiles][3]: start, end (%globaltimer ns), cycles (clock64)
};

__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// the 1024-wide transform of the lane's 8 x 4 values, stage by stage as hadamard_block with
// log2b = 10 and cross_warp_stages<3> (which computes the staged transform's values)
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
    for (int s = 0; s < 3; ++s) {  // bits 7..9: thread 32 w + L's partner is w ^ (1 << s)
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
}

__global__ void __launch_bounds__(32) tile_producer(const TArgs a)
{
    extern __shared__ __align__(128) float row[];  // norm: x then residual, 2 x width floats
    __shared__ __align__(8) uint64_t bar;
    const int lane = threadIdx.x, tile = blockIdx.x;
    const unsigned long long t0 = gtime();
    const long long c0 = clock64();
    float v[8][4];
    char4 sg[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) sg[w] = *reinterpret_cast<const char4 *>(a.signs + tile * 1024 + 128 * w + 4 * lane);
    if (a.source == 0) {
        float4 g[8], u[8];
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const int e = tile * 1024 + 128 * w + 4 * lane;
            g[w] = *reinterpret_cast<const float4 *>(a.x + e);
            u[w] = *reinterpret_cast<const float4 *>(a.x2 + e);
        }
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const float gg[4] = {g[w].x, g[w].y, g[w].z, g[w].w}, uu[4] = {u[w].x, u[w].y, u[w].z, u[w].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) v[w][j] = gg[j] / (1.0f + expf(-gg[j])) * uu[j];
        }
    } else {
        float4 nw[8];  // the norm weight, independent of the row
#pragma unroll
        for (int w = 0; w < 8; ++w) nw[w] = *reinterpret_cast<const float4 *>(a.norm_weight + tile * 1024 + 128 * w + 4 * lane);
        const uint32_t bytes = (uint32_t)a.width * 4;
        if (lane == 0) {
            mbar_init_count(&bar, 1);
            mbar_init_fence();
        }
        __syncwarp();
        if (lane == 0) {
            mbar_expect_tx(&bar, 2 * bytes);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             smem_u32(row)),
                         "l"(a.x), "r"(bytes), "r"(smem_u32(&bar))
                         : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             smem_u32(row + a.width)),
                         "l"(a.x2), "r"(bytes), "r"(smem_u32(&bar))
                         : "memory");
        }
        mbar_wait(&bar, 0);
        // the row sum as the product's block takes it: thread t = 32 w + L sums h at 4t + 1024u + j
        // (u = 0.. while inside the row, j = 0..3) by FFMA, each warp's sums by the xor tree, then
        // the 8 warps' sums in order from 0
        float red = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            float ss = 0.0f;
            for (int i0 = 128 * w + 4 * lane; i0 < a.width; i0 += 1024) {
                const float4 xv = *reinterpret_cast<const float4 *>(row + i0);
                const float4 rv = *reinterpret_cast<const float4 *>(row + a.width + i0);
                const float h[4] = {xv.x + rv.x, xv.y + rv.y, xv.z + rv.z, xv.w + rv.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) ss = fmaf(h[j], h[j], ss);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            red += ss;
        }
        const float scale = 1.0f / sqrtf(red / (float)a.width + a.eps);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const int e = tile * 1024 + 128 * w + 4 * lane;
            const float4 xv = *reinterpret_cast<const float4 *>(row + e);
            const float4 rv = *reinterpret_cast<const float4 *>(row + a.width + e);
            const float h[4] = {xv.x + rv.x, xv.y + rv.y, xv.z + rv.z, xv.w + rv.w};
            const float wt[4] = {nw[w].x, nw[w].y, nw[w].z, nw[w].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) v[w][j] = h[j] * scale * wt[j];
        }
    }
#pragma unroll
    for (int w = 0; w < 8; ++w) v[w][0] *= sg[w].x, v[w][1] *= sg[w].y, v[w][2] *= sg[w].z, v[w][3] *= sg[w].w;
    hadamard_1024_warp(v, lane);
#pragma unroll
    for (int w = 0; w < 8; ++w) {
#pragma unroll
        for (int j = 0; j < 4; ++j) v[w][j] *= a.rsqrt_b;
        const int g = tile * 8 + w;
        q8_store_group(v[w], lane, 0, g, g, 1, a.width, a.q8, a.scales, a.sums, a.bits, nullptr);
    }
    __threadfence();  // the tile's stores visible, as a producer's release would need
    if (lane == 0) {
        a.t[tile * 3 + 2] = (unsigned long long)(clock64() - c0);
        a.t[tile * 3 + 0] = t0;
        a.t[tile * 3 + 1] = gtime();
    }
}

__global__ void touch(float4 *p, long long n, float *sink)
{
    float s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float4 v = p[i];
        s += v.x;
        v.y += 1.0f;
        p[i] = v;
    }
    if (s == 1.2345f) *sink = s;
}

static uint32_t rng = 12345u;
static float frand()  // in [-1, 1)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((int)(rng >> 8) - (1 << 23)) / (float)(1 << 23);
}

int main(int argc, char **argv)
{
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s\n", prop.name);
    int fails = 0;
    FILE *js = argc > 1 ? fopen(argv[1], "w") : nullptr;
    if (argc > 1 && !js) {
        fprintf(stderr, "tprod: cannot write %s\n", argv[1]);
        return 1;
    }
    if (js) fprintf(js, "{\"device\": \"%s\", \"rows\": [\n", prop.name);
    for (int source = 0; source < 2; ++source) {
        const int width = source == 0 ? kSwigluWidth : kNormWidth, tiles = width / 1024, groups = width / 128;
        const long long ld = source == 0 ? 2LL * width : width;
        // inputs: uniform, a few outliers; tile 1 all zero (scale 0) and tile 2 tiny (1e-20) in
        // every input, since the rotation mixes a tile's 8 groups
        std::vector<float> hx((size_t)ld), hx2((size_t)width), hw((size_t)width);
        std::vector<int8_t> hs((size_t)width);
        for (auto &f : hx) f = 3.0f * frand();
        for (auto &f : hx2) f = 2.0f * frand();
        for (auto &f : hw) f = 1.0f + 0.25f * frand();
        for (auto &s : hs) s = frand() < 0.0f ? -1 : 1;
        for (int i = 1024; i < 2048; ++i) {
            hx[i] = 0.0f, hx2[i] = 0.0f;  // tile 1
            if (source == 0) hx[width + i] = 0.0f;
        }
        for (int i = 2048; i < 3072; ++i) {
            hx[i] *= 1e-20f, hx2[i] *= 1e-20f;  // tile 2
            if (source == 0) hx[width + i] *= 1e-20f;
        }
        hx[3500] = 250.0f, hx[width - 7] = -180.0f;
        float *x, *x2, *nw;
        int8_t *signs;
        CK(cudaMalloc(&x, hx.size() * 4));
        CK(cudaMalloc(&x2, (size_t)width * 4 + 16));
        CK(cudaMalloc(&nw, (size_t)width * 4));
        CK(cudaMalloc(&signs, (size_t)width));
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(nw, hw.data(), (size_t)width * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(signs, hs.data(), (size_t)width, cudaMemcpyHostToDevice));
        const float *gate = x, *up = source == 0 ? x + width : x2;
        if (source == 1) CK(cudaMemcpy(x2, hx2.data(), (size_t)width * 4, cudaMemcpyHostToDevice));
        // the product's operand and the probe's, each poisoned first
        size_t bits_bytes;
        PK(pq2_q8_kernel_operand_bytes(1, width, &bits_bytes));
        int8_t *q8[2];
        float *sc[2];
        int32_t *su[2];
        uint32_t *bi[2];
        for (int k = 0; k < 2; ++k) {
            CK(cudaMalloc(&q8[k], (size_t)width));
            CK(cudaMalloc(&sc[k], (size_t)groups * 4));
            CK(cudaMalloc(&su[k], (size_t)groups * 4));
            CK(cudaMalloc(&bi[k], bits_bytes));
            CK(cudaMemset(q8[k], 0x5a, (size_t)width));
            CK(cudaMemset(sc[k], 0xff, (size_t)groups * 4));
            CK(cudaMemset(su[k], 0xa5, (size_t)groups * 4));
            CK(cudaMemset(bi[k], 0xc3, bits_bytes));
        }
        pq2_rotation rot{1024, signs};
        pq2_q8 out{q8[0], sc[0], su[0], bi[0]};
        const float eps = 1e-6f;
        if (source == 0) PK(pq2_swiglu_rotate_q8_cuda(gate, up, ld, PQ2_DTYPE_F32, 1, width, &rot, &out, nullptr));
        else PK(pq2_norm_rotate_q8_cuda(x, x2, nullptr, PQ2_DTYPE_F32, nw, PQ2_DTYPE_F32, eps, 1, width, &rot, &out, nullptr, 0, nullptr));
        CK(cudaDeviceSynchronize());
        unsigned long long *t;
        CK(cudaMalloc(&t, (size_t)tiles * 24));
        TArgs a{source, gate, up, ld, nw, eps, signs, width, (float)(1.0 / sqrt(1024.0)), q8[1], sc[1], su[1], bi[1], t};
        const size_t smem = source == 1 ? (size_t)2 * width * 4 : 0;
        CK(cudaFuncSetAttribute(tile_producer, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        tile_producer<<<tiles, 32, smem>>>(a);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        const char *what[4] = {"q8", "scales", "sums", "bits"};
        const size_t nb[4] = {(size_t)width, (size_t)groups * 4, (size_t)groups * 4, bits_bytes};
        const void *pa[4] = {q8[0], sc[0], su[0], bi[0]}, *pb[4] = {q8[1], sc[1], su[1], bi[1]};
        for (int k = 0; k < 4; ++k) {
            std::vector<uint8_t> ha(nb[k]), hb(nb[k]);
            CK(cudaMemcpy(ha.data(), pa[k], nb[k], cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hb.data(), pb[k], nb[k], cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (size_t i = 0; i < nb[k]; ++i) bad += ha[i] != hb[i];
            if (bad) printf("CHECK FAILED: %s %s: %zu of %zu bytes differ\n", source ? "norm" : "swiglu", what[k], bad, nb[k]), ++fails;
        }
        // timing: inputs in L2 (the producer's case in the dataflow), then after an L2 flush
        float *flush, *sink;
        const long long fl = 256ll << 20;
        CK(cudaMalloc(&flush, fl));
        CK(cudaMalloc(&sink, 4));
        CK(cudaMemset(flush, 0, fl));
        for (int cold = 0; cold < 2; ++cold) {
            std::vector<double> span, per, cyc;
            for (int r = 0; r < 21; ++r) {
                if (cold) touch<<<prop.multiProcessorCount * 4, 512>>>(reinterpret_cast<float4 *>(flush), fl / 16, sink);
                else tile_producer<<<tiles, 32, smem>>>(a);  // brings the inputs into L2
                CK(cudaDeviceSynchronize());
                tile_producer<<<tiles, 32, smem>>>(a);
                CK(cudaDeviceSynchronize());
                std::vector<unsigned long long> ht((size_t)tiles * 3);
                CK(cudaMemcpy(ht.data(), t, ht.size() * 8, cudaMemcpyDeviceToHost));
                unsigned long long s0 = ~0ull, e1 = 0;
                for (int i = 0; i < tiles; ++i) {
                    s0 = std::min(s0, ht[i * 3]), e1 = std::max(e1, ht[i * 3 + 1]);
                    per.push_back((double)(ht[i * 3 + 1] - ht[i * 3]) / 1e3);
                    cyc.push_back((double)ht[i * 3 + 2]);
                }
                span.push_back((double)(e1 - s0) / 1e3);
            }
            std::sort(span.begin(), span.end());
            std::sort(per.begin(), per.end());
            std::sort(cyc.begin(), cyc.end());
            const double cm = cyc[cyc.size() / 2];
            const double sm = span[span.size() / 2], pm = per[per.size() / 2], p90 = per[per.size() * 9 / 10];
            printf("%-7s %s: a warp's tile %.2f us (p90 %.2f; %.0f cycles), all %d tiles %.2f us\n",
                   source ? "norm" : "swiglu", cold ? "after an L2 flush" : "inputs in L2    ", pm, p90, cm, tiles, sm);
            if (js)
                fprintf(js, "  {\"source\": \"%s\", \"cold\": %d, \"tile_us\": %.3f, \"tile_p90_us\": %.3f, \"tile_cycles\": %.0f, \"all_us\": %.3f}%s\n",
                        source ? "norm" : "swiglu", cold, pm, p90, cm, sm, source == 1 && cold == 1 ? "" : ",");
        }
        CK(cudaFree(flush));
        CK(cudaFree(sink));
        CK(cudaFree(t));
        for (int k = 0; k < 2; ++k) {
            CK(cudaFree(q8[k]));
            CK(cudaFree(sc[k]));
            CK(cudaFree(su[k]));
            CK(cudaFree(bi[k]));
        }
        CK(cudaFree(x));
        CK(cudaFree(x2));
        CK(cudaFree(nw));
        CK(cudaFree(signs));
    }
    printf("CHECKS: %s\n", fails ? "FAILED" : "all passed (q8, scales, sums and bit slices bit-identical to the product's)");
    if (js) fprintf(js, "], \"checks\": %s}\n", fails ? "false" : "true"), fclose(js);
    return fails ? 2 : 0;
}
