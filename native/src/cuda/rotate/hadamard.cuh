// hadamard.cuh - the Walsh-Hadamard transform of a block's E elements, four per thread (thread t
// holds elements 4t..4t+3, so warp w holds the 128-group w), in place: H_B on every aligned B
// elements (B = 2^log2b <= E), unnormalised, in Sylvester order: H(r, c) = (-1)^popcount(r & c).
// Each stage pairs the elements whose indices differ in one bit: bits 0-1 in the thread, 2-6
// across the warp's lanes, 7 and up across warps through shared memory (up to three such bits
// from one exchange). The order of every addition is fixed, so the result bits never depend on
// timing.
#pragma once

#include <cuda_runtime.h>

// a, b (indices e and e + 2^bit) -> a + b, a - b.
__device__ __forceinline__ void butterfly(float &a, float &b)
{
    const float s = a + b, d = a - b;
    a = s, b = d;
}

// A stage's update of an element from its partner's value o: o - v where this thread holds the
// upper index (sign -1), else v + o (sign +1). One FFMA: v * (+-1) is exact, so the FFMA rounds
// once, exactly as the FADD it stands for (the same bits, signed zeros included).
__device__ __forceinline__ float stage_update(float v, float o, float sign)
{
    return fmaf(v, sign, o);
}

__device__ __forceinline__ float stage_sign(bool upper)
{
    return upper ? -1.0f : 1.0f;
}

// The stages of bits 7 .. 6 + C (C <= 3) from one exchange: every thread stores its four values,
// reads those of the threads t ^ (j << 5) (j < 2^C, the same lane in the partner warps) and forms
// its own results from them with the staged transform's additions, in its order and with its
// operands (so the bits are the same): at stage s the value of thread u and of u ^ (32 << s) give
// u's next value, o - v where bit 5 + s of u is set, else v + o. Entry j of x stands for thread
// t ^ (j << 5); stage s updates the entries whose bits 0..s are clear (the others are no longer
// needed), 2^C - 1 additions per element in all. Ends with smem still being read.
template <int C> __device__ __forceinline__ void cross_warp_stages(float (&v)[4], float *smem)
{
    const int t = threadIdx.x;
    reinterpret_cast<float4 *>(smem)[t] = make_float4(v[0], v[1], v[2], v[3]);
    __syncthreads();
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
        // the same for every entry updated at stage s
        const float sign = stage_sign((t >> (5 + s)) & 1);
#pragma unroll
        for (int j = 0; j < (1 << C); j += 2 << s)
#pragma unroll
            for (int e = 0; e < 4; ++e) x[j][e] = stage_update(x[j][e], x[j | (1 << s)][e], sign);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = x[0][e];
}

// smem: E floats (blockDim.x * 4), free for this use; every thread of the block calls this. It is
// still being read when this returns: a caller that writes smem afterwards syncs first.
__device__ __forceinline__ void hadamard_block(float (&v)[4], int log2b, float *smem)
{
    const int t = threadIdx.x, lane = t & 31;
    if (log2b > 0) butterfly(v[0], v[1]), butterfly(v[2], v[3]);
    if (log2b > 1) butterfly(v[0], v[2]), butterfly(v[1], v[3]);
#pragma unroll
    for (int bit = 2; bit < 7; ++bit) {  // unrolled: the partner lane is an immediate
        if (bit >= log2b) break;
        const int mask = 1 << (bit - 2);
        // -1 where this lane holds the elements with the bit set
        const float sign = stage_sign(lane & mask);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            v[j] = stage_update(v[j], __shfl_xor_sync(0xffffffffu, v[j], mask), sign);
    }
    switch (log2b - 7) {
    case 1: cross_warp_stages<1>(v, smem); return;
    case 2: cross_warp_stages<2>(v, smem); return;
    case 3: cross_warp_stages<3>(v, smem); return;
    default: break;
    }
    for (int bit = 7; bit < log2b; ++bit) {  // B >= 2048: one exchange per stage
        const int mask = 1 << (bit - 2);     // the partner thread
        const bool upper = t & mask;
        reinterpret_cast<float4 *>(smem)[t] = make_float4(v[0], v[1], v[2], v[3]);
        __syncthreads();
        const float4 o = reinterpret_cast<const float4 *>(smem)[t ^ mask];
        __syncthreads();
        const float ov[4] = {o.x, o.y, o.z, o.w};
        const float sign = stage_sign(upper);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = stage_update(v[j], ov[j], sign);
    }
}
