// common.cuh - what every CUDA file of libpq2 shares: error plumbing, dtype conversion, the
// int8 and binary MMA wrappers and THE GPU helpers that know the PQ2 2-bit code order (pq2_plane,
// and the bit-sliced activations' order, PQ2_BITS_*).
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "internal.h"

// ---- errors ---------------------------------------------------------------------------------

// Turns a CUDA runtime error into a status + message naming the entry point and the call.
#define PQ2_CUDA_TRY(fn, call)                                                                  \
    do {                                                                                        \
        cudaError_t pq2_err_ = (call);                                                          \
        if (pq2_err_ != cudaSuccess)                                                            \
            return pq2_set_error(PQ2_ERR_CUDA, "%s: %s failed: %s (%s)", fn, #call,             \
                                 cudaGetErrorName(pq2_err_), cudaGetErrorString(pq2_err_));     \
    } while (0)

// After a launch: launch-configuration errors surface here (never a sticky device error).
static inline pq2_status pq2_launch_status(const char *fn)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return pq2_set_error(PQ2_ERR_CUDA, "%s: kernel launch failed: %s (%s)", fn,
                             cudaGetErrorName(e), cudaGetErrorString(e));
    return pq2_ok();
}

// One kernel launch configuration. pdl: launch as a programmatic dependent of the preceding
// kernel of the stream (Hopper; a no-op attribute elsewhere): the kernel may start while that one
// finishes and must call pq2_pdl_handoff() before reading what it wrote. Used in place
// (cfg points at attr): pq2_launch l(...); cudaLaunchKernelEx(&l.cfg, kernel, args...).
struct pq2_launch {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    pq2_launch(unsigned grid, unsigned block, size_t smem, cudaStream_t stream, bool pdl) : cfg(), attr()
    {
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(block);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        if (pdl) {
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
        }
    }
    pq2_launch(const pq2_launch &) = delete;
    pq2_launch &operator=(const pq2_launch &) = delete;
};

// Programmatic dependent launch, the device side (sm_90; nothing before): lets the next kernel
// of the stream launch now (it must itself wait before touching what this grid writes), then
// waits until the preceding grid has finished and its writes are visible. A kernel does work
// that reads nothing the preceding grid writes (weight streaming) before calling this.
__device__ __forceinline__ void pq2_pdl_handoff()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static inline bool pq2_aligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

#define PQ2_CHECK_ALIGN(fn, ptr, a)                                                             \
    do {                                                                                        \
        if (!pq2_aligned((ptr), (a)))                                                           \
            return pq2_set_error(PQ2_ERR_ALIGNMENT, "%s: %s = %p is not %d-byte aligned", fn,   \
                                 #ptr, (const void *)(ptr), (int)(a));                          \
    } while (0)

// ---- dtypes ---------------------------------------------------------------------------------

__device__ __forceinline__ void pq2_store_from_f32(void *p, size_t i, int dtype, float v)
{
    switch (dtype) {
    case PQ2_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case PQ2_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

// ---- the 2-bit code order on the GPU --------------------------------------------------------
// A code byte holds the codes of 4 consecutive weights, weight 4b+s at bits 2s..2s+1. Masking a
// 32-bit word of code bytes with the plane-s mask leaves code * 4^s in every byte (at most 192:
// the MMA reads A as u8), i.e. the codes that meet activation plane s of the Q8 plane order.
// The exact int32 MMA result of plane s is therefore 4^s times the plane's dot product.
template <int S>
__device__ __forceinline__ uint32_t pq2_plane(uint32_t codes)
{
    return codes & (0x03030303u << (2 * S));
}

// The same plane moved to the top two bits of every byte: code * 64 whatever s (at most 192).
// Bits 2s..2s+1 of a byte shifted left by 6-2s stay in that byte; the mask drops what crossed in.
template <int S>
__device__ __forceinline__ uint32_t pq2_plane_top(uint32_t codes)
{
    return (codes << (6 - 2 * S)) & 0xC0C0C0C0u;
}

// D = A(16x32 u8, row) * B(32x8 s8, col) + C, int32 exact.
__device__ __forceinline__ void pq2_mma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1, const int (&c)[4])
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]),
                   "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

// D = A(16x256 b1, row) AND-POPC B(256x8 b1, col) + C: d[i][j] += popc(A row i & B column j),
// int32 exact. The bit-sliced decode core (m == 1, decode_rowblock.cu) reads the lane's 16 code
// bytes of a sub-tile as A unchanged: bit 2s+e of code byte b is bit e of weight 4b+s's code.
__device__ __forceinline__ void pq2_bmma_and_popc(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                  uint32_t b1, const int (&c)[4])
{
    asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]),
          "r"(c[2]), "r"(c[3]));
}

// ---- bit-sliced activations (workspace only; the m == 1 row-block kernels) -------------------
// Per token and 128-group, 128 words (512 bytes): word (b*4 + tq)*4 + w for bit b of the q8
// byte (two's complement: bit 7 weighs -128), lane quad tq (0..3) and w in 0..3:
//   w = 0, 1 ("B1"): bits 8c + 2s and 8c + 2s + 1 both hold bit b of q of element
//                    32*tq + 16*w + 4*c + s (c, s in 0..3);
//   w = 2, 3 ("B2"): word w - 2 AND 0xAAAAAAAA (the odd bits only).
// So B1 meets both bits of the code of the same weight in a lane's code word (tiles and planes
// lanes hold code bytes tq*8 + 4w + c), and AND-POPC(codes, B1) + AND-POPC(codes, B2) is
// sum(code * bit b of q): the integer dot of bit plane b, exactly.
#define PQ2_BITS_GROUP_WORDS 128

// Token-constant records (the row-block kernels at 2 <= m <= 8; decode.cuh,
// pq2_decode_needs_records): per 128-group, PQ2_TC_PAIRS records of 16 bytes, record pair holding
// {-sum[t0], -sum[t1], xs[t0], xs[t1]} (the floats as their bits) of tokens t0 = min(2 pair, m-1),
// t1 = min(2 pair + 1, m-1).
#define PQ2_TC_PAIRS 4
