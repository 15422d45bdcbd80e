// rotate.cu - the row transform kernel (rotate.h): one block per (row, tile of E elements), four
// elements per thread, so that warp w of a block holds 128-group w of its tile and ends, for a
// Q8 sink, exactly as the quantiser does (q8_group.cuh): the Q8 of the rotated values is
// bit-identical to pq2_quantize_q8_cuda of the same values. The RMSNorm producer of many rows
// runs one block per row instead (norm_row_kernel), with the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "device/dtypes.cuh"
#include "device/launch.cuh"
#include "device/ptx.cuh"
#include "quantize/q8_group.cuh"
#include "rotate/hadamard.cuh"
#include "rotate/rotate.h"

namespace {

constexpr int kMaxThreads = 1024;  // E = 4096 elements

// Four values of a buffer whose dtype is known only at run time.
__device__ __forceinline__ void load4_any(const void *p, int32_t dtype, float (&v)[4])
{
    switch (dtype) {
    case PQ2_DTYPE_F16: pq2_load4<PQ2_DTYPE_F16>(p, v); break;
    case PQ2_DTYPE_BF16: pq2_load4<PQ2_DTYPE_BF16>(p, v); break;
    default: pq2_load4<PQ2_DTYPE_F32>(p, v); break;
    }
}

__device__ __forceinline__ const void *elem(const void *base, int32_t dtype, int64_t i)
{
    return static_cast<const char *>(base) + i * (int64_t)pq2_dtype_bytes(dtype);
}

// The sum of every thread's v over the block, the same in every thread: a fixed order (warp
// shuffles, then the warps' sums in warp order), so every block of a row gets the same bits.
__device__ __forceinline__ float block_sum(float v, float *red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += red[w];
    return s;
}

// The RMSNorm's scale of a row from a thread's share ss of its sum of squares (block_sum).
__device__ __forceinline__ float rms_scale(const pq2_row_transform &p, float ss, float *red)
{
    return 1.0f / sqrtf(block_sum(ss, red) / (float)p.width + p.eps);
}

// The RMSNorm of elements e..e+3 of row `row`: h (in v, of dtype XD) to h_out, then v = h *
// scale * w, to normed. h goes to a buffer of its own: the other blocks of the row read x and
// the residual whole.
template <int XD>
__device__ __forceinline__ void norm_elements(const pq2_row_transform &p, int64_t row, int64_t e,
                                              float scale, const float (&w)[4], float (&v)[4])
{
    if (p.h_out) pq2_store4(p.h_out, XD, row * p.width + e, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = v[j] * scale * w[j];
    if (p.normed) pq2_store4(p.normed, p.normed_dtype, row * p.width + e, v);
}

// The element of a row in the tiled V-head order that element e of the grouped order reads
// (gdn_v_grouped): output e of [hd, rep, nk] reads input i of [hd, nk, rep]; 32-bit index
// arithmetic (the launchers refuse a permuted width above INT32_MAX).
__device__ __forceinline__ int64_t grouped_source(const pq2_row_transform &p, int64_t e)
{
    if (p.nv <= 0) return e;
    const uint32_t hd = (uint32_t)(p.width / p.nv), rep = (uint32_t)(p.nv / p.nk);
    const uint32_t d = (uint32_t)e % hd, head = (uint32_t)e / hd, r = head % rep, k = head / rep;
    return d + hd * (k + (uint32_t)p.nk * r);
}

// Element e..e+3 of row `row` of the source, as floats. IN_FLIGHT: loads issued together by the
// RMSNorm's pass over the whole row.
template <int SOURCE, int XD, int IN_FLIGHT>
__device__ __forceinline__ void load_source(const pq2_row_transform &p, int64_t row, int64_t e,
                                            float (&v)[4], float *red)
{
    const int64_t base = row * p.ld;
    if constexpr (SOURCE == PQ2_SOURCE_PLAIN) {
        pq2_load4<XD>(elem(p.x, XD, base + e), v);
    } else if constexpr (SOURCE == PQ2_SOURCE_PERMUTE) {
        pq2_load4<XD>(elem(p.x, XD, base + grouped_source(p, e)), v);
    } else if constexpr (SOURCE == PQ2_SOURCE_GATED) {
        // The gated RMSNorm of V head e / hd: its hd / 4 threads (hd a power of two up to 128:
        // aligned lanes of one warp) sum their squares by shuffles in a fixed order
        const int64_t i = p.nk > 0 ? grouped_source(p, e) : e;
        const int32_t hd = (int32_t)(p.width / p.nv);
        float o[4], z[4], w[4];
        pq2_load4<PQ2_DTYPE_F32>(elem(p.x, PQ2_DTYPE_F32, row * p.width + i), o);
        pq2_load4<XD>(elem(p.x2, XD, base + i), z);
        load4_any(elem(p.norm_weight, p.norm_dtype, i % hd), p.norm_dtype, w);
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) ss = fmaf(o[j], o[j], ss);
        for (int lanes = 1; lanes < hd / 4; lanes <<= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, lanes);
        const float scale = 1.0f / sqrtf(ss / (float)hd + p.eps);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = o[j] * scale * w[j] * (z[j] / (1.0f + expf(-z[j])));
    } else if constexpr (SOURCE == PQ2_SOURCE_SWIGLU) {
        float g[4], u[4];
        pq2_load4<XD>(elem(p.x, XD, base + e), g);
        pq2_load4<XD>(elem(p.x2, XD, base + e), u);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    } else if constexpr (SOURCE == PQ2_SOURCE_NORM) {
        // Every block of the row sums the squares of the whole row h = x (+ residual): the row
        // is read from L2 once per tile, and no block waits for another (which is why h goes to
        // a buffer of its own: x and the residual are read whole by every block). kInFlight
        // loads of each are issued before the first is used: the pass costs one L2 round trip
        // for rows up to kInFlight * E elements, not one per E. The loads carry no predicate
        // (an index past the row re-reads its last four elements, left out of the sum): ptxas
        // keeps only as many predicated loads in flight as it has predicate registers and
        // otherwise waits for each before issuing the next. The block's own elements are among
        // them (e = 4 * threadIdx.x + tile * E).
        constexpr int kInFlight = IN_FLIGHT;
        const int64_t step = 4 * (int64_t)blockDim.x;
        float w[4];  // issued first: it is independent of the sum
        load4_any(elem(p.norm_weight, p.norm_dtype, e), p.norm_dtype, w);
        float ss = 0.0f;
        for (int64_t i0 = 4 * threadIdx.x; i0 < p.width; i0 += step * kInFlight) {
            float h[kInFlight][4], r[kInFlight][4];
#pragma unroll
            for (int u = 0; u < kInFlight; ++u)
                pq2_load4<XD>(elem(p.x, XD, base + min(i0 + u * step, p.width - 4)), h[u]);
            if (p.residual) {
#pragma unroll
                for (int u = 0; u < kInFlight; ++u)
                    pq2_load4<XD>(
                        elem(p.residual, XD, row * p.width + min(i0 + u * step, p.width - 4)),
                        r[u]);
#pragma unroll
                for (int u = 0; u < kInFlight; ++u)
#pragma unroll
                    for (int j = 0; j < 4; ++j) h[u][j] += r[u][j];
            }
#pragma unroll
            for (int u = 0; u < kInFlight; ++u) {
                if (i0 + u * step >= p.width) break;
#pragma unroll
                for (int j = 0; j < 4; ++j) ss = fmaf(h[u][j], h[u][j], ss);
                if (i0 + u * step == e) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) v[j] = h[u][j];
                }
            }
        }
        norm_elements<XD>(p, row, e, rms_scale(p, ss, red), w, v);
    } else {  // PQ2_SOURCE_WEIGHTS: row ids[row]; an id out of range gives NaN
        const int64_t id = p.ids[row];
        if (id < 0 || id >= p.w.n) {
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = __int_as_float(0x7fc00000);
            return;
        }
        const int64_t g = e >> 7;
        const uint8_t code = p.w.data[pq2_code_offset(&p.w, id, g, (int)((e & 127) >> 2))];
        const uint16_t dbits =
            *reinterpret_cast<const uint16_t *>(p.w.data + pq2_scale_offset(&p.w, id, g));
        const float d = __half2float(__ushort_as_half(dbits));
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = (float)((int)((code >> (2 * j)) & 3u) - 1) * d;
    }
}

// The rotation's signs of elements e..e+3 (all +1 without signs).
__device__ __forceinline__ char4 load_signs(const pq2_row_transform &p, int64_t e)
{
    return p.signs ? *reinterpret_cast<const char4 *>(p.signs + e) : make_char4(1, 1, 1, 1);
}

// The end of a tile, after its source: the signs, the block Hadamard transform (smem: E floats,
// still being read on return), the sink (the Q8 operand, or y). The signs come by reference: by
// value, ptxas schedules row_transform_kernel differently, and slower at large m (NOTES:
// finish-signs-by-reference).
template <bool Q8>
__device__ __forceinline__ void finish(const pq2_row_transform &p, float (&v)[4], const char4 &s,
                                       int64_t row, int64_t e, float *smem, float rsqrt_b)
{
    if (p.signs && !p.inverse) v[0] *= s.x, v[1] *= s.y, v[2] *= s.z, v[3] *= s.w;
    if (p.log2b > 0) {
        hadamard_block(v, p.log2b, smem);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] *= rsqrt_b;
    }
    if (p.signs && p.inverse) v[0] *= s.x, v[1] *= s.y, v[2] *= s.z, v[3] *= s.w;
    if constexpr (Q8) {
        const int64_t g = e >> 7, task = row * (p.width >> 7) + g;
        q8_store_group(v, threadIdx.x & 31, row, g, task, p.m, p.width, p.q8, p.scales, p.sums,
                       p.bits, p.records);
    } else {
        pq2_store4(p.y, p.y_dtype, row * p.width + e, v);
    }
}

// The RMSNorm's default load depth for blocks of up to MAXT threads (see DEPTH below).
template <int MAXT> constexpr int kDefaultDepth = MAXT <= 256 ? 8 : 4;

// MAXT: the threads of a block at most (E / 4): 256 up to E = 1024, else 1024. DEPTH: the
// RMSNorm's loads of each of x and the residual in flight (256 threads: 8, a 5120-wide row in one
// round trip, for grids that fit on the device at once; 2 for larger grids, where 8 would hold
// more registers and let fewer blocks share a multiprocessor, NOTES:
// rmsnorm-two-loads-large-grids; 1024 threads: 4).
template <int SOURCE, int XD, bool Q8, int MAXT, int DEPTH = kDefaultDepth<MAXT>>
__global__ void __launch_bounds__(MAXT)
    row_transform_kernel(const pq2_row_transform p, int32_t tiles, float rsqrt_b)
{
    extern __shared__ __align__(16) float smem[];  // E floats: the cross-warp Hadamard stages
    __shared__ float red[kMaxThreads / 32];
    const int64_t row = blockIdx.x / tiles;
    const int64_t tile = blockIdx.x - row * tiles;
    const int64_t e =
        tile * (4 * (int64_t)blockDim.x) + 4 * threadIdx.x;  // this thread's first element
    // Programmatic dependent launch: a matmul launched after this grid may start streaming its
    // weights now; this grid reads its inputs only after the kernel before it has finished.
    pq2_pdl_handoff();
    // The signs are issued before the source's loads so that their latency hides under them (for
    // the RMSNorm: under the row pass, not after the row's sum).
    // load_signs written out: calling it reschedules every tile kernel (not the same SASS, and
    // not measured)
    const char4 s =
        p.signs ? *reinterpret_cast<const char4 *>(p.signs + e) : make_char4(1, 1, 1, 1);
    float v[4];
    load_source<SOURCE, XD, DEPTH>(p, row, e, v, red);
    finish<Q8>(p, v, s, row, e, smem, rsqrt_b);
}

// The RMSNorm producer a block per row (grids of at least two rows per multiprocessor, rows of 2
// to kRowTiles tiles of 1024): the row is read once, not once per tile, and its tiles take turns in
// two halves of smem (2E floats), a tile's Hadamard writing the half the tile before it did not
// read. The same bits as row_transform_kernel: the same per-thread elements, sums and order.
constexpr int kRowTiles = 8;

// A whole row's RMSNorm producer: every tile's x, residual, weight and signs in flight at once
// (clamped indices, no predicates, as load_source's pass), one row sum, then the tiles in turn.
template <int XD>
__device__ __forceinline__ void norm_row(const pq2_row_transform &p, int64_t row, int tiles,
                                         float *smem, float *red, float rsqrt_b)
{
    const int64_t E = 4 * (int64_t)blockDim.x, first = 4 * (int64_t)threadIdx.x;
    float h[kRowTiles][4], w[kRowTiles][4];
    char4 s[kRowTiles];
#pragma unroll
    for (int u = 0; u < kRowTiles; ++u) {
        const int64_t i = min(first + u * E, p.width - 4);
        s[u] = load_signs(p, i);
        load4_any(elem(p.norm_weight, p.norm_dtype, i), p.norm_dtype, w[u]);
        pq2_load4<XD>(elem(p.x, XD, row * p.ld + i), h[u]);
    }
    if (p.residual) {
        float r[kRowTiles][4];
#pragma unroll
        for (int u = 0; u < kRowTiles; ++u)
            pq2_load4<XD>(elem(p.residual, XD, row * p.width + min(first + u * E, p.width - 4)),
                          r[u]);
#pragma unroll
        for (int u = 0; u < kRowTiles; ++u)
#pragma unroll
            for (int j = 0; j < 4; ++j) h[u][j] += r[u][j];
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < kRowTiles; ++u) {
        if (u >= tiles) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) ss = fmaf(h[u][j], h[u][j], ss);
    }
    const float scale = rms_scale(p, ss, red);
#pragma unroll
    for (int u = 0; u < kRowTiles; ++u) {
        if (u >= tiles) break;
        const int64_t e = first + u * E;
        float v[4] = {h[u][0], h[u][1], h[u][2], h[u][3]};
        norm_elements<XD>(p, row, e, scale, w[u], v);
        finish<true>(p, v, s[u], row, e, smem + (u & 1) * E, rsqrt_b);
    }
}

template <int XD>
__global__ void __launch_bounds__(256)
    norm_row_kernel(const pq2_row_transform p, int32_t tiles, float rsqrt_b)
{
    extern __shared__ __align__(16) float smem[];  // 2E floats
    __shared__ float red[256 / 32];
    pq2_pdl_handoff();
    norm_row<XD>(p, blockIdx.x, tiles, smem, red, rsqrt_b);
}

using transform_fn = void (*)(const pq2_row_transform, int32_t, float);

template <int SOURCE, bool Q8, int MAXT, int DEPTH = kDefaultDepth<MAXT>>
transform_fn kernel_for(int32_t x_dtype)
{
    switch (x_dtype) {
    case PQ2_DTYPE_F16: return row_transform_kernel<SOURCE, PQ2_DTYPE_F16, Q8, MAXT, DEPTH>;
    case PQ2_DTYPE_BF16: return row_transform_kernel<SOURCE, PQ2_DTYPE_BF16, Q8, MAXT, DEPTH>;
    default: return row_transform_kernel<SOURCE, PQ2_DTYPE_F32, Q8, MAXT, DEPTH>;
    }
}

// The compiled transforms: rotate (dense in, dense out), the four producers of the Q8 operand,
// and the rows of a PQ2_0 matrix (dense out), each for blocks of up to 256 and 1024 threads; the
// RMSNorm producer of 256 threads also with 2 loads in flight (large: a grid larger than the
// device holds at once).
template <int MAXT> transform_fn find_kernel(int32_t source, bool q8, int32_t x_dtype, bool large)
{
    if constexpr (MAXT <= 256)
        if (large && q8 && source == PQ2_SOURCE_NORM)
            return kernel_for<PQ2_SOURCE_NORM, true, MAXT, 2>(x_dtype);
    if (!q8 && source == PQ2_SOURCE_PLAIN)
        return kernel_for<PQ2_SOURCE_PLAIN, false, MAXT>(x_dtype);
    if (!q8 && source == PQ2_SOURCE_WEIGHTS)
        return row_transform_kernel<PQ2_SOURCE_WEIGHTS, PQ2_DTYPE_F32, false, MAXT>;
    if (q8 && source == PQ2_SOURCE_NORM) return kernel_for<PQ2_SOURCE_NORM, true, MAXT>(x_dtype);
    if (q8 && source == PQ2_SOURCE_SWIGLU)
        return kernel_for<PQ2_SOURCE_SWIGLU, true, MAXT>(x_dtype);
    if (q8 && source == PQ2_SOURCE_PERMUTE)
        return kernel_for<PQ2_SOURCE_PERMUTE, true, MAXT>(x_dtype);
    if (q8 && source == PQ2_SOURCE_GATED) return kernel_for<PQ2_SOURCE_GATED, true, MAXT>(x_dtype);
    return nullptr;
}

transform_fn norm_row_kernel_for(int32_t x_dtype)
{
    switch (x_dtype) {
    case PQ2_DTYPE_F16: return norm_row_kernel<PQ2_DTYPE_F16>;
    case PQ2_DTYPE_BF16: return norm_row_kernel<PQ2_DTYPE_BF16>;
    default: return norm_row_kernel<PQ2_DTYPE_F32>;
    }
}

// Whether the RMSNorm producer runs a block per row (norm_row_kernel): rows of 2 to kRowTiles
// tiles of 1024 (one tile gains nothing, and smaller blocks at two per multiprocessor leave it
// half empty), at least two rows per multiprocessor (its registers let two blocks share one;
// with fewer rows a block per tile fills the device better: NOTES: norm-row-kernel).
bool norm_by_rows(const pq2_row_transform &t, int64_t e, int64_t tiles, int sms)
{
    return t.source == PQ2_SOURCE_NORM && t.y == nullptr && e == 1024 && tiles >= 2 &&
           tiles <= kRowTiles && t.m >= 2 * (int64_t)sms;
}

}  // namespace

int64_t pq2_row_tile(int64_t width, int32_t log2b)
{
    const int64_t b = (int64_t)1 << log2b, unit = b > 128 ? b : 128, cap = b > 1024 ? b : 1024;
    int64_t e = unit;
    while (e * 2 <= cap && width % (e * 2) == 0) e *= 2;
    return e;
}

pq2_status pq2_row_transform_launch(const char *fn, const pq2_row_transform &t, bool pdl, int sms,
                                    cudaStream_t stream)
{
    const int64_t e = pq2_row_tile(t.width, t.log2b), tiles = t.width / e;
    const bool q8 = t.y == nullptr;  // no y: a Q8 sink
    // blocks of the 8-deep RMSNorm kernel a multiprocessor holds, taking its registers a thread
    // as 100 for every dtype (an estimate, NOTES: producers-evidence; today's counts:
    // tools/kernel_report/ptxas_report.py)
    const int64_t per_sm = std::min<int64_t>(32, std::max<int64_t>(1, 65536 / (100 * (e / 4))));
    const bool large = t.m * tiles > per_sm * sms;
    if (t.m * tiles > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: m=%lld width=%lld: too many blocks for one grid",
                             fn, (long long)t.m, (long long)t.width);
    const float rsqrt_b = (float)(1.0 / sqrt((double)((int64_t)1 << t.log2b)));
    if (norm_by_rows(t, e, tiles, sms)) {
        pq2_launch l((unsigned)t.m, (unsigned)(e / 4), 2 * (size_t)e * sizeof(float), stream, pdl);
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, norm_row_kernel_for(t.x_dtype), t,
                                            (int32_t)tiles, rsqrt_b));
        return pq2_launch_status(fn);
    }
    const transform_fn kernel = e <= 1024
                                    ? find_kernel<256>(t.source, q8, t.x_dtype, large)
                                    : find_kernel<kMaxThreads>(t.source, q8, t.x_dtype, large);
    if (!kernel)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: no row transform for source %d", fn,
                             (int)t.source);
    pq2_launch l((unsigned)(t.m * tiles), (unsigned)(e / 4), (size_t)e * sizeof(float), stream,
                 pdl);
    PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, kernel, t, (int32_t)tiles, rsqrt_b));
    return pq2_launch_status(fn);
}
