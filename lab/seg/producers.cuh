// producers.cuh - lab (issue 36): the m = 1 producers of a matmul's operand recomputed inside a
// CTA of the persistent kernel, straight into shared memory (bit slices, scales, sums), with the
// product's arithmetic (rotate/rotate.cu: load_source, norm_elements, finish; rotate/hadamard.cuh;
// quantize/q8_group.cuh), so the bits are today's producers'. Tiles of E = 1024 elements (the
// 27B's rotation block) are taken by groups of 256 threads as the product's 256-thread blocks
// take them; the row's sum of squares by the first 256 threads in the product's order.
#pragma once

#include <cuda_bf16.h>

#include "device/dtypes.cuh"
#include "quantize/q8_group.cuh"
#include "rotate/hadamard.cuh"

enum seg_producer { SEG_STATIC = 0, SEG_NORM = 1, SEG_SWIGLU = 2, SEG_ROTATE = 3 };

// hadamard.cuh's cross-warp stages with a named barrier over the consumer threads instead of
// __syncthreads (the same additions in the same order).
template <int C>
__device__ __forceinline__ void cross_warp_stages_nb(float (&v)[4], float *smem, int nthr)
{
    const int t = threadIdx.x;
    reinterpret_cast<float4 *>(smem)[t] = make_float4(v[0], v[1], v[2], v[3]);
    named_barrier_sync(1, nthr);
    float x[1 << C][4];
#pragma unroll
    for (int j = 0; j < (1 << C); ++j) {
        if (j == 0) {
#pragma unroll
            for (int e = 0; e < 4; ++e) x[0][e] = v[e];
        } else {
            const float4 o = reinterpret_cast<const float4 *>(smem)[t ^ (j << 5)];
            x[j][0] = o.x, x[j][1] = o.y, x[j][2] = o.z, x[j][3] = o.w;
        }
    }
#pragma unroll
    for (int s = 0; s < C; ++s) {
        const float sign = stage_sign((t >> (5 + s)) & 1);
#pragma unroll
        for (int j = 0; j < (1 << C); j += 2 << s)
#pragma unroll
            for (int e = 0; e < 4; ++e) x[j][e] = stage_update(x[j][e], x[j | (1 << s)][e], sign);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = x[0][e];
}

// H_1024 of the 256-thread group's 1024 elements (log2b 10: bits 0-1 in the thread, 2-6 across
// lanes, 7-9 in one exchange), as hadamard_block(v, 10, smem).
__device__ __forceinline__ void hadamard_1024_nb(float (&v)[4], float *smem, int nthr)
{
    const int lane = threadIdx.x & 31;
    butterfly(v[0], v[1]), butterfly(v[2], v[3]);
    butterfly(v[0], v[2]), butterfly(v[1], v[3]);
#pragma unroll
    for (int bit = 2; bit < 7; ++bit) {
        const int mask = 1 << (bit - 2);
        const float sign = stage_sign(lane & mask);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            v[j] = stage_update(v[j], __shfl_xor_sync(0xffffffffu, v[j], mask), sign);
    }
    cross_warp_stages_nb<3>(v, smem, nthr);
}

// bitslice_group (device/codes.cuh) with one word out per lane instead of 16 bytes: its w0 and w1
// carry bits at even positions only, so w0 | w1 << 1 keeps both, and the reader rebuilds the
// product's slice (3 w0, 3 w1, 2 w0, 2 w1) with a few integer instructions. 128 bytes a group
// instead of 512: the operand region of a K = 17408 matrix shrinks from 70 KB to 18.5 KB.
__device__ __forceinline__ void bitslice_group_packed(const int (&q)[4], int lane,
                                                      uint32_t *__restrict__ out)
{
    uint32_t lo = (uint32_t)(q[0] & 0xff) | (uint32_t)(q[1] & 0xff) << 16;
    uint32_t hi = (uint32_t)(q[2] & 0xff) | (uint32_t)(q[3] & 0xff) << 16;
    uint32_t t;
    t = (lo ^ (lo >> 7)) & 0x00AA00AAu, lo ^= t ^ (t << 7);
    t = (hi ^ (hi >> 7)) & 0x00AA00AAu, hi ^= t ^ (t << 7);
    t = (lo ^ (lo >> 14)) & 0x0000CCCCu, lo ^= t ^ (t << 14);
    t = (hi ^ (hi >> 14)) & 0x0000CCCCu, hi ^= t ^ (t << 14);
    t = (lo ^ (hi << 4)) & 0xF0F0F0F0u, lo ^= t, hi ^= t >> 4;
    const int j = lane & 7;
    const bool x4 = j & 4, x2 = j & 2, x1 = j & 1;
    uint32_t r = __shfl_xor_sync(0xffffffffu, x4 ? lo : hi, 4);
    const uint32_t a4 = x4 ? r : lo, b4 = x4 ? hi : r;
    r = __shfl_xor_sync(0xffffffffu, __byte_perm(a4, b4, x2 ? 0x5410 : 0x7632), 2);
    const uint32_t a2 = __byte_perm(a4, r, x2 ? 0x3254 : 0x5410),
                   b2 = __byte_perm(b4, r, x2 ? 0x3276 : 0x7610);
    r = __shfl_xor_sync(0xffffffffu, __byte_perm(a2, b2, x1 ? 0x6420 : 0x7531), 1);
    const uint32_t w0 = __byte_perm(a2, r, x1 ? 0x3514 : 0x5240),
                   w1 = __byte_perm(b2, r, x1 ? 0x3716 : 0x7260);
    out[4 * j + (lane >> 3)] = w0 | (w1 << 1);
}

// The 16-byte bit slice of a lane from its packed word.
__device__ __forceinline__ uint4 unpack_slice(uint32_t p)
{
    const uint32_t w0 = p & 0x55555555u, w1 = (p >> 1) & 0x55555555u;
    return make_uint4(w0 * 3u, w1 * 3u, w0 << 1, w1 << 1);
}

// q8_store_group (quantize/q8_group.cuh) at m = 1 with packed bit slices: the same scale, sum
// and quotients (the same arithmetic, copied for the lab), bits at group g's 32 words.
__device__ __forceinline__ void q8_store_group_packed(const float (&v)[4], int lane, int g,
                                                      float *scales, int *sums, uint32_t *bits)
{
    uint32_t abits = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t u = __float_as_uint(fabsf(v[j]));
        abits = max(abits, u > 0x7f800000u ? 0u : u);
    }
    const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, abits));
    const float scale = amax * (1.0f / 127.0f);
    const float div = scale > 0.0f ? scale : 1.0f;
    float rcp;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rcp) : "f"(div));
    rcp = __fmaf_rn(rcp, __fmaf_rn(-div, rcp, 1.0f), rcp);
    float q[4];
    rint_quotients(v, div, rcp, q);
    int sum = 0, qs[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        qs[j] = q[j] == q[j] ? (int)fminf(127.0f, fmaxf(-127.0f, q[j])) : 0;
        sum += qs[j];
    }
    sum = __reduce_add_sync(0xffffffffu, sum);
    bitslice_group_packed(qs, lane, bits + (size_t)g * 32);
    if (lane == 0) scales[g] = scale, sums[g] = sum;
}

struct seg_prod {
    int kind;             // seg_producer
    const void *x, *x2;   // bf16 [K]: NORM x and residual, SWIGLU gate and up, ROTATE x
    const float *w;       // NORM: the norm weight [K] (f32)
    const int8_t *signs;  // [K]
    float eps, rsqrt_b;
    void *h_out;          // NORM: h = x + residual (bf16), written by CTA 0
};

// bf16 x 4 from a raw 8-byte load, as pq2_load4<PQ2_DTYPE_BF16> converts it.
__device__ __forceinline__ void bf16x4(uint2 u, float (&v)[4])
{
    const float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.y));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}

// The inputs of one pass of a thread (static and dynamic), loaded a pass ahead of their use.
struct pass_in {
    uint2 a, b;   // x / gate and residual / up (bf16 x 4)
    float4 w;     // NORM: the norm weight
    char4 sg;     // signs
};

template <bool PACK>
__device__ __forceinline__ void pass_load(const seg_prod &p, int e, pass_in &in)
{
    in.sg = *reinterpret_cast<const char4 *>(p.signs + e);
    if (p.kind == SEG_NORM) {
        in.w = *reinterpret_cast<const float4 *>(p.w + e);
        if (PACK) {  // the row again: h = x + residual is recomputed in the pass (no hbuf kept)
            in.a = *reinterpret_cast<const uint2 *>(static_cast<const __nv_bfloat16 *>(p.x) + e);
            in.b = *reinterpret_cast<const uint2 *>(static_cast<const __nv_bfloat16 *>(p.x2) + e);
        }
    } else {
        in.a = *reinterpret_cast<const uint2 *>(static_cast<const __nv_bfloat16 *>(p.x) + e);
        if (p.kind == SEG_SWIGLU)
            in.b = *reinterpret_cast<const uint2 *>(static_cast<const __nv_bfloat16 *>(p.x2) + e);
    }
}

// The operand of a matrix of G groups into shared memory. xch: 4 * nthr floats (the exchange),
// hbuf: K floats (NORM), red: 8 floats. Every consumer thread calls it; ends with a barrier.
// The loads are issued ahead of their use (the row of a NORM at once, each pass's inputs one pass
// ahead); the arithmetic and its order are the product's.
// only_tile >= 0: the row's sum as always, then only that tile of the operand, by the first 256
// threads (the others take part in the exchanges), into the outputs given (global memory here).
template <bool PACK = false>
__device__ __forceinline__ void cta_produce(const seg_prod &p, int G, int nthr, float *xch,
                                            float *hbuf, float *red, uint4 *act_xb, float *act_xs,
                                            int *act_sums, bool first_cta, int only_tile = -1)
{
    constexpr int kRowTiles = 8;  // a NORM row held in registers up to 8 tiles (K 8192)
    const int T = threadIdx.x, t = T & 255, grp = T >> 8, groups = nthr >> 8;
    const int width = G * 128, tiles = width >> 10;
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.x);
    const __nv_bfloat16 *x2 = static_cast<const __nv_bfloat16 *>(p.x2);
    const int passes = only_tile >= 0 ? 1 : (tiles + groups - 1) / groups;
    auto tile_of = [&](int pass) {
        const int tl = only_tile >= 0 ? only_tile : pass * groups + grp;
        return tl < tiles ? tl : tiles - 1;
    };
    pass_in next;
    pass_load<PACK>(p, tile_of(0) * 1024 + 4 * t, next);
    float scale = 0.0f;
    if (p.kind == SEG_NORM) {
        if (grp == 0) {
            uint2 hx[kRowTiles], hr[kRowTiles];
#pragma unroll
            for (int tile = 0; tile < kRowTiles; ++tile)
                if (tile < tiles) {
                    hx[tile] = *reinterpret_cast<const uint2 *>(x + tile * 1024 + 4 * t);
                    hr[tile] = *reinterpret_cast<const uint2 *>(x2 + tile * 1024 + 4 * t);
                }
            float ss = 0.0f;
#pragma unroll
            for (int tile = 0; tile < kRowTiles; ++tile) {
                if (tile >= tiles) break;
                const int e = tile * 1024 + 4 * t;
                float h[4], r[4];
                bf16x4(hx[tile], h);
                bf16x4(hr[tile], r);
#pragma unroll
                for (int j = 0; j < 4; ++j) h[j] += r[j];
#pragma unroll
                for (int j = 0; j < 4; ++j) ss = fmaf(h[j], h[j], ss);
                if (!PACK) *reinterpret_cast<float4 *>(hbuf + e) = make_float4(h[0], h[1], h[2], h[3]);
                if (first_cta && p.h_out) pq2_store4(p.h_out, PQ2_DTYPE_BF16, e, h);
            }
            for (int tile = kRowTiles; tile < tiles; ++tile) {  // longer rows, a tile at a time
                const int e = tile * 1024 + 4 * t;
                float h[4], r[4];
                pq2_load4<PQ2_DTYPE_BF16>(x + e, h);
                pq2_load4<PQ2_DTYPE_BF16>(x2 + e, r);
#pragma unroll
                for (int j = 0; j < 4; ++j) h[j] += r[j];
#pragma unroll
                for (int j = 0; j < 4; ++j) ss = fmaf(h[j], h[j], ss);
                if (!PACK) *reinterpret_cast<float4 *>(hbuf + e) = make_float4(h[0], h[1], h[2], h[3]);
                if (first_cta && p.h_out) pq2_store4(p.h_out, PQ2_DTYPE_BF16, e, h);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if ((T & 31) == 0) red[T >> 5] = ss;
        }
        named_barrier_sync(1, nthr);
        float s = 0.0f;
        for (int w = 0; w < 8; ++w) s += red[w];
        scale = 1.0f / sqrtf(s / (float)width + p.eps);
    }
    for (int pass = 0; pass < passes; ++pass) {
        const bool live = only_tile >= 0 ? grp == 0 : pass * groups + grp < tiles;
        const int e = tile_of(pass) * 1024 + 4 * t;
        const pass_in in = next;
        if (pass + 1 < passes) pass_load<PACK>(p, tile_of(pass + 1) * 1024 + 4 * t, next);
        float v[4];
        if (p.kind == SEG_NORM) {
            float4 h;
            if (PACK) {  // h = x + residual again, the same float additions as the sum's pass
                float hx[4], hr[4];
                bf16x4(in.a, hx);
                bf16x4(in.b, hr);
                h = make_float4(hx[0] + hr[0], hx[1] + hr[1], hx[2] + hr[2], hx[3] + hr[3]);
            } else {
                h = *reinterpret_cast<const float4 *>(hbuf + e);
            }
            const float4 w = in.w;
            v[0] = h.x * scale * w.x, v[1] = h.y * scale * w.y;
            v[2] = h.z * scale * w.z, v[3] = h.w * scale * w.w;
        } else if (p.kind == SEG_SWIGLU) {
            float g[4], u[4];
            bf16x4(in.a, g);
            bf16x4(in.b, u);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        } else {
            bf16x4(in.a, v);
        }
        const char4 s = in.sg;
        v[0] *= s.x, v[1] *= s.y, v[2] *= s.z, v[3] *= s.w;
        hadamard_1024_nb(v, xch, nthr);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] *= p.rsqrt_b;
        if (live) {
            const int g = e >> 7;
            if (PACK)
                q8_store_group_packed(v, T & 31, g, act_xs, act_sums, reinterpret_cast<uint32_t *>(act_xb));
            else
                q8_store_group(v, T & 31, 0, g, g, 1, width, nullptr, act_xs, act_sums,
                               reinterpret_cast<uint32_t *>(act_xb), nullptr);
        }
        named_barrier_sync(1, nthr);  // xch is read until here
    }
}
