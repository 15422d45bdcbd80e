// ptx.cuh - every inline-PTX wrapper of the CUDA half, in one place: programmatic dependent
// launch, streaming loads, the int8 and binary tensor-core MMAs, bulk copies and mbarriers (sm_90).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

// ---- programmatic dependent launch ----------------------------------------------------------

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

// ---- loads ----------------------------------------------------------------------------------

// 16 bytes read once: no L1 allocation.
__device__ __forceinline__ uint4 ld_stream16(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_stream8(const uint8_t *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ld_stream4(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// m > 8 row-block core: the four plane fragments of B (q8 plane order: plane s of the group 32
// bytes after plane s - 1) from the lane's pointer into one token's group: one address,
// immediate offsets.
__device__ __forceinline__ void ld_planes8(const int8_t *p, uint2 (&b)[4])
{
    asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%8];\n\t"
                 "ld.global.nc.v2.u32 {%2,%3}, [%8+32];\n\t"
                 "ld.global.nc.v2.u32 {%4,%5}, [%8+64];\n\t"
                 "ld.global.nc.v2.u32 {%6,%7}, [%8+96];"
                 : "=r"(b[0].x), "=r"(b[0].y), "=r"(b[1].x), "=r"(b[1].y), "=r"(b[2].x),
                   "=r"(b[2].y), "=r"(b[3].x), "=r"(b[3].y)
                 : "l"(p));
}

// m > 8 row-block core: one 16-byte token-constant record at shared address `at`: the two C
// starts and the two activation scales.
__device__ __forceinline__ void lds_token_consts(uint32_t at, int (&c)[2], float (&xs)[2])
{
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(c[0]), "=r"(c[1]), "=f"(xs[0]), "=f"(xs[1])
                 : "r"(at));
}

// ---- tensor-core MMAs -----------------------------------------------------------------------

// D = A(16x32 u8, row) * B(32x8 s8, col) + C, int32 exact.
__device__ __forceinline__ void pq2_mma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1, const int (&c)[4])
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]),
          "r"(c[2]), "r"(c[3]));
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

// ---- sm_90 bulk copies and mbarriers --------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Arms the barrier for `bytes` of bulk copies and copies [src, src+bytes0) and [src1, ...).
__device__ __forceinline__ void bulk_copy2(uint64_t *bar, void *dst0, const void *src0,
                                           uint32_t bytes0, void *dst1, const void *src1,
                                           uint32_t bytes1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t b = smem_u32(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b),
                 "r"(bytes0 + bytes1)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_u32(dst0)),
        "l"(src0), "r"(bytes0), "r"(b)
        : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_u32(dst1)),
        "l"(src1), "r"(bytes1), "r"(b)
        : "memory");
#else
    (void)bar, (void)dst0, (void)src0, (void)bytes0, (void)dst1, (void)src1, (void)bytes1;
#endif
}

// Waits until the barrier's phase `parity` has completed (its bytes have landed).
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
#else
    (void)bar, (void)parity;
#endif
}

// Orders this thread's earlier shared-memory reads before later bulk copies into the same bytes.
__device__ __forceinline__ void fence_proxy_async()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// ---- cp.async (sm_80): global -> shared copies the GEMM family pipelines ---------------------

// 16 bytes (.cg: through L2 only), or 16 zero bytes when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

// 4 bytes, or 4 zero bytes when !valid.
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's copy groups are pending.
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
