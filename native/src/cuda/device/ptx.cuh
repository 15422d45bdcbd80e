// ptx.cuh - every inline-PTX wrapper of the CUDA half, in one place: programmatic dependent
// launch, streaming loads, the int8, binary and bf16 tensor-core MMAs, ldmatrix, bulk copies
// and mbarriers (sm_90), cp.async, wgmma.
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

// ---- barriers -------------------------------------------------------------------------------

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
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

// Shared-memory loads at a 32-bit shared address (the sm_90a GEMM's consumer loop steps its
// addresses itself); volatile, so they stay after the mbarrier wait that makes the bytes valid.
__device__ __forceinline__ uint2 lds_u32x2(uint32_t at)
{
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(at) : "memory");
    return v;
}
__device__ __forceinline__ uint32_t lds_u32(uint32_t at)
{
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(at) : "memory");
    return v;
}
__device__ __forceinline__ float4 lds_f32x4(uint32_t at)
{
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(at)
                 : "memory");
    return v;
}
// Keeps a value in a register from here on: the compiler cannot recompute it (a loop's
// loop-invariant addresses, which ptxas otherwise rematerialises in every iteration).
template <bool PIN> __device__ __forceinline__ uint32_t pin_if(uint32_t v)
{
    if constexpr (PIN) asm volatile("" : "+r"(v));
    return v;
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
// int32 exact. The bit-sliced core (m == 1, rowblock/cores.cuh) reads the lane's 16 code
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

// D += A(16x16 bf16, row; rows 8-15 zero) * B(16x8 bf16, col), fp32: a0 / a2 are A's
// registers 0 and 2 (rows gid, columns 2tq.. and 2tq+8..), registers 1 and 3 are zero.
__device__ __forceinline__ void pq2_mma_bf16_16816_half(float (&d)[4], uint32_t a0, uint32_t a2,
                                                        uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// D += A(16x8 bf16, row; rows 8-15 zero) * B(8x8 bf16, col), fp32.
__device__ __forceinline__ void pq2_mma_bf16_1688_half(float (&d)[4], uint32_t a0, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(0u), "r"(b0));
}

// ---- sm_90 bulk copies and mbarriers --------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

// mbarrier with `count` arrivals per phase.
__device__ __forceinline__ void mbar_init_count(uint64_t *bar, uint32_t count)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
#else
    (void)bar, (void)count;
#endif
}

// Makes the mbarrier initialisations before it visible to the async proxy (bulk copies, TMA)
// and to the cluster.
__device__ __forceinline__ void mbar_init_fence()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// mbarrier with one arrival per phase, its initialisation fenced (mbar_init_fence).
__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
    mbar_init_count(bar, 1);
    mbar_init_fence();
}

// One arrival that also expects `bytes` of bulk copies before the phase completes.
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
#endif
}

// Arms the barrier for `bytes` of bulk copies and copies [src, src+bytes0) and [src1, ...).
__device__ __forceinline__ void bulk_copy2(uint64_t *bar, void *dst0, const void *src0,
                                           uint32_t bytes0, void *dst1, const void *src1,
                                           uint32_t bytes1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t b = smem_u32(bar);
    mbar_expect_tx(bar, bytes0 + bytes1);
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

// Waits until the phase `parity` of the barrier at shared-memory address `bar` has completed (its
// bytes have landed).
__device__ __forceinline__ void mbar_wait_at(uint32_t bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
#else
    (void)bar, (void)parity;
#endif
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    mbar_wait_at(smem_u32(bar), parity);
}

// One arrival at the barrier at shared-memory address `bar` (release: this thread's earlier
// accesses happen before the phase completes).
__device__ __forceinline__ void mbar_arrive_at(uint32_t bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#else
    (void)bar;
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    mbar_arrive_at(smem_u32(bar));
}

// The box of a 4-D tensor map at (x, y, z, w) into shared memory, completing its bytes on bar.
__device__ __forceinline__ void tma_load_4d(uint64_t *bar, void *dst, const void *map, int x, int y,
                                            int z, int w)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(smem_u32(dst)),
                 "l"(map), "r"(x), "r"(y), "r"(z), "r"(w), "r"(smem_u32(bar))
                 : "memory");
#else
    (void)bar, (void)dst, (void)map, (void)x, (void)y, (void)z, (void)w;
#endif
}

// The box of a 2-D tensor map at (x, y) (x the inner coordinate) into shared memory,
// completing its bytes on bar; elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_2d(uint64_t *bar, void *dst, const void *map, int x, int y)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
                 "l"(map), "r"(x), "r"(y), "r"(smem_u32(bar))
                 : "memory");
#else
    (void)bar, (void)dst, (void)map, (void)x, (void)y;
#endif
}

// Orders this thread's earlier shared-memory reads before later bulk copies into the same bytes.
__device__ __forceinline__ void fence_proxy_async()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// ---- ldmatrix (sm_80) -----------------------------------------------------------------------

// Four 8x8 b16 matrices from shared memory (lanes 8i..8i+7 address matrix i's rows).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
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
// ---- sm_90a warpgroup MMAs (wgmma) ----------------------------------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PQ2_WGMMA 1
#else
#define PQ2_WGMMA 0
#endif

// Orders this warpgroup's register writes (A fragments, accumulators) before the wgmmas after it.
__device__ __forceinline__ void wgmma_fence()
{
#if PQ2_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit()
{
#if PQ2_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Waits until at most N of this warpgroup's committed wgmma groups are pending.
template <int N> __device__ __forceinline__ void wgmma_wait()
{
#if PQ2_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// This warpgroup's registers per thread become N (a multiple of 8 in 24..256): dec releases
// registers to the block's pool, inc waits until the pool holds enough.
template <int N> __device__ __forceinline__ void setmaxnreg_dec()
{
#if PQ2_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc()
{
#if PQ2_WGMMA
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
// Keeps the compiler from moving reads or writes of r across a wgmma fence, commit or wait.
__device__ __forceinline__ void wgmma_pin(int &r)
{
    asm volatile("" : "+r"(r)::"memory");
}

// The shared-memory matrix descriptor of a K-major operand whose rows are 128 bytes, stored in
// 8-row atoms of 1024 bytes with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_addr)
{
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

// D(64 x 32, s32) = A(64 x 32 u8, registers: a warp's 16 rows in the m16n8k32 A fragment
// layout) * B(32 x 32 s8, K-major in shared memory at desc) (+ D when accumulate).
__device__ __forceinline__ void wgmma_u8s8_n32(int (&d)[16], const uint32_t (&a)[4], uint64_t desc,
                                               bool accumulate)
{
#if PQ2_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, "
                 "p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}

// D(64 x 64, s32) = A(64 x 32 u8, registers: a warp's 16 rows in the m16n8k32 A fragment
// layout) * B(64 x 32 s8, K-major in shared memory at desc) (+ D when accumulate).
__device__ __forceinline__ void wgmma_u8s8_n64(int (&d)[32], const uint32_t (&a)[4], uint64_t desc,
                                               bool accumulate)
{
#if PQ2_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%"
                 "22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]),
                   "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                   "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]),
                   "+r"(d[30]), "+r"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}

// D(64 x 96, s32) = A(64 x 32 u8, registers: a warp's 16 rows in the m16n8k32 A fragment
// layout) * B(96 x 32 s8, K-major in shared memory at desc) (+ D when accumulate).
__device__ __forceinline__ void wgmma_u8s8_n96(int (&d)[48], const uint32_t (&a)[4], uint64_t desc,
                                               bool accumulate)
{
#if PQ2_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%"
                 "22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%"
                 "42,%43,%44,%45,%46,%47}, {%48,%49,%50,%51}, %52, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]),
                   "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                   "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]),
                   "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]),
                   "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]),
                   "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}

// D(64 x 128, s32) = A(64 x 32 u8, registers: a warp's 16 rows in the m16n8k32 A fragment
// layout) * B(128 x 32 s8, K-major in shared memory at desc) (+ D when accumulate).
__device__ __forceinline__ void wgmma_u8s8_n128(int (&d)[64], const uint32_t (&a)[4], uint64_t desc,
                                                bool accumulate)
{
#if PQ2_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%"
                 "22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%"
                 "42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%"
                 "62,%63}, {%64,%65,%66,%67}, %68, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]),
                   "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                   "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]),
                   "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]),
                   "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]),
                   "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                   "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]),
                   "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]),
                   "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}
