// hadamard.cuh - the Walsh-Hadamard transform of a block's E elements, four per thread (thread t
// holds elements 4t..4t+3, so warp w holds the 128-group w), in place: H_B on every aligned B
// elements (B = 2^log2b <= E), unnormalised, in Sylvester order: H(r, c) = (-1)^popcount(r & c).
// Each stage pairs the elements whose indices differ in one bit: bits 0-1 in the thread, 2-6
// across the warp's lanes, 7 and up across warps through shared memory. The order of every
// addition is fixed, so the result bits never depend on timing.
#pragma once

#include <cuda_runtime.h>

// a, b (indices e and e + 2^bit) -> a + b, a - b.
__device__ __forceinline__ void butterfly(float &a, float &b)
{
    const float s = a + b, d = a - b;
    a = s, b = d;
}

// smem: E floats (blockDim.x * 4), free for this use; every thread of the block calls this.
__device__ __forceinline__ void hadamard_block(float (&v)[4], int log2b, float *smem)
{
    const int t = threadIdx.x, lane = t & 31;
    if (log2b > 0) butterfly(v[0], v[1]), butterfly(v[2], v[3]);
    if (log2b > 1) butterfly(v[0], v[2]), butterfly(v[1], v[3]);
    const int in_warp = log2b < 7 ? log2b : 7;
    for (int bit = 2; bit < in_warp; ++bit) {
        const int mask = 1 << (bit - 2);
        const bool upper = lane & mask;  // this lane holds the elements with the bit set
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float o = __shfl_xor_sync(0xffffffffu, v[j], mask);
            v[j] = upper ? o - v[j] : v[j] + o;
        }
    }
    for (int bit = 7; bit < log2b; ++bit) {
        const int mask = 1 << (bit - 2);  // the partner thread
        const bool upper = t & mask;
        reinterpret_cast<float4 *>(smem)[t] = make_float4(v[0], v[1], v[2], v[3]);
        __syncthreads();
        const float4 o = reinterpret_cast<const float4 *>(smem)[t ^ mask];
        __syncthreads();
        const float ov[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = upper ? ov[j] - v[j] : v[j] + ov[j];
    }
}
