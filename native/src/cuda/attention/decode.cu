// decode.cu - attention decode over a bf16 KV cache, the streaming part (pq2.h
// pq2_attention_decode_cuda): the partial softmax sums of one chunk of cache positions for one
// KV head's group of query heads and one sequence per block.
//
// A block of 4 warps streams its chunk in tiles of 32 positions (the keys and values of a tile,
// rows padded by 16 bytes so that ldmatrix's eight rows fall in different banks) through STAGES
// cp.async stages; rows past the position are zero-filled and masked. Warp w takes positions
// 8w..8w+7 of every tile: scores by mma m16n8k16 (the group's query heads in rows 0..group-1 of
// A, zeros above), an online softmax of its own in base 2, P V by mma m16n8k8 into head_dim / 8
// fp32 accumulator fragments. At the end the four warps merge through shared memory in warp
// order, so the sums' order is fixed.
#include <cuda_bf16.h>
#include <stdint.h>

#include "attention/attention.h"
#include "device/launch.cuh"
#include "device/ptx.cuh"

namespace {

constexpr int kTile = 32;                           // positions per pipeline stage
constexpr int kWarps = 4;                           // warps per block, kTile / 8 positions each
constexpr int kMaxGroup = PQ2_ATTENTION_MAX_GROUP;  // query heads: rows 0-7 of the MMA's A operand
static_assert(kMaxGroup == 8, "the group's queries fill rows 0-7 of an m16n8k16 A operand");
constexpr int kThreads = kWarps * 32;

template <int D> __host__ __device__ constexpr int row_bytes()
{
    return 2 * D + 16;
}

template <int D, int STAGES> constexpr size_t smem_bytes()
{
    const size_t stages = (size_t)STAGES * 2 * kTile * row_bytes<D>();
    const size_t merge = (2 * kWarps * 8 + (size_t)kWarps * kMaxGroup * D) * sizeof(float);
    return stages > merge ? stages : merge;
}

struct params {
    const __nv_bfloat16 *q, *k, *v;
    const int64_t *positions;
    float *m_out, *l_out, *acc_out;
    int64_t s_b, s_h, s_s, n_chunks, chunk;
    int n_head, group;
    float scale_log2;  // scale * log2(e): the softmax runs in base 2
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

template <int D, int STAGES>
__global__ void __launch_bounds__(kThreads, 2) attention_decode_kernel(const params p)
{
    constexpr int RB = row_bytes<D>(), CPR = D / 8;  // 16-byte chunks per row
    extern __shared__ __align__(16) uint8_t sm[];
    pq2_pdl_handoff();  // the queries and the new cache rows come from the kernel before
    const int c = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int64_t pos = p.positions[b];
    const int64_t base = (int64_t)c * p.chunk;
    if (base > pos) return;  // a chunk past the position: the merge does not read its slots
    // the chunk's last position attended, relative to its first; then all offsets are 32-bit
    const int last = (int)(pos - base < p.chunk - 1 ? pos - base : p.chunk - 1);
    const int n_t = last / kTile + 1;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tq = lane & 3;
    const int64_t first = b * p.s_b + kvh * p.s_h + base * p.s_s;
    const __nv_bfloat16 *kc = p.k + first, *vc = p.v + first;
    const int s_s = (int)p.s_s;

    // tile t's keys and values into stage t % STAGES, D / 32 chunks of each a thread; rows past
    // the position zero-filled (and not read)
    auto issue = [&](int t) {
        uint8_t *ks = sm + (t % STAGES) * (2 * kTile * RB), *vs = ks + kTile * RB;
#pragma unroll
        for (int i = 0; i < D / 32; ++i) {
            const int id = tid + kThreads * i, r = id / CPR, ch = id % CPR;
            const int row = t * kTile + r;
            const bool ok = row <= last;
            const int off = (ok ? row : 0) * s_s + ch * 8;  // < chunk * s_s < 2^31
            cp_async16(ks + r * RB + ch * 16, kc + off, ok);
            cp_async16(vs + r * RB + ch * 16, vc + off, ok);
        }
    };
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < n_t) issue(t);
        cp_async_commit();
    }

    // the group's queries as A fragments: rows gid < group; rows 8-15 are the zero registers
    uint32_t qa0[D / 16], qa2[D / 16];
    {
        const bool real = gid < p.group;
        const __nv_bfloat16 *qp =
            p.q + ((int64_t)b * p.n_head + (int64_t)kvh * p.group + (real ? gid : 0)) * D;
#pragma unroll
        for (int s = 0; s < D / 16; ++s) {
            const uint32_t x0 = *reinterpret_cast<const uint32_t *>(qp + 16 * s + 2 * tq);
            const uint32_t x2 = *reinterpret_cast<const uint32_t *>(qp + 16 * s + 8 + 2 * tq);
            qa0[s] = real ? x0 : 0u;
            qa2[s] = real ? x2 : 0u;
        }
    }

    float acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m_run = -INFINITY, l_run = 0.f;  // of query row gid, this warp's positions

    for (int t = 0; t < n_t; ++t) {
        if (t + STAGES - 1 < n_t) issue(t + STAGES - 1);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const uint8_t *ks = sm + (t % STAGES) * (2 * kTile * RB), *vs = ks + kTile * RB;
        // scores of positions 8 warp + 2 tq, + 1 of the tile
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
        const uint8_t *krow = ks + (warp * 8 + (lane & 7)) * RB + (lane >> 3) * 16;
#pragma unroll
        for (int j = 0; j < D / 32; ++j) {
            uint32_t r[4];
            ldmatrix_x4(r, krow + j * 64);
            pq2_mma_bf16_16816_half(sc, qa0[2 * j], qa2[2 * j], r[0], r[1]);
            pq2_mma_bf16_16816_half(sc, qa0[2 * j + 1], qa2[2 * j + 1], r[2], r[3]);
        }
        const int p0 = t * kTile + warp * 8 + 2 * tq;  // relative to the chunk's first
        const float s0 = p0 <= last ? sc[0] * p.scale_log2 : -INFINITY;
        const float s1 = p0 + 1 <= last ? sc[1] * p.scale_log2 : -INFINITY;
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
        const uint8_t *vrow = vs + (warp * 8 + (lane & 7)) * RB + (lane >> 3) * 16;
#pragma unroll
        for (int jj = 0; jj < D / 32; ++jj) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, vrow + jj * 64);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float (&a)[4] = acc[4 * jj + i];
                a[0] *= carry, a[1] *= carry;
                pq2_mma_bf16_1688_half(a, pa, r[i]);
            }
        }
        __syncthreads();  // every warp is done with stage t % STAGES before it is refilled
    }
    cp_async_wait<0>();
    __syncthreads();

    // the four warps merged in warp order through shared memory: Mw[4][8], Lw[4][8],
    // Os[4][group][D]
    float *Mw = reinterpret_cast<float *>(sm), *Lw = Mw + kWarps * 8, *Os = Lw + kWarps * 8;
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
    if (tq == 0) Mw[warp * 8 + gid] = m_run;
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, Mw[w * 8 + gid]);
    const float f = m_run == -INFINITY ? 0.f : exp2f(m_run - M);
    if (gid < p.group) {
        if (tq == 0) Lw[warp * 8 + gid] = l_run * f;
        float *o = Os + (warp * p.group + gid) * D;
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<float2 *>(o + 8 * j + 2 * tq) =
                make_float2(acc[j][0] * f, acc[j][1] * f);
    }
    __syncthreads();
    for (int e = tid; e < p.group * D; e += kThreads) {
        const int g = e / D, d = e - g * D;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += Os[(w * p.group + g) * D + d];
        const int64_t slot = ((int64_t)b * p.n_head + (int64_t)kvh * p.group + g) * p.n_chunks + c;
        p.acc_out[slot * D + d] = s;
        if (d == 0) {
            float L = 0.f, Mg = -INFINITY;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) L += Lw[w * 8 + g], Mg = fmaxf(Mg, Mw[w * 8 + g]);
            p.l_out[slot] = L;
            p.m_out[slot] = Mg * 0.69314718055994531f;  // base 2 -> natural log units
        }
    }
}

using kernel_fn = void (*)(const params);

struct instance {
    int head_dim;
    kernel_fn fn;
    size_t smem;
};

template <int D, int S> constexpr instance make()
{
    return {D, attention_decode_kernel<D, S>, smem_bytes<D, S>()};
}

// Per head width, three stages where the device's shared memory holds them, else two (the first
// that fits is launched).
const instance kInstances[] = {
    make<32, 3>(),  make<32, 2>(),  make<64, 3>(),  make<64, 2>(),
    make<128, 3>(), make<128, 2>(), make<256, 3>(), make<256, 2>(),
};

}  // namespace

pq2_status pq2_attention_init_device(const char *fn, int max_smem_optin)
{
    for (const instance &k : kInstances)
        if (k.smem <= (size_t)max_smem_optin)
            PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)k.smem));
    return PQ2_OK;
}

pq2_status pq2_attention_launch(const char *fn, const pq2_attention_decode &a, int max_smem_optin,
                                bool pdl, cudaStream_t stream)
{
    const instance *k = nullptr;
    for (const instance &i : kInstances)
        if (i.head_dim == a.head_dim && i.smem <= (size_t)max_smem_optin) {
            k = &i;
            break;
        }
    if (!k)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: head_dim=%lld needs more shared memory than this device's %d "
                             "bytes a block",
                             fn, (long long)a.head_dim, max_smem_optin);
    params p{};
    p.q = static_cast<const __nv_bfloat16 *>(a.q);
    p.k = static_cast<const __nv_bfloat16 *>(a.k_cache);
    p.v = static_cast<const __nv_bfloat16 *>(a.v_cache);
    p.positions = a.positions, p.m_out = a.m, p.l_out = a.l, p.acc_out = a.acc;
    p.s_b = a.stride_b, p.s_h = a.stride_h, p.s_s = a.stride_s, p.n_chunks = a.n_chunks;
    p.chunk = a.chunk, p.n_head = (int)a.n_head, p.group = (int)(a.n_head / a.n_head_kv);
    p.scale_log2 = a.scale * 1.4426950408889634f;
    pq2_launch l(dim3((unsigned)a.chunks, (unsigned)a.n_head_kv, (unsigned)a.batch), kThreads,
                 k->smem, stream, pdl);
    PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, k->fn, p));
    return pq2_launch_status(fn);
}
