// decode.cu - the small-batch (M = 1..16) PQ2 matmul: y[m][n] = x[m][k] . W^T, weights streamed
// once from HBM straight into int8 tensor-core fragments (masked-plane MMA).
//
// Weights are the A operand of mma.m16n8k32 (u8): 16 rows x 32 code bytes of one 128-group per
// fragment; each lane's 16 bytes (rows gid and gid+8, code bytes tq*8..tq*8+7) come from one
// 16-byte load (TILES) or two 8-byte loads (PLANES). Masking those bytes with the four plane masks
// gives four A fragments holding code * 4^s; activation plane s (Q8 plane order, 8 contiguous
// bytes per lane) is the matching B fragment, tokens as the 8 MMA columns. Per group and row:
//     R_s = MMA of plane s = 4^s * dot(code_s, q_s), plane 0 started from -sum(q), and
//     P = ((R_0 * 4 + R_1) * 4 + R_2) * 4 + R_3 = 64 * (dot(code, q) - sum(q)) = 64 * dot(code - 1, q)
// exactly in int32, then acc += float(P) * (d_w * d_x / 64) in fp32, which rounds exactly as
// float(P/64) * (d_w * d_x) would (scaling by a power of two commutes with rounding).
//
// Grid: x = row blocks of 16*RT rows, y = K splits. The warps of a block split the block's groups
// in chunks of U consecutive groups; partial sums meet in shared memory (fixed warp order) and,
// with split-K, in a workspace reduced by the last block to finish (fixed split order), so the
// result bits never depend on timing.
#include "decode.cuh"

namespace {

constexpr int kMaxWarps = 8;

// The weight fragments of U consecutive groups for one warp's RT sub-tiles: the only data kept
// in flight across the loop (the activations are L1 hits, loaded where they are used).
template <int RT, int U>
struct Chunk {
    uint4 a[U][RT];      // lane's code bytes: .x/.y row gid, .z/.w row gid+8
    uint32_t ws[U][RT];  // fp16 scales of rows gid (low half) and gid+8 (high half)
};

template <int LAYOUT, int RT, int U>
__device__ __forceinline__ void load_chunk(Chunk<RT, U> &c, const pq2_decode_problem &p,
                                           int64_t rb, int64_t g0, int64_t g_end, int lane)
{
    const int gid = lane >> 2, tq = lane & 3;
    const int64_t groups = p.k >> 7;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t g = g0 + u;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            if (g >= g_end) {
                c.a[u][r] = make_uint4(0, 0, 0, 0);
                c.ws[u][r] = 0;
                continue;
            }
            if constexpr (LAYOUT == PQ2_LAYOUT_TILES) {
                const size_t tg = (size_t)rb * groups + g;  // (tile, group), tile == row block
                c.a[u][r] = pq2_ld_stream16(p.codes + ((tg * RT + r) << 9) + lane * 16);
                const uint16_t *s = p.wscales + tg * (16 * RT) + r * 16 + gid;
                c.ws[u][r] = (uint32_t)__ldg(s) | ((uint32_t)__ldg(s + 8) << 16);
            } else {
                // Rows past n (last row block) re-read row n-1; their results are never stored.
                const int64_t row = rb * (16 * RT) + r * 16 + gid;
                const int64_t r0 = row < p.n ? row : p.n - 1;
                const int64_t r1 = row + 8 < p.n ? row + 8 : p.n - 1;
                const size_t stride = (size_t)(p.k >> 2);
                uint2 lo = pq2_ld_stream8(p.codes + r0 * stride + g * 32 + tq * 8);
                uint2 hi = pq2_ld_stream8(p.codes + r1 * stride + g * 32 + tq * 8);
                c.a[u][r] = make_uint4(lo.x, lo.y, hi.x, hi.y);
                c.ws[u][r] = (uint32_t)__ldg(p.wscales + r0 * groups + g) |
                             ((uint32_t)__ldg(p.wscales + r1 * groups + g) << 16);
            }
        }
    }
}

template <int RT, int NT, int U>
__device__ __forceinline__ void compute_chunk(const Chunk<RT, U> &c, const pq2_decode_problem &p,
                                              int64_t g0, int64_t g_end, int lane,
                                              float (&acc)[RT][NT][4])
{
    const int gid = lane >> 2, tq = lane & 3;
    const int64_t groups = p.k >> 7;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t g = g0 + u;
        if (g >= g_end) break;
        // Activations of this group: plane s of token nt*8+gid (B fragment: 8 contiguous bytes
        // at tq*8), and d_x/64, -sum(q) of the tokens of this lane's C columns, nt*8+2tq+{0,1}.
        uint2 b[NT][4];
        float xs[NT][2];
        int nsum[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int tok_b = nt * 8 + gid;
            const int8_t *qp = p.q8 + (size_t)tok_b * p.k + g * 128 + tq * 8;
#pragma unroll
            for (int s = 0; s < 4; ++s)
                b[nt][s] = tok_b < p.m ? __ldg(reinterpret_cast<const uint2 *>(qp + s * 32)) : make_uint2(0, 0);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int tok = nt * 8 + 2 * tq + j;
                xs[nt][j] = tok < p.m ? __ldg(p.xs + (size_t)tok * groups + g) * (1.0f / 64.0f) : 0.0f;
                nsum[nt][j] = tok < p.m ? -__ldg(p.sums + (size_t)tok * groups + g) : 0;
            }
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const uint4 w = c.a[u][r];
            // A fragment registers: {row gid, row gid+8} x {code bytes tq*8..+3, tq*8+4..+7}.
            const uint32_t a0[4] = {pq2_plane<0>(w.x), pq2_plane<0>(w.z), pq2_plane<0>(w.y), pq2_plane<0>(w.w)};
            const uint32_t a1[4] = {pq2_plane<1>(w.x), pq2_plane<1>(w.z), pq2_plane<1>(w.y), pq2_plane<1>(w.w)};
            const uint32_t a2[4] = {pq2_plane<2>(w.x), pq2_plane<2>(w.z), pq2_plane<2>(w.y), pq2_plane<2>(w.w)};
            const uint32_t a3[4] = {pq2_plane<3>(w.x), pq2_plane<3>(w.z), pq2_plane<3>(w.y), pq2_plane<3>(w.w)};
            const float w_lo = __half2float(__ushort_as_half((unsigned short)(c.ws[u][r] & 0xffffu)));
            const float w_hi = __half2float(__ushort_as_half((unsigned short)(c.ws[u][r] >> 16)));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int zero[4] = {0, 0, 0, 0};
                // Plane 0 starts from -sum(q): the code-minus-one offset costs nothing extra.
                const int init[4] = {nsum[nt][0], nsum[nt][1], nsum[nt][0], nsum[nt][1]};
                int d0[4], d1[4], d2[4], d3[4];
                pq2_mma_u8s8(d0, a0, b[nt][0].x, b[nt][0].y, init);
                pq2_mma_u8s8(d1, a1, b[nt][1].x, b[nt][1].y, zero);
                pq2_mma_u8s8(d2, a2, b[nt][2].x, b[nt][2].y, zero);
                pq2_mma_u8s8(d3, a3, b[nt][3].x, b[nt][3].y, zero);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    // d_s = 4^s * X_s exactly, so 64*(X0 - sum + X1 + X2 + X3) in three shift-adds.
                    const int v = ((d0[j] * 4 + d1[j]) * 4 + d2[j]) * 4 + d3[j];
                    const float scale = (j < 2 ? w_lo : w_hi) * xs[nt][j & 1];
                    acc[r][nt][j] = fmaf((float)v, scale, acc[r][nt][j]);
                }
            }
        }
    }
}

template <int LAYOUT, int RT, int NT, int U>
__global__ void __launch_bounds__(kMaxWarps * 32)
decode_kernel(const pq2_decode_problem p, const int64_t groups_per_split)
{
    extern __shared__ float red[];  // [warps][RT*NT*4][32]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t rb = blockIdx.x;
    const int64_t groups = p.k >> 7;
    const int64_t g_begin = (int64_t)blockIdx.y * groups_per_split;
    const int64_t g_end = min(groups, g_begin + groups_per_split);

    float acc[RT][NT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][nt][j] = 0.0f;

    // Register double buffer: the next chunk's loads are in flight while this one computes.
    const int64_t step = (int64_t)warps * U;
    int64_t g = g_begin + (int64_t)warp * U;
    Chunk<RT, U> cur;
    if (g < g_end) load_chunk<LAYOUT>(cur, p, rb, g, g_end, lane);
    for (; g < g_end; g += step) {
        Chunk<RT, U> nxt;
        if (g + step < g_end) load_chunk<LAYOUT>(nxt, p, rb, g + step, g_end, lane);
        compute_chunk<RT, NT, U>(cur, p, g, g_end, lane, acc);
        cur = nxt;
    }

    constexpr int E = RT * NT * 4;
    if (warps > 1) {
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    red[(warp * E + (r * NT + nt) * 4 + j) * 32 + lane] = acc[r][nt][j];
        __syncthreads();
    }

    // Thread t finishes entries t, t + blockDim, ...: entry (e, lane) is C element j of token
    // block nt, sub-tile r of the lane that held it.
    const int split = gridDim.y;
    float *out_partial = p.partial + (size_t)blockIdx.y * p.m * p.n;
    for (int idx = threadIdx.x; idx < E * 32; idx += blockDim.x) {
        const int e = idx >> 5, l = idx & 31;
        const int j = e & 3, nt = (e >> 2) % NT, r = (e >> 2) / NT;
        const int64_t row = rb * (16 * RT) + r * 16 + (l >> 2) + (j >= 2 ? 8 : 0);
        const int tok = nt * 8 + 2 * (l & 3) + (j & 1);
        float v;
        if (warps > 1) {
            v = red[e * 32 + l];
            for (int w = 1; w < warps; ++w) v += red[(w * E + e) * 32 + l];
        } else {
            // Single warp: only its own lanes hold values; entry idx is this lane's (E*32 <= 32*E).
            v = 0.0f;
#pragma unroll
            for (int rr = 0; rr < RT; ++rr)
#pragma unroll
                for (int n2 = 0; n2 < NT; ++n2)
#pragma unroll
                    for (int j2 = 0; j2 < 4; ++j2)
                        if ((rr * NT + n2) * 4 + j2 == e) v = acc[rr][n2][j2];
        }
        if (row >= p.n || tok >= p.m) continue;
        if (split == 1) pq2_store_from_f32(p.y, (size_t)tok * p.n + row, p.y_dtype, v);
        else out_partial[(size_t)tok * p.n + row] = v;
    }
    if (split == 1) return;

    // Split-K: the last block of this row block to arrive sums the splits in order 0..split-1.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(p.counters + rb, 1u) == (unsigned)(split - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int64_t rows = 16 * RT;
    for (int64_t idx = threadIdx.x; idx < rows * p.m; idx += blockDim.x) {
        const int tok = (int)(idx / rows);
        const int64_t row = rb * rows + idx % rows;
        if (row >= p.n) continue;
        float v = 0.0f;
        for (int z = 0; z < split; ++z) v += __ldcg(p.partial + ((size_t)z * p.m + tok) * p.n + row);
        pq2_store_from_f32(p.y, (size_t)tok * p.n + row, p.y_dtype, v);
    }
    if (threadIdx.x == 0) p.counters[rb] = 0;
}

}  // namespace

// ---- instances ------------------------------------------------------------------------------
// The configurations that are compiled, as a list a reviewer can read: layout x RT x NT x U.
// NT (token blocks of 8) follows from m; warps and split are runtime values.
#define PQ2_DECODE_INSTANCES(X)                                                                  \
    X(PQ2_LAYOUT_TILES, 1, 1, 2) X(PQ2_LAYOUT_TILES, 1, 1, 4)                                     \
    X(PQ2_LAYOUT_TILES, 2, 1, 2) X(PQ2_LAYOUT_TILES, 2, 1, 4)                                     \
    X(PQ2_LAYOUT_TILES, 4, 1, 1) X(PQ2_LAYOUT_TILES, 4, 1, 2)                                     \
    X(PQ2_LAYOUT_TILES, 1, 2, 2) X(PQ2_LAYOUT_TILES, 2, 2, 2) X(PQ2_LAYOUT_TILES, 4, 2, 1)         \
    X(PQ2_LAYOUT_PLANES, 1, 1, 2) X(PQ2_LAYOUT_PLANES, 1, 1, 4)                                   \
    X(PQ2_LAYOUT_PLANES, 2, 1, 2) X(PQ2_LAYOUT_PLANES, 2, 1, 4)                                   \
    X(PQ2_LAYOUT_PLANES, 4, 1, 1) X(PQ2_LAYOUT_PLANES, 4, 1, 2)                                   \
    X(PQ2_LAYOUT_PLANES, 1, 2, 2) X(PQ2_LAYOUT_PLANES, 2, 2, 2) X(PQ2_LAYOUT_PLANES, 4, 2, 1)

using decode_fn = void (*)(const pq2_decode_problem, const int64_t);

static decode_fn find_instance(int32_t layout, int32_t rt, int nt, int32_t unroll)
{
#define PQ2_MATCH(L, R, N, U) \
    if (layout == (L) && rt == (R) && nt == (N) && unroll == (U)) return decode_kernel<L, R, N, U>;
    PQ2_DECODE_INSTANCES(PQ2_MATCH)
#undef PQ2_MATCH
    return nullptr;
}

static int token_blocks(int64_t m) { return m <= 8 ? 1 : 2; }

pq2_status pq2_decode_check_config(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                   int32_t layout_rt, int64_t m)
{
    if (layout == PQ2_LAYOUT_TILES && cfg.rt != layout_rt)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config rt=%d must equal the tile-major layout's rt=%d", fn,
                             (int)cfg.rt, (int)layout_rt);
    if (cfg.warps != 1 && cfg.warps != 2 && cfg.warps != 4 && cfg.warps != 8)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config warps=%d is not 1, 2, 4 or 8",
                             fn, (int)cfg.warps);
    if (cfg.split < 1 || cfg.split > 64)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config split=%d is not in 1..64", fn,
                             (int)cfg.split);
    if (!find_instance(layout, cfg.rt, token_blocks(m), cfg.unroll))
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: no compiled decode kernel for layout %s rt=%d unroll=%d at m=%lld "
                             "(see PQ2_DECODE_INSTANCES in decode.cu)",
                             fn, pq2_layout_name(layout), (int)cfg.rt, (int)cfg.unroll, (long long)m);
    return PQ2_OK;
}

pq2_status pq2_decode_launch(const char *fn, const pq2_decode_problem &p,
                             const pq2_decode_config &cfg, cudaStream_t stream)
{
    const int nt = token_blocks(p.m);
    decode_fn kernel = find_instance(p.layout, cfg.rt, nt, cfg.unroll);
    const int64_t groups = p.k >> 7;
    int64_t per;
    int32_t splits;
    pq2_decode_split(groups, cfg.split, &per, &splits);
    const int64_t row_blocks = pq2_decode_row_blocks(p.n, cfg.rt);
    if (row_blocks > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: n=%lld is too large", fn, (long long)p.n);
    const size_t smem = cfg.warps > 1 ? (size_t)cfg.warps * cfg.rt * nt * 4 * 32 * sizeof(float) : 0;
    kernel<<<dim3((unsigned)row_blocks, (unsigned)splits), dim3(cfg.warps * 32), smem, stream>>>(p, per);
    return pq2_launch_status(fn);
}
