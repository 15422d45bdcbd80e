// LAB (issue 35, batch 16): the attention decode's streaming part in CUDA, to see whether a
// cp.async pipeline reaches the KV cache's read rate where today's Triton program (128 x 2
// positions, one program an SM, its tiles loaded then computed) takes 2x the floor.
//
// One block of 4 warps per (chunk of CH = 128 or 256 positions, kv head, sequence), the grid and
// the partial sums of today's kernel at 128 x 1 or 128 x 2 tiles (AttentionScratch's layout,
// merged by today's _attention_merge with BS = CH). Tiles of 32 positions (K and V, 16 KB each, rows padded
// to 528 bytes against bank conflicts) stream through S stages of cp.async (2 blocks an SM at
// S = 3). Warp w takes positions 8w..8w+7 of each tile: scores by mma m16n8k16 (the group's 6
// query heads in rows 0-5 of A, zero rows above), an online softmax of its own (base 2), P V by
// mma m16n8k8 into 16 x 256 fp32 accumulators; at the end the 4 warps merge in shared memory in
// warp order (deterministic). Rows past the position are zero-filled by the copies and masked.
//
// The query comes normed and rotated (bf16 [B, H, 256]) and the new key and value are in the
// cache already: the prep the Triton kernel fuses is left to the probe (torch).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int D = 256, G = 6, T = 32, ROWB = D * 2 + 16;

struct Params {
    const __nv_bfloat16 *q;        // [B, H, D]
    const __nv_bfloat16 *k, *v;    // cache: element strides s_cb, s_ch, s_cs
    const int64_t *positions;      // [B]
    float *m_out, *l_out, *acc_out;
    int64_t s_cb, s_ch, s_cs;
    int H, n_chunks;
    float scale_log2;              // scale * log2(e)
};

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

// d = a (16x16 bf16, rows 8-15 zero) b (16x8) + d
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                         uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
// d = a (16x8 bf16, rows 8-15 zero) b (8x8) + d
__device__ __forceinline__ void mma1688(float (&d)[4], uint32_t a0, uint32_t b0)
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(0u), "r"(b0));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

template <int S, int CH>
__global__ void __launch_bounds__(128, 2) attn_stream_kernel(const Params p)
{
    extern __shared__ __align__(16) uint8_t sm[];
    const int c = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int64_t pos = p.positions[b];
    const int64_t base = (int64_t)c * CH;
    if (base > pos) return;  // the merge reads chunks 0 .. pos / CH only
    const int64_t n_left = (pos - base) / T + 1;
    const int n_t = n_left < CH / T ? (int)n_left : CH / T;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tq = lane & 3;
    const __nv_bfloat16 *kc = p.k + b * p.s_cb + kvh * p.s_ch;
    const __nv_bfloat16 *vc = p.v + b * p.s_cb + kvh * p.s_ch;

    // tile t's keys and values into stage t % S: 32 rows x 32 chunks of 16 bytes each, 8 a
    // thread; rows past the position zero-filled (and not read)
    auto issue = [&](int t) {
        uint8_t *ks = sm + (t % S) * (2 * T * ROWB), *vs = ks + T * ROWB;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int id = tid + 128 * i, r = id >> 5, ch = id & 31;
            const int64_t row = base + (int64_t)t * T + r;
            const bool ok = row <= pos;
            const int64_t off = (ok ? row : 0) * p.s_cs + ch * 8;
            cp16(ks + r * ROWB + ch * 16, kc + off, ok);
            cp16(vs + r * ROWB + ch * 16, vc + off, ok);
        }
    };
#pragma unroll
    for (int t = 0; t < S - 1; ++t) {
        if (t < n_t) issue(t);
        cp_commit();
    }

    // the group's queries as A fragments (rows gid < G; rows 8-15 are the zero registers)
    uint32_t qa0[16], qa2[16];
    {
        const bool real = gid < G;
        const __nv_bfloat16 *qp = p.q + ((int64_t)b * p.H + kvh * G + (real ? gid : 0)) * D;
#pragma unroll
        for (int s = 0; s < 16; ++s) {
            const uint32_t x0 = *reinterpret_cast<const uint32_t *>(qp + 16 * s + 2 * tq);
            const uint32_t x2 = *reinterpret_cast<const uint32_t *>(qp + 16 * s + 8 + 2 * tq);
            qa0[s] = real ? x0 : 0u;
            qa2[s] = real ? x2 : 0u;
        }
    }

    float acc[32][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m_run = -INFINITY, l_run = 0.f;  // row gid (rows gid + 8 are padding)

    for (int t = 0; t < n_t; ++t) {
        if (t + S - 1 < n_t) issue(t + S - 1);
        cp_commit();
        cp_wait<S - 1>();
        __syncthreads();
        const uint8_t *ks = sm + (t % S) * (2 * T * ROWB), *vs = ks + T * ROWB;
        // scores of positions 8w .. 8w+7 of the tile
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
        const uint8_t *krow = ks + (warp * 8 + (lane & 7)) * ROWB + (lane >> 3) * 16;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            uint32_t r[4];
            ldsm4(r, krow + j * 64);
            mma16816(sc, qa0[2 * j], qa2[2 * j], r[0], r[1]);
            mma16816(sc, qa0[2 * j + 1], qa2[2 * j + 1], r[2], r[3]);
        }
        const int64_t p0 = base + (int64_t)t * T + warp * 8 + 2 * tq;
        const float s0 = p0 <= pos ? sc[0] * p.scale_log2 : -INFINITY;
        const float s1 = p0 + 1 <= pos ? sc[1] * p.scale_log2 : -INFINITY;
        float mx = fmaxf(s0, s1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run, mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float carry = exp2f(m_run - m_use);
        const float e0 = exp2f(s0 - m_use), e1 = exp2f(s1 - m_use);
        l_run = l_run * carry + e0 + e1;
        m_run = m_new;
        const uint32_t pa = pack_bf16(e0, e1);
        const uint8_t *vrow = vs + (warp * 8 + (lane & 7)) * ROWB + (lane >> 3) * 16;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            uint32_t r[4];
            ldsm4t(r, vrow + jj * 64);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float(&a)[4] = acc[4 * jj + i];
                a[0] *= carry, a[1] *= carry;
                mma1688(a, pa, r[i]);
            }
        }
        __syncthreads();  // every warp is done with stage t % S before it is refilled
    }
    cp_wait<0>();
    __syncthreads();

    // merge the 4 warps (warp order) through shared memory: Mw[4][8], Lw[4][8], Os[4][G][D]
    float *Mw = reinterpret_cast<float *>(sm), *Lw = Mw + 32, *Os = Lw + 32;
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
    if (tq == 0) Mw[warp * 8 + gid] = m_run;
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) M = fmaxf(M, Mw[w * 8 + gid]);
    const float f = m_run == -INFINITY ? 0.f : exp2f(m_run - M);
    if (gid < G) {
        if (tq == 0) Lw[warp * 8 + gid] = l_run * f;
        float *o = Os + (warp * G + gid) * D;
#pragma unroll
        for (int j = 0; j < 32; ++j)
            *reinterpret_cast<float2 *>(o + 8 * j + 2 * tq) = make_float2(acc[j][0] * f, acc[j][1] * f);
    }
    __syncthreads();
    for (int e = tid; e < G * D; e += 128) {
        const int g = e / D, d = e - g * D;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < 4; ++w) s += Os[(w * G + g) * D + d];
        const int64_t slot = ((int64_t)b * p.H + kvh * G + g) * p.n_chunks + c;
        p.acc_out[slot * D + d] = s;
        if (d == 0) {
            float L = 0.f, Mg = -INFINITY;
#pragma unroll
            for (int w = 0; w < 4; ++w) L += Lw[w * 8 + g], Mg = fmaxf(Mg, Mw[w * 8 + g]);
            p.l_out[slot] = L;
            p.m_out[slot] = Mg * 0.69314718055994531f;  // base 2 -> natural, as the merge reads
        }
    }
}

template <int S, int CH> int launch(const Params &p, int chunks, int hkv, int batch, cudaStream_t st)
{
    const size_t smem = (size_t)S * 2 * T * ROWB;
    static bool set = false;  // once, outside any graph capture (the probe warms up first)
    if (!set) {
        const cudaError_t e = cudaFuncSetAttribute(
            attn_stream_kernel<S, CH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        set = true;
    }
    attn_stream_kernel<S, CH><<<dim3(chunks, hkv, batch), 128, smem, st>>>(p);
    return (int)cudaGetLastError();
}

}  // namespace

extern "C" int attn_stream_launch(const void *q, const void *k, const void *v,
                                  const int64_t *positions, float *m_out, float *l_out,
                                  float *acc_out, int batch, int H, int hkv, int64_t s_cb,
                                  int64_t s_ch, int64_t s_cs, int n_chunks, int chunks,
                                  float scale, int stages, int chunk, void *stream)
{
    if (H != hkv * G) return -1;
    Params p{static_cast<const __nv_bfloat16 *>(q), static_cast<const __nv_bfloat16 *>(k),
             static_cast<const __nv_bfloat16 *>(v), positions, m_out, l_out, acc_out,
             s_cb, s_ch, s_cs, H, n_chunks, scale * 1.4426950408889634f};
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (chunk == 128) switch (stages) {
        case 2: return launch<2, 128>(p, chunks, hkv, batch, st);
        case 4: return launch<4, 128>(p, chunks, hkv, batch, st);
        default: return launch<3, 128>(p, chunks, hkv, batch, st);
        }
    if (chunk != 256) return -2;
    switch (stages) {
    case 2: return launch<2, 256>(p, chunks, hkv, batch, st);
    case 4: return launch<4, 256>(p, chunks, hkv, batch, st);
    default: return launch<3, 256>(p, chunks, hkv, batch, st);
    }
}
